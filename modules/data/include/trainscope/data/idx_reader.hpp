// Reader of IDX files, the format of MNIST and Fashion-MNIST: a big-endian header
// (0x00 0x00 <type> <ndims>, then ndims uint32 sizes) followed by the raw elements. Files may be
// gzip-compressed (recognised by the gzip magic 1f 8b, not by the file name). Only the
// unsigned-byte element type (0x08) is read: that is what every MNIST-family file uses. No LibTorch
// here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainscope::data {

struct IdxArray {
    std::vector<std::int64_t> dims; // e.g. {60000, 28, 28} for images, {60000} for labels
    std::vector<std::uint8_t> data; // row-major, product(dims) bytes
};

// Magic numbers of the two MNIST file kinds (type 0x08 = unsigned byte, last byte = ndims).
inline constexpr std::uint32_t kIdxImagesMagic = 0x00000803;
inline constexpr std::uint32_t kIdxLabelsMagic = 0x00000801;

// Reads the whole file. Throws core::InputError naming the file and what is wrong: missing or
// unreadable, corrupt gzip stream, not an IDX file (magic), unsupported element type, truncated
// header, data size not matching the header's dimensions.
IdxArray read_idx(const std::string& path);

// "60000x28x28"
std::string format_dims(const std::vector<std::int64_t>& dims);

} // namespace trainscope::data
