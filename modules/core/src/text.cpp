// UTF-8 validation and printable quoting (see text.hpp).
#include "trainscope/core/text.hpp"

#include <cstdint>
#include <cstdio>
#include <filesystem>

namespace trainscope::core {
namespace {

// Length of the well-formed UTF-8 sequence starting at text[i], or 0 when there is none.
std::size_t utf8_sequence_length(std::string_view text, std::size_t i) {
    const auto byte = [&](std::size_t k) { return static_cast<std::uint8_t>(text[k]); };
    const std::uint8_t b = byte(i);
    if (b < 0x80) return 1;
    std::size_t n = 0;
    std::uint8_t lo = 0x80, hi = 0xBF; // the allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) {
        n = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
        n = 3;
        if (b == 0xE0) lo = 0xA0; // overlong
        if (b == 0xED) hi = 0x9F; // UTF-16 surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
        n = 4;
        if (b == 0xF0) lo = 0x90; // overlong
        if (b == 0xF4) hi = 0x8F; // above U+10FFFF
    } else {
        return 0; // a continuation byte, 0xC0/0xC1 (overlong) or 0xF5..0xFF
    }
    if (i + n > text.size()) return 0;
    if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
    for (std::size_t k = 2; k < n; ++k)
        if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
    return n;
}

} // namespace

std::optional<std::size_t> first_invalid_utf8(std::string_view text) {
    for (std::size_t i = 0; i < text.size();) {
        const std::size_t n = utf8_sequence_length(text, i);
        if (n == 0) return i;
        i += n;
    }
    return std::nullopt;
}

std::string printable(std::string_view text, std::size_t max_bytes) {
    const std::size_t shown = max_bytes && text.size() > max_bytes ? max_bytes : text.size();
    std::string out;
    out.reserve(shown + 16);
    std::size_t i = 0;
    while (i < shown) {
        const std::size_t n = utf8_sequence_length(text, i);
        const auto b = static_cast<unsigned char>(text[i]);
        if (n == 0 || (n == 1 && b < 0x20 && b != '\n' && b != '\t') || b == 0x7F) {
            char hex[5];
            std::snprintf(hex, sizeof hex, "\\x%02x", b);
            out += hex;
            ++i;
        } else {
            // A sequence cut by max_bytes is shown whole: the cut never splits a character.
            out.append(text.substr(i, n));
            i += n;
        }
    }
    if (i < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
    return out;
}

std::string file_kind(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    switch (st.type()) {
    case fs::file_type::regular:
        return "a regular file";
    case fs::file_type::directory:
        return "a directory";
    case fs::file_type::fifo:
        return "a FIFO (named pipe)";
    case fs::file_type::character:
        return "a character device";
    case fs::file_type::block:
        return "a block device";
    case fs::file_type::socket:
        return "a socket";
    case fs::file_type::not_found:
        return fs::is_symlink(fs::symlink_status(path, ec)) ? "a dangling link" : "no such file";
    default:
        return "not a regular file";
    }
}

} // namespace trainscope::core
