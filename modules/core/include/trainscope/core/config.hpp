// Configuration: options are "section.key", declared by the module that uses them (type, default,
// one-line help, allowed values or range), read from INI files (--config, later files win; a key
// twice in one file is an error) and the command line (--section.key=value, wins over files; given
// twice, the last wins), validated before any heavy allocation. Every value remembers its origin.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace trainscope::core {

enum class OptionType { Int, Float, Bool, String, Choice };

struct OptionSpec {
    std::string key; // "section.key"
    OptionType type = OptionType::String;
    std::string default_value;
    std::string help;
    std::vector<std::string> choices; // Choice only
    std::optional<double> min, max;   // Int/Float: inclusive range
    // String options naming a file or directory the run reads: a relative path given in an INI
    // file is relative to that file's directory (resolved to an absolute path when the file is
    // read); on the command line, relative to the working directory. Values in not_paths (e.g.
    // a model preset's name) are names, never resolved.
    bool input_path = false;
    std::vector<std::string> not_paths;
};

// The set of known options. Each module has a `declare_options(OptionRegistry&)`.
class OptionRegistry {
  public:
    OptionRegistry& add_int(const std::string& key, std::int64_t def, const std::string& help,
                            std::optional<double> min = std::nullopt,
                            std::optional<double> max = std::nullopt);
    OptionRegistry& add_float(const std::string& key, double def, const std::string& help,
                              std::optional<double> min = std::nullopt,
                              std::optional<double> max = std::nullopt);
    OptionRegistry& add_bool(const std::string& key, bool def, const std::string& help);
    OptionRegistry& add_string(const std::string& key, const std::string& def,
                               const std::string& help);
    OptionRegistry& add_choice(const std::string& key, const std::string& def,
                               const std::vector<std::string>& choices, const std::string& help);
    // A String option naming an input file or directory (OptionSpec::input_path).
    OptionRegistry& add_input_path(const std::string& key, const std::string& def,
                                   const std::string& help,
                                   const std::vector<std::string>& not_paths = {});

    const OptionSpec* find(const std::string& key) const;
    const std::vector<OptionSpec>& specs() const { return specs_; }
    // The declared key closest to `key` (edit distance), or "" when nothing is close.
    std::string closest(const std::string& key) const;
    // Checks `value` against the spec of `key`; throws ConfigError naming key, value and what is
    // allowed. Returns the canonical form (bools as true/false).
    std::string validate(const std::string& key, const std::string& value) const;
    // --help text, grouped by section, with defaults.
    std::string help_text() const;

  private:
    OptionRegistry& add(OptionSpec spec);
    std::vector<OptionSpec> specs_;
};

enum class ValueSource { Default, File, CommandLine };

// Resolved, validated values of every declared option.
class Config {
  public:
    Config() = default;
    // Defaults, then overrides as given (validated). Mostly for tests and tools.
    static Config from_values(const OptionRegistry& registry,
                              const std::map<std::string, std::string>& values);

    std::int64_t get_int(const std::string& key) const;
    double get_float(const std::string& key) const;
    bool get_bool(const std::string& key) const;
    const std::string& get_string(const std::string& key) const; // String and Choice
    ValueSource source(const std::string& key) const;
    // Where the value came from: "default", "FILE:LINE", "command line" (", the last of N --key"
    // when given N times) or "set by trainscope" (Config::set).
    const std::string& origin(const std::string& key) const;
    bool is_default(const std::string& key) const { return source(key) == ValueSource::Default; }

    // Changes a value after parsing (validated), e.g. a test cutting a run short.
    void set(const std::string& key, const std::string& value);

    // All options in declaration order as (key, canonical value).
    std::vector<std::pair<std::string, std::string>> items() const;
    // The resolved configuration as an INI file that reproduces this run; with_origins: each value
    // followed by "# <origin>" (--print-config).
    std::string to_ini(bool with_origins = false) const;

  private:
    friend class CommandLine;
    const OptionRegistry* registry_ = nullptr;
    std::map<std::string, std::string> values_;
    std::map<std::string, ValueSource> sources_;
    std::map<std::string, std::string> origins_;
    const OptionSpec& spec(const std::string& key, OptionType expected) const;
};

// What the command line asked for besides options.
struct CommandLine {
    Config config;
    std::vector<std::string> config_files;
    bool help = false;
    bool version = false;
    bool print_config = false;
    bool dry_run = false;
    bool resume = false;      // continue from checkpoint.dir's newest complete checkpoint
    std::string command_line; // argv joined, for the run file

    // Parses argv and the INI files it names. Throws ConfigError on unknown options (with the
    // closest known one), bad values, unreadable, malformed or non-UTF-8 files, files that are not
    // regular files (directories, FIFOs, devices) and a key set twice in one file.
    static CommandLine parse(const OptionRegistry& registry, int argc, const char* const* argv);
    static std::string usage(const OptionRegistry& registry);
};

} // namespace trainscope::core
