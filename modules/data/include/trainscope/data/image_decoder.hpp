// Decoding of the image files of data.dataset=imagefolder into 8-bit RGB: JPEG through
// libjpeg-turbo's TurboJPEG API, PNG through libpng. The format is told by the file's first bytes,
// not by its name (ImageNet holds a PNG named .JPEG). No LibTorch here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace trainscope::data {

struct DecodedImage {
    std::int64_t height = 0, width = 0;
    std::vector<std::uint8_t> rgb; // row-major [height, width, 3]
};

// Reads and decodes one file. Grayscale, gray+alpha, palette and RGBA inputs become RGB (alpha is
// dropped, not composited, as PIL's convert("RGB") does); 16-bit PNG samples become 8-bit; CMYK
// JPEGs (Adobe's inverted convention) become RGB. Throws core::InputError naming the file for an
// unreadable or empty file, a file that is neither JPEG nor PNG, a corrupt or truncated image, and
// a header declaring more than 2^28 pixels (refused before anything is allocated).
// JPEG warnings that do not mean lost data (e.g. extraneous bytes before a marker) are accepted.
DecodedImage decode_image_file(const std::string& path);

// The same on bytes already in memory; `name` is used in error messages.
DecodedImage decode_image(const std::uint8_t* bytes, std::size_t size, const std::string& name);

} // namespace trainscope::data
