// Option registry, validation and the command-line / INI front end (Boost.Program_options parses;
// trainscope validates so that every message names the key, the value and what is allowed).
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

#include "trainscope/core/error.hpp"

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
    return add({key, OptionType::Int, std::to_string(def), help, {}, min, max});
}
OptionRegistry& OptionRegistry::add_float(const std::string& key, double def,
                                          const std::string& help, std::optional<double> min,
                                          std::optional<double> max) {
    return add({key, OptionType::Float, format_number(def), help, {}, min, max});
}
OptionRegistry& OptionRegistry::add_bool(const std::string& key, bool def,
                                         const std::string& help) {
    return add({key, OptionType::Bool, def ? "true" : "false", help, {}, {}, {}});
}
OptionRegistry& OptionRegistry::add_string(const std::string& key, const std::string& def,
                                           const std::string& help) {
    return add({key, OptionType::String, def, help, {}, {}, {}});
}
OptionRegistry& OptionRegistry::add_choice(const std::string& key, const std::string& def,
                                           const std::vector<std::string>& choices,
                                           const std::string& help) {
    return add({key, OptionType::Choice, def, help, choices, {}, {}});
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
        std::string hint = closest(key);
        throw ConfigError("unknown option '" + key + "'" +
                          (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                          " (trainscope --help lists every option)");
    }
    const std::string value = trim(raw);
    auto bad = [&](const std::string& allowed) {
        return ConfigError("option " + key + " = '" + raw + "' is invalid: expected " + allowed);
    };
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
        if (value.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
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
    }
    for (const auto& [k, v] : values)
        c.set(k, v);
    return c;
}

void Config::set(const std::string& key, const std::string& value) {
    if (!registry_) throw InternalError("Config::set on an empty configuration");
    values_[key] = registry_->validate(key, value);
    sources_[key] = ValueSource::CommandLine;
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

std::vector<std::pair<std::string, std::string>> Config::items() const {
    std::vector<std::pair<std::string, std::string>> out;
    if (!registry_) return out;
    for (const auto& s : registry_->specs())
        out.emplace_back(s.key, values_.at(s.key));
    return out;
}

std::string Config::to_ini() const {
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
                out << key.substr(key.find('.') + 1) << " = " << value << "\n";
    }
    return out.str();
}

// ---------------------------------------------------------------------------------------------

std::string CommandLine::usage(const OptionRegistry& registry) {
    return "usage: trainscope [--config FILE.ini]... [--section.key=value]... [--dry-run]\n"
           "                  [--resume] [--print-config] [--help] [--version]\n\n"
           "  --config FILE     INI file with [section] key = value lines; repeatable, later "
           "wins;\n"
           "                    --section.key=value on the command line wins over every file\n"
           "  --dry-run         validate, print the plan (ranks, devices, batch split, model,\n"
           "                    memory estimate) and exit without training\n"
           "  --resume          continue from the newest complete checkpoint in checkpoint.dir\n"
           "                    (same configuration and rank count; see checkpoint.*)\n"
           "  --print-config    print the resolved configuration as INI and exit\n"
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

    std::map<std::string, std::string> from_cli;
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
                continue;
            }
            if (opt.value.empty())
                throw ConfigError("option " + k + " needs a value: --" + k + "=VALUE");
            from_cli[k] = opt.value.back();
        }
    }

    cl.config = Config::from_values(registry, {});
    if (cl.help || cl.version) return cl;

    for (const auto& file : cl.config_files) {
        std::ifstream in(file);
        if (!in)
            throw ConfigError("cannot read config file '" + file + "' (" + std::strerror(errno) +
                              "): check the path given to --config");
        // A directory opens like a file on Linux and reads as empty: its options would be
        // silently missing.
        if (std::filesystem::is_directory(file))
            throw ConfigError("config file '" + file +
                              "' is a directory: give --config the path of an INI file");
        po::parsed_options fp(&desc);
        try {
            fp = po::parse_config_file(in, desc, /*allow_unregistered=*/true);
        } catch (const po::invalid_config_file_syntax& e) {
            // Boost's what() substitutes the line for "%invalid_line%" until none is left, which
            // never ends for a line containing that text (found by tests/fuzz): the same message,
            // made here from the line.
            throw ConfigError("config file '" + file +
                              "': the options configuration file contains an invalid line '" +
                              e.tokens() + "' (expected [section] headers and key = value lines)");
        } catch (const po::error& e) {
            throw ConfigError("config file '" + file + "': " + e.what() +
                              " (expected [section] headers and key = value lines)");
        }
        if (in.bad()) // a read error ends the parse like the end of the file does
            throw ConfigError("cannot read config file '" + file + "' (" + std::strerror(errno) +
                              "): check the path given to --config");
        for (const auto& opt : fp.options) {
            try {
                if (opt.unregistered) registry.validate(opt.string_key, "");
                if (opt.string_key == "config" || opt.value.empty()) continue;
                cl.config.values_[opt.string_key] =
                    registry.validate(opt.string_key, opt.value.back());
                cl.config.sources_[opt.string_key] = ValueSource::File;
            } catch (const ConfigError& e) {
                throw ConfigError("config file '" + file + "': " + e.what());
            }
        }
    }
    for (const auto& [k, v] : from_cli) {
        cl.config.values_[k] = registry.validate(k, v);
        cl.config.sources_[k] = ValueSource::CommandLine;
    }
    return cl;
}

} // namespace trainscope::core
