// Text that reaches a terminal or a UTF-8 HDF5 string: UTF-8 validation and quoting of untrusted
// values (option values, file contents, paths) in messages. A raw invalid byte in a log line
// breaks every tool that reads the job's output as UTF-8 text (Python's subprocess, CI logs), and a
// 100 KB value quoted twice per message buries the fix.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace trainscope::core {

// Offset of the first byte of `text` that does not start or continue a well-formed UTF-8 sequence
// (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF), or nullopt when all is
// valid UTF-8.
std::optional<std::size_t> first_invalid_utf8(std::string_view text);

// `text` made safe to print: invalid UTF-8 bytes and control characters other than newline and
// tab become "\xNN"; when longer than `max_bytes`, the first `max_bytes` bytes then
// "... (N bytes)". max_bytes = 0: no limit.
std::string printable(std::string_view text, std::size_t max_bytes = 0);

// What is at `path`, for messages about an input that must be a regular file: "a regular file",
// "a directory", "a FIFO (named pipe)", "a character device", "a block device", "a socket",
// "a dangling link" or "no such file". Reading a FIFO or /dev/zero as a file hangs or never ends,
// so inputs are checked with this before they are opened.
std::string file_kind(const std::string& path);

} // namespace trainscope::core
