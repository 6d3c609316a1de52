// Option registry, validation and the command-line / INI front end (Boost.Program_options parses
// the command line, config files are read here so that a value knows its line; trainscope validates
// so that every message names the key, the value and what is allowed).
#include "trainscope/core/config.hpp"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/stat.h>

#include "trainscope/core/error.hpp"
#include "trainscope/core/text.hpp"

namespace po = boost::program_options;

namespace trainscope::core {
namespace {

std::size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j)
        prev[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j) {
            std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
        }
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

std::string format_number(double v) {
    // Whole numbers exactly (a range "between 1 and 1.04858e+06" would hide the bound 1048576).
    if (std::trunc(v) == v && std::fabs(v) < 9.007199254740992e15)
        return std::to_string(static_cast<long long>(v));
    std::ostringstream s;
    s << v;
    return s.str();
}

std::string range_text(const OptionSpec& s) {
    if (s.min && s.max) return "between " + format_number(*s.min) + " and " + format_number(*s.max);
    if (s.min) return ">= " + format_number(*s.min);
    if (s.max) return "<= " + format_number(*s.max);
    return "";
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
    std::string out;
    for (std::size_t i = 0; i < v.size(); ++i)
        out += (i ? sep : "") + v[i];
    return out;
}

const char* type_name(OptionType t) {
    switch (t) {
    case OptionType::Int:
        return "integer";
    case OptionType::Float:
        return "number";
    case OptionType::Bool:
        return "true|false";
    case OptionType::String:
        return "string";
    case OptionType::Choice:
        return "choice";
    }
    return "";
}

std::string trim(const std::string& s) {
    auto b = s.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return "";
    auto e = s.find_last_not_of(" \t\r\n");
    return s.substr(b, e - b + 1);
}

// Option values longer than this are refused: no option needs more (paths stop at PATH_MAX), and
// a value that long is a mistake (a file pasted into an option) that would be copied into every
// message and the run file.
constexpr std::size_t kMaxValueBytes = 4096;
// Config files larger than this are refused before they are read whole: the largest INI of
// options is a few KB, and a wrong --config (a dataset, a core dump) must not fill the memory.
constexpr std::size_t kMaxConfigFileBytes = 16u << 20;
// Values are quoted in messages up to this many bytes.
constexpr std::size_t kQuotedValueBytes = 120;

// One "key = value" line of a config file, its section prefix applied ("train.batch_size").
struct IniEntry {
    std::string key, value;
    std::size_t line = 0;
};

const char* file_type_name(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

// Reads an INI file of options with the syntax Boost.Program_options' parse_config_file accepted
// (which this replaces because it cannot say on which line a value is): '#' starts a comment
// anywhere on a line, blanks around names and values are trimmed, "[section]" prefixes the names
// that follow with "section.", and every other non-blank line is "name = value". Besides: the
// file must be a regular file (a FIFO would block the open, /dev/zero never ends) of UTF-8 text,
// a leading UTF-8 byte-order mark is skipped, and every error names the line.
std::vector<IniEntry> read_ini_file(const std::string& file) {
    const auto cannot_read = [&](int err) {
        return ConfigError("cannot read config file '" + file + "' (" + std::strerror(err) +
                           "): check the path given to --config");
    };
    // The run file records the command line, and each value's origin names its file, as UTF-8.
    if (const auto at = first_invalid_utf8(file))
        throw ConfigError("config file path '" + printable(file, kQuotedValueBytes) +
                          "' is not UTF-8 text (byte " + printable(file.substr(*at, 1)) +
                          " at offset " + std::to_string(*at) +
                          "): paths must be UTF-8 (the run file records the command line as "
                          "UTF-8 text); rename the file");
    struct stat st {};
    if (::stat(file.c_str(), &st) != 0) throw cannot_read(errno);
    if (!S_ISREG(st.st_mode))
        throw ConfigError("config file '" + file + "' is " + file_type_name(st.st_mode) +
                          ", not a regular file: give --config the path of an INI file" +
                          (S_ISFIFO(st.st_mode) ? " (save the text into a file first)" : ""));
    if (static_cast<std::size_t>(st.st_size) > kMaxConfigFileBytes)
        throw ConfigError("config file '" + file + "' is " + std::to_string(st.st_size) +
                          " bytes, more than the " + std::to_string(kMaxConfigFileBytes >> 20) +
                          " MiB an INI file of options may have: is --config given the right "
                          "file?");
    std::ifstream in(file, std::ios::binary);
    if (!in) throw cannot_read(errno);
    // Files whose size stat() does not know (/proc) are read up to the same limit.
    std::string text;
    char buffer[1 << 16];
    while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
        text.append(buffer, static_cast<std::size_t>(in.gcount()));
        if (text.size() > kMaxConfigFileBytes)
            throw ConfigError("config file '" + file + "' holds more than " +
                              std::to_string(kMaxConfigFileBytes >> 20) +
                              " MiB: is --config given the right file?");
    }
    if (in.bad()) throw cannot_read(errno); // a read error ends the loop like the end does
    if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) text.erase(0, 3);
    if (text.compare(0, 2, "\xFF\xFE") == 0 || text.compare(0, 2, "\xFE\xFF") == 0)
        throw ConfigError("config file '" + file +
                          "' is UTF-16 text (it starts with a UTF-16 byte-order mark): save it "
                          "as UTF-8");

