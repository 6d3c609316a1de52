// The safetensors header parser without LibTorch: the 8-byte length and the JSON header of a file
// already in memory, validated against the file size. SafetensorsFile maps a file and calls it;
// the fuzz targets (tests/fuzz) call it directly, so that they build without LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace trainscope::models {

// One tensor of the header, its dtype by safetensors name ("F32").
struct SafetensorsHeaderEntry {
    std::string name;
    std::string dtype;
    std::vector<std::int64_t> shape;
    std::uint64_t begin = 0, end = 0; // byte offsets relative to the data section
};

struct SafetensorsHeader {
    std::vector<SafetensorsHeaderEntry> entries; // in header order
    std::map<std::string, std::string> metadata;
    std::uint64_t header_bytes = 0; // 8 + header length: where the data section starts
};

// `bytes` holds the whole file, `size` bytes (null only when size is 0). Validates what
// SafetensorsFile documents: header length within the file, valid JSON, known dtypes, integer
// shapes and offsets, offsets inside the data section, end - begin = numel * element size (without
// overflow), no overlaps. Throws core::InputError naming `path`, the tensor and what is wrong.
SafetensorsHeader parse_safetensors_header(const unsigned char* bytes, std::uint64_t size,
                                           const std::string& path);

// Throws core::InputError "safetensors file '<path>': <what>", the form of every safetensors error.
[[noreturn]] void safetensors_error(const std::string& path, const std::string& what);

// Bytes per element of a safetensors dtype name; throws core::InputError for an unsupported one.
std::size_t safetensors_element_size(const std::string& dtype);

} // namespace trainscope::models
