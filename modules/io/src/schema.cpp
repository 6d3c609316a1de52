// Lookups in the schema table (schema.hpp) and its JSON form; the table itself is
// schema_table.cpp.
#include "trainscope/io/schema.hpp"

#include <algorithm>
#include <cstdio>

#include "trainscope/core/error.hpp"

namespace trainscope::io::schema {
namespace {

bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
}

// One name against one table name that may hold one placeholder "{...}": the text around it must
// match literally and the placeholder at least one name character.
bool name_matches(std::string_view pattern, std::string_view name) {
    const auto open = pattern.find('{');
    if (open == std::string_view::npos) return pattern == name;
    const auto close = pattern.find('}', open);
    if (close == std::string_view::npos) return pattern == name;
    const std::string_view prefix = pattern.substr(0, open), suffix = pattern.substr(close + 1);
    if (name.size() < prefix.size() + suffix.size() + 1) return false;
    if (name.substr(0, prefix.size()) != prefix) return false;
    if (name.substr(name.size() - suffix.size()) != suffix) return false;
    const std::string_view middle =
        name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    return std::all_of(middle.begin(), middle.end(), name_char);
}

std::vector<std::string_view> segments(std::string_view path) {
    std::vector<std::string_view> out;
    while (!path.empty()) {
        const auto slash = path.find('/');
        const std::string_view part = path.substr(0, slash);
        if (!part.empty()) out.push_back(part);
        if (slash == std::string_view::npos) break;
        path.remove_prefix(slash + 1);
    }
    return out;
}

bool path_matches(std::string_view pattern, std::string_view path) {
    const auto p = segments(pattern), s = segments(path);
    if (p.size() != s.size()) return false;
    for (std::size_t i = 0; i < p.size(); ++i)
        if (!name_matches(p[i], s[i])) return false;
    return true;
}

bool is_member(Kind k) {
    return k == Kind::attribute || k == Kind::column || k == Kind::field;
}

void json_string(std::string& out, std::string_view text) {
    out += '"';
    for (char c : text) {
        switch (c) {
        case '"':
            out += "\\\"";
            break;
        case '\\':
            out += "\\\\";
            break;
        case '\n':
            out += "\\n";
            break;
        case '\t':
            out += "\\t";
            break;
        default:
            if (static_cast<unsigned char>(c) < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
                out += buf;
            } else {
                out += c;
            }
        }
    }
    out += '"';
}

} // namespace

const char* to_string(Kind kind) {
    switch (kind) {
    case Kind::group:
        return "group";
    case Kind::attribute:
        return "attribute";
    case Kind::series:
        return "series";
    case Kind::column:
        return "column";
    case Kind::table:
        return "table";
    case Kind::per_rank:
        return "per_rank";
    case Kind::ragged:
        return "ragged";
    case Kind::ragged_text:
        return "ragged_text";
    case Kind::vector:
        return "vector";
    case Kind::text:
        return "text";
    case Kind::compound:
        return "compound";
    case Kind::field:
        return "field";
    }
    return "?";
}

std::string normalize(std::string_view path) {
    std::string out = "/";
    for (std::string_view part : segments(path)) {
        if (out.size() > 1) out += '/';
        out += part;
    }
    return out;
}

// An entry spelled exactly like the name wins over one whose placeholder matches it (/comm/buckets
// over /comm/{op}, median_step_s over median_{phase}_s), whatever the table's order.
const Entry* find_object(std::string_view path, std::initializer_list<Kind> kinds) {
    const std::string wanted = normalize(path);
    const Entry* matched = nullptr;
    for (const Entry& e : table()) {
        if (is_member(e.kind)) continue;
        if (kinds.size() && std::find(kinds.begin(), kinds.end(), e.kind) == kinds.end()) continue;
        if (e.path == wanted) return &e;
        if (!matched && path_matches(e.path, wanted)) matched = &e;
    }
    return matched;
}

const Entry* find_member(Kind kind, std::string_view path, std::string_view name) {
    const std::string wanted = normalize(path);
    // The object the member belongs to, chosen as find_object chooses (exact spelling first).
    const Entry* object = find_object(wanted);
    const Entry* matched = nullptr;
    for (const Entry& e : table()) {
        if (e.kind != kind) continue;
        if (object ? e.path != object->path : !path_matches(e.path, wanted)) continue;
        if (e.name == name) return &e;
        if (!matched && name_matches(e.name, name)) matched = &e;
    }
    return matched;
}

namespace {

[[noreturn]] void refuse(std::string_view file, const std::string& what) {
    throw core::InternalError("run file '" + std::string(file) + "': " + what +
                              " (declared in modules/io/src/schema_table.cpp and "
                              "schema_table_results.cpp; run scripts/gen_schema after editing)");
}

void check_units(std::string_view file, const Entry& e, const std::string& what,
                 std::string_view units) {
    if (!units.empty() && e.units != units)
        refuse(file, what + " written with units '" + std::string(units) +
                         "', the schema table says '" + std::string(e.units) + "'");
}

} // namespace

void require_object(std::string_view file, std::string_view object,
                    std::initializer_list<Kind> kinds, std::string_view units) {
    const std::string what = normalize(object);
    const Entry* e = find_object(what, kinds);
    if (!e) {
        std::string wanted;
        for (Kind k : kinds)
            wanted += std::string(wanted.empty() ? "" : " or ") + to_string(k);
        refuse(file, what + " (" + wanted + ") is not in the schema table");
    }
    check_units(file, *e, what, units);
}

void require_member(std::string_view file, Kind kind, std::string_view object,
                    std::string_view name, std::string_view units) {
    const std::string what =
        std::string(to_string(kind)) + " '" + std::string(name) + "' of " + normalize(object);
    const Entry* e = find_member(kind, object, name);
    if (!e) refuse(file, what + " is not in the schema table");
    check_units(file, *e, what, units);
}

std::string with_part(std::string_view path, std::string_view part) {
    std::string out(path);
    const auto open = out.find('{');
    const auto close = open == std::string::npos ? open : out.find('}', open);
    if (close == std::string::npos) return out;
    return out.replace(open, close - open + 1, part);
}

std::string child(std::string_view group, std::string_view name) {
    std::string out = normalize(group);
    if (out.size() > 1) out += '/';
    return out += name;
}

std::string to_json() {
    std::string out = "{\"schema\": ";
    json_string(out, kVersion);
    out += ", \"entries\": [";
    bool first = true;
    for (const Entry& e : table()) {
        out += first ? "\n  {" : ",\n  {";
        first = false;
        const std::pair<const char*, std::string_view> fields[] = {
            {"kind", to_string(e.kind)}, {"path", e.path}, {"name", e.name},
            {"units", e.units},          {"type", e.type}, {"when", e.when},
            {"meaning", e.meaning}};
        bool first_field = true;
        for (const auto& [key, value] : fields) {
            if (!first_field) out += ", ";
            first_field = false;
            json_string(out, key);
            out += ": ";
            json_string(out, value);
        }
        out += '}';
    }
    return out += "\n]}\n";
}

} // namespace trainscope::io::schema