    std::vector<IniEntry> entries;
    std::string prefix;
    std::size_t line_no = 0;
    for (std::size_t begin = 0; begin < text.size();) {
        std::size_t end = text.find('\n', begin);
        if (end == std::string::npos) end = text.size();
        const std::string raw = text.substr(begin, end - begin);
        begin = end + 1;
        ++line_no;
        const std::string here = "config file '" + file + "' line " + std::to_string(line_no);
        if (const auto bad = first_invalid_utf8(raw))
            throw ConfigError(here + " is not UTF-8 text (byte " + printable(raw.substr(*bad, 1)) +
                              " at column " + std::to_string(*bad + 1) +
                              "): save the file as UTF-8");
        const std::string s = trim(raw.substr(0, raw.find('#')));
        if (s.empty()) continue;
        if (s.front() == '[' && s.back() == ']') {
            prefix = s.substr(1, s.size() - 2);
            if (prefix.empty() || prefix.back() != '.') prefix += '.';
        } else if (const auto eq = s.find('='); eq != std::string::npos) {
            entries.push_back({prefix + trim(s.substr(0, eq)), trim(s.substr(eq + 1)), line_no});
        } else {
            throw ConfigError(here + ": the options configuration file contains an invalid line '" +
                              printable(s, kQuotedValueBytes) +
                              "' (expected [section] headers and key = value lines)");
        }
    }
    return entries;
}

// An INI file's relative input path, as an absolute path from the file's directory: the same
// configuration then reads the same files from any working directory (a job script's, a
// scheduler's). Empty values, absolute paths and names listed in not_paths are kept as given.
std::string relative_to_file(const OptionRegistry& registry, const std::string& key,
                             const std::string& value, const std::string& file) {
    const OptionSpec* spec = registry.find(key);
    if (!spec || !spec->input_path || value.empty()) return value;
    if (std::find(spec->not_paths.begin(), spec->not_paths.end(), value) != spec->not_paths.end())
        return value;
    namespace fs = std::filesystem;
    const fs::path given(value);
    if (given.is_absolute()) return value;
    std::error_code ec;
    const fs::path dir = fs::absolute(fs::path(file).parent_path(), ec);
    if (ec) return value;
    return (dir / given).lexically_normal().string();
}

} // namespace

OptionRegistry& OptionRegistry::add(OptionSpec spec) {
    if (spec.key.find('.') == std::string::npos)
        throw InternalError("option '" + spec.key + "' must be named section.key");
    if (find(spec.key)) throw InternalError("option '" + spec.key + "' declared twice");
    specs_.push_back(std::move(spec));
    // Defaults must satisfy their own spec: a declaration bug, not a user error.
    try {
        validate(specs_.back().key, specs_.back().default_value);
    } catch (const ConfigError& e) {
        throw InternalError(std::string("bad default: ") + e.what());
    }
    return *this;
}

OptionRegistry& OptionRegistry::add_int(const std::string& key, std::int64_t def,
                                        const std::string& help, std::optional<double> min,
                                        std::optional<double> max) {
    return add({key, OptionType::Int, std::to_string(def), help, {}, min, max, false, {}});
}
OptionRegistry& OptionRegistry::add_float(const std::string& key, double def,
                                          const std::string& help, std::optional<double> min,
                                          std::optional<double> max) {
    return add({key, OptionType::Float, format_number(def), help, {}, min, max, false, {}});
}
OptionRegistry& OptionRegistry::add_bool(const std::string& key, bool def,
                                         const std::string& help) {
    return add({key, OptionType::Bool, def ? "true" : "false", help, {}, {}, {}, false, {}});
}
OptionRegistry& OptionRegistry::add_string(const std::string& key, const std::string& def,
                                           const std::string& help) {
    return add({key, OptionType::String, def, help, {}, {}, {}, false, {}});
}
OptionRegistry& OptionRegistry::add_input_path(const std::string& key, const std::string& def,
                                               const std::string& help,
                                               const std::vector<std::string>& not_paths) {
    return add({key, OptionType::String, def, help, {}, {}, {}, true, not_paths});
}
OptionRegistry& OptionRegistry::add_choice(const std::string& key, const std::string& def,
                                           const std::vector<std::string>& choices,
                                           const std::string& help) {
    return add({key, OptionType::Choice, def, help, choices, {}, {}, false, {}});
}

const OptionSpec* OptionRegistry::find(const std::string& key) const {
    for (const auto& s : specs_)
        if (s.key == key) return &s;
    return nullptr;
}

std::string OptionRegistry::closest(const std::string& key) const {
    std::string best;
    std::size_t best_d = std::string::npos;
    for (const auto& s : specs_) {
        std::size_t d = edit_distance(key, s.key);
        // A bare key without its section ("batch_size") still finds "train.batch_size".
        auto dot = s.key.find('.');
        if (s.key.compare(dot + 1, std::string::npos, key) == 0) d = 1;
        if (d < best_d) best_d = d, best = s.key;
    }
    if (best.empty() || best_d > std::max<std::size_t>(3, key.size() / 3)) return "";
    return best;
}

std::string OptionRegistry::validate(const std::string& key, const std::string& raw) const {
    const OptionSpec* s = find(key);
    if (!s) {
        // (closest() is quadratic in the name's length: a long name is no typo of an option.)
        const std::string hint = key.size() <= kQuotedValueBytes ? closest(key) : "";
        throw ConfigError("unknown option '" + printable(key, kQuotedValueBytes) + "'" +
                          (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                          " (trainscope --help lists every option)");
    }
    // Blanks around a value are dropped for every type (" 5 " is 5): an INI line's value is
    // trimmed anyway, and a quoted command-line value must not mean something else.
    const std::string value = trim(raw);
    auto bad = [&](const std::string& allowed) {
        return ConfigError("option " + key + " = '" + printable(raw, kQuotedValueBytes) +
                           "' is invalid: expected " + allowed);
    };
    if (value.size() > kMaxValueBytes)
        throw bad("at most " + std::to_string(kMaxValueBytes) + " bytes, not " +
                  std::to_string(value.size()));
    // The run file stores every value as UTF-8 text, which h5py and pandas decode.
    if (const auto at = first_invalid_utf8(value))
        throw ConfigError("option " + key + " = '" + printable(raw, kQuotedValueBytes) +
                          "' is not UTF-8 text (byte " + printable(value.substr(*at, 1)) +
                          " at offset " + std::to_string(*at) +
                          "): option values, paths included, must be UTF-8 (the run file "
                          "records them as UTF-8 text); rename the file or directory");
    switch (s->type) {
    case OptionType::Int: {
        errno = 0;
        char* end = nullptr;
        long long v = std::strtoll(value.c_str(), &end, 10);
        std::string allowed = "an integer" + (range_text(*s).empty() ? "" : " " + range_text(*s));
        if (value.empty() || *end != '\0' || errno == ERANGE) throw bad(allowed);
        if ((s->min && v < *s->min) || (s->max && v > *s->max)) throw bad(allowed);
        return std::to_string(v);
    }
    case OptionType::Float: {
        errno = 0;
        char* end = nullptr;
        double v = std::strtod(value.c_str(), &end);
        std::string allowed = "a number" + (range_text(*s).empty() ? "" : " " + range_text(*s));
        // Decimal notation only: strtod also reads hexadecimal ("0x10" = 16), "inf" and "nan",
        // none of which an option means.
        const bool decimal = value.find_first_not_of("0123456789+-.eE") == std::string::npos;
        if (value.empty() || !decimal || *end != '\0' || errno == ERANGE || !std::isfinite(v))
            throw bad(allowed);
        if ((s->min && v < *s->min) || (s->max && v > *s->max)) throw bad(allowed);
        return value;
    }
    case OptionType::Bool: {
        std::string v = value;
        std::transform(v.begin(), v.end(), v.begin(),
                       [](unsigned char c) { return std::tolower(c); });
        if (v == "true" || v == "1" || v == "yes" || v == "on") return "true";
        if (v == "false" || v == "0" || v == "no" || v == "off") return "false";
        throw bad("true or false");
    }
    case OptionType::Choice:
        if (std::find(s->choices.begin(), s->choices.end(), value) == s->choices.end())
            throw bad("one of " + join(s->choices, ", "));
        return value;
    case OptionType::String:
        return value;
    }
    return value;
}

std::string OptionRegistry::help_text() const {
    std::ostringstream out;
    std::vector<std::string> sections;
    for (const auto& s : specs_) {
        std::string sec = s.key.substr(0, s.key.find('.'));
        if (std::find(sections.begin(), sections.end(), sec) == sections.end())
            sections.push_back(sec);
    }
    for (const auto& sec : sections) {
        out << "\n[" << sec << "]\n";
        for (const auto& s : specs_) {
            if (s.key.compare(0, sec.size() + 1, sec + ".") != 0) continue;
            std::string allowed =
                s.type == OptionType::Choice ? join(s.choices, "|") : type_name(s.type);
            if (!range_text(s).empty()) allowed += ", " + range_text(s);
            out << "  --" << s.key << "=<" << allowed
                << ">  (default: " << (s.default_value.empty() ? "\"\"" : s.default_value)
                << ")\n      " << s.help << "\n";
        }
    }
    return out.str();
}

// ---------------------------------------------------------------------------------------------

Config Config::from_values(const OptionRegistry& registry,
                           const std::map<std::string, std::string>& values) {
    Config c;
    c.registry_ = &registry;
    for (const auto& s : registry.specs()) {
        c.values_[s.key] = s.default_value;
        c.sources_[s.key] = ValueSource::Default;
        c.origins_[s.key] = "default";
    }
    for (const auto& [k, v] : values)
        c.set(k, v);
    return c;
}

void Config::set(const std::string& key, const std::string& value) {
    if (!registry_) throw InternalError("Config::set on an empty configuration");
    values_[key] = registry_->validate(key, value);
    sources_[key] = ValueSource::CommandLine;
    origins_[key] = "set by trainscope";
}

const OptionSpec& Config::spec(const std::string& key, OptionType expected) const {
    const OptionSpec* s = registry_ ? registry_->find(key) : nullptr;
    if (!s) throw InternalError("option '" + key + "' read but never declared");
    bool ok =
        s->type == expected || (expected == OptionType::String && s->type == OptionType::Choice);
    if (!ok) throw InternalError("option '" + key + "' read with the wrong type");
    return *s;
}

std::int64_t Config::get_int(const std::string& key) const {
    spec(key, OptionType::Int);
    return std::stoll(values_.at(key));
}
double Config::get_float(const std::string& key) const {
    spec(key, OptionType::Float);
    return std::stod(values_.at(key));
}
bool Config::get_bool(const std::string& key) const {
    spec(key, OptionType::Bool);
    return values_.at(key) == "true";
}
const std::string& Config::get_string(const std::string& key) const {
    spec(key, OptionType::String);
    return values_.at(key);
}
ValueSource Config::source(const std::string& key) const {
    auto it = sources_.find(key);
    if (it == sources_.end()) throw InternalError("option '" + key + "' read but never declared");
    return it->second;
}

const std::string& Config::origin(const std::string& key) const {
    auto it = origins_.find(key);
    if (it == origins_.end()) throw InternalError("option '" + key + "' read but never declared");
    return it->second;
}

std::vector<std::pair<std::string, std::string>> Config::items() const {
    std::vector<std::pair<std::string, std::string>> out;
    if (!registry_) return out;
    for (const auto& s : registry_->specs())
        out.emplace_back(s.key, values_.at(s.key));
    return out;
}

std::string Config::to_ini(bool with_origins) const {
    // One [section] block per section, in order of first declaration (modules declare options of
    // a shared section such as [run] at different times).
    std::vector<std::string> sections;
    const auto all = items();
    for (const auto& [key, value] : all) {
        std::string sec = key.substr(0, key.find('.'));
        if (std::find(sections.begin(), sections.end(), sec) == sections.end())
            sections.push_back(sec);
    }
    std::ostringstream out;
    for (std::size_t i = 0; i < sections.size(); ++i) {
        out << (i ? "\n" : "") << "[" << sections[i] << "]\n";
        for (const auto& [key, value] : all)
            if (key.compare(0, sections[i].size() + 1, sections[i] + ".") == 0)
                out << key.substr(key.find('.') + 1) << " = " << value
                    << (with_origins ? "  # " + origin(key) : std::string()) << "\n";
    }
    return out.str();
}

// ---------------------------------------------------------------------------------------------

std::string CommandLine::usage(const OptionRegistry& registry) {
    return "usage: trainscope [--config FILE.ini]... [--section.key=value]... [--dry-run]\n"
           "                  [--resume] [--print-config] [--print-schema] [--help] [--version]\n\n"
           "  --config FILE     INI file (UTF-8) with [section] key = value lines; repeatable,\n"
           "                    later files win; a key set twice in one file is an error;\n"
           "                    --section.key=value on the command line wins over every file;\n"
           "                    given twice, the last one wins\n"
           "  --dry-run         validate, print the plan (ranks, devices, batch split, model,\n"
           "                    memory estimate) and exit without training\n"
           "  --resume          continue from the newest complete checkpoint in checkpoint.dir\n"
           "                    (same configuration; another rank count under ddp-ds;\n"
           "                    see checkpoint.*)\n"
           "  --print-config    print the resolved configuration as INI, each value with its\n"
           "                    origin (default, FILE:LINE or command line), and exit\n"
           "  --print-schema    print the run file's schema table (every group, dataset, column\n"
           "                    and attribute with units and meaning) as JSON, and exit\n"
           "  --version         print versions of trainscope and its dependencies\n"
           "\nOptions by section:\n" +
           registry.help_text();
}

CommandLine CommandLine::parse(const OptionRegistry& registry, int argc, const char* const* argv) {
    CommandLine cl;
    for (int i = 0; i < argc; ++i)
        cl.command_line += (i ? " " : "") + std::string(argv[i]);

    po::options_description desc;
    desc.add_options()("config", po::value<std::vector<std::string>>()->composing(), "")(
        "help,h", "")("version", "")("print-config", "")("dry-run", "")("resume", "");
    for (const auto& s : registry.specs()) {
        auto* value = po::value<std::string>();
        if (s.type == OptionType::Bool) value->implicit_value("true");
        desc.add_options()(s.key.c_str(), value, s.help.c_str());
    }

    // Boost.Program_options substitutes "%canonical_option%" into its error messages until none is
    // left, so an option name that contains it (e.g. "--x%canonical_option%=") hangs the process
    // (found by tests/fuzz). No declared option has a '%': such a name is refused before Boost.
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        const std::string name = arg.substr(0, arg.find('='));
        if (name.size() > 1 && name[0] == '-' && name.find('%') != std::string::npos)
            registry.validate(name.substr(name.find_first_not_of('-')), ""); // unknown option
        // "--section.key=" with nothing after '=': Boost would say only that "the argument should
        // follow immediately after the equal sign"; say what the option expects instead (a
        // string may be empty, but only in a config file: "key =").
        if (arg.size() > 2 && arg.compare(0, 2, "--") == 0 && arg.back() == '=' &&
            arg.find('=') == arg.size() - 1) {
            const std::string key = name.substr(2);
            if (registry.find(key)) {
                registry.validate(key, ""); // throws for numbers, booleans and choices
                const std::size_t dot = key.find('.');
                throw ConfigError("option " + key + " = '' is empty on the command line: give --" +
                                  key + "=VALUE, or write '" + key.substr(dot + 1) +
                                  " =' in the [" + key.substr(0, dot) +
                                  "] section of a config file for an empty string");
            }
        }
    }

    po::parsed_options parsed(&desc);
    try {
        parsed =
            po::command_line_parser(argc, argv)
                .options(desc)
                .style(po::command_line_style::unix_style ^ po::command_line_style::allow_guessing)
                .allow_unregistered()
                .run();
    } catch (const po::error& e) {
        throw ConfigError(std::string("command line: ") + e.what() + " (see trainscope --help)");
    }

    // An option given twice on the command line: the last one wins, as in most command-line
    // tools (a wrapper script appends its override to a user's arguments); --print-config says so.
    std::map<std::string, std::string> from_cli;
    std::map<std::string, int> times_given;
    for (const auto& opt : parsed.options) {
        if (opt.unregistered || opt.position_key >= 0) {
            std::string name = opt.string_key.empty() ? opt.original_tokens.at(0) : opt.string_key;
            if (opt.position_key >= 0)
                throw ConfigError("unexpected argument '" + name +
                                  "': options are written --section.key=value and config files "
                                  "are given with --config FILE");
            registry.validate(name, ""); // throws "unknown option ... did you mean"
        }
        const std::string& k = opt.string_key;
        if (k == "config") {
            for (const auto& f : opt.value)
                cl.config_files.push_back(f);
        } else if (k == "help") {
            cl.help = true;
        } else if (k == "version") {
            cl.version = true;
        } else if (k == "print-config") {
            cl.print_config = true;
        } else if (k == "dry-run") {
            cl.dry_run = true;
        } else if (k == "resume") {
            cl.resume = true;
        } else {
            const OptionSpec* spec = registry.find(k);
            if (opt.value.empty() && spec && spec->type == OptionType::Bool) {
                from_cli[k] = "true"; // a bare --section.flag switches it on
                ++times_given[k];
                continue;
            }
            if (opt.value.empty())
                throw ConfigError("option " + k + " needs a value: --" + k + "=VALUE");
            from_cli[k] = opt.value.back();
            ++times_given[k];
        }
    }

    cl.config = Config::from_values(registry, {});
    if (cl.help || cl.version) return cl;

    for (const auto& file : cl.config_files) {
        // One key twice in one file is a mistake to show, not a rule to apply (Python's
        // configparser(strict=True) refuses it too); across files the later file wins.
        std::map<std::string, std::size_t> line_of;
        for (const IniEntry& e : read_ini_file(file)) {
            const std::string where = file + ":" + std::to_string(e.line);
            std::string value;
            try {
                value = registry.validate(e.key, e.value);
            } catch (const ConfigError& err) {
                throw ConfigError("config file '" + file + "' line " + std::to_string(e.line) +
                                  ": " + err.what());
            }
            if (auto [it, fresh] = line_of.emplace(e.key, e.line); !fresh)
                throw ConfigError("config file '" + file + "' sets " + e.key + " twice, on line " +
                                  std::to_string(it->second) + " and line " +
                                  std::to_string(e.line) +
                                  ": keep one of them (a later --config file or --" + e.key +
                                  "=VALUE on the command line may override a file's value)");
            cl.config.values_[e.key] = relative_to_file(registry, e.key, value, file);
            cl.config.sources_[e.key] = ValueSource::File;
            cl.config.origins_[e.key] = where;
        }
    }
    for (const auto& [k, v] : from_cli) {
        cl.config.values_[k] = registry.validate(k, v);
        cl.config.sources_[k] = ValueSource::CommandLine;
        cl.config.origins_[k] =
            times_given[k] == 1
                ? "command line"
                : "command line, the last of " + std::to_string(times_given[k]) + " --" + k;
    }
    return cl;
}

} // namespace trainscope::core
