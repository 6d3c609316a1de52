// JPEG/PNG decoding (see image_decoder.hpp). Both libraries report errors through return values
// here (TurboJPEG's handle API and libpng's simplified png_image API), so no setjmp/longjmp crosses
// C++ frames. One decoder handle per call: images are decoded concurrently by the loader threads.
#include "trainscope/data/image_decoder.hpp"

#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>

#include "trainscope/core/error.hpp"

namespace trainscope::data {
namespace {

using core::InputError;

// Decoded images are refused beyond this many pixels before their buffers are allocated: a header
// may declare 100000 x 100000 (a 40 GB RGBA buffer) in a 100-byte file. 2^28 pixels (16384 x
// 16384) is 1 GiB as RGBA, beyond any training image (ImageNet's largest are ~ 6000 x 4000).
constexpr std::uint64_t kMaxImagePixels = std::uint64_t{1} << 28;

void check_image_size(std::uint64_t width, std::uint64_t height, const std::string& name,
                      const char* format) {
    if (width * height <= kMaxImagePixels) return;
    throw InputError("image '" + name + "' is a " + format + " of " + std::to_string(width) + "x" +
                     std::to_string(height) + " pixels, more than the " +
                     std::to_string(kMaxImagePixels) +
                     " (16384x16384) an image may have (a corrupt header, or an image far larger "
                     "than training needs): downscale, replace or remove it");
}

bool is_jpeg(const std::uint8_t* b, std::size_t n) {
    return n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF;
}

bool is_png(const std::uint8_t* b, std::size_t n) {
    static const std::uint8_t kMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    return n >= 8 && std::memcmp(b, kMagic, 8) == 0;
}

// A libjpeg warning that means part of the image is missing (the rest would be filled with
// grey): "Premature end of JPEG file", "Corrupt JPEG data: premature end of data segment".
bool means_lost_data(const std::string& message) {
    std::string lower = message;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return lower.find("premature end") != std::string::npos;
}

struct TjDestroy {
    void operator()(void* h) const { tjDestroy(h); }
};

DecodedImage decode_jpeg(const std::uint8_t* bytes, std::size_t size, const std::string& name) {
    std::unique_ptr<void, TjDestroy> tj(tjInitDecompress());
    if (!tj) throw core::InternalError(std::string("tjInitDecompress: ") + tjGetErrorStr2(nullptr));
    auto* buf = const_cast<unsigned char*>(bytes);
    const auto len = static_cast<unsigned long>(size);
    int width = 0, height = 0, subsamp = 0, colorspace = 0;
    if (tjDecompressHeader3(tj.get(), buf, len, &width, &height, &subsamp, &colorspace) != 0)
        throw InputError("image '" + name + "' is a corrupt JPEG file (" +
                         tjGetErrorStr2(tj.get()) + "): replace or remove it");
    check_image_size(static_cast<std::uint64_t>(width), static_cast<std::uint64_t>(height), name,
                     "JPEG");
    DecodedImage img;
    img.height = height;
    img.width = width;
    const std::size_t pixels = static_cast<std::size_t>(width) * static_cast<std::size_t>(height);
    const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
    // libjpeg cannot convert CMYK to RGB: decode to CMYK and convert below.
    std::vector<std::uint8_t> cmyk_pixels(cmyk ? pixels * 4 : 0);
    img.rgb.resize(pixels * 3);
    unsigned char* dst = cmyk ? cmyk_pixels.data() : img.rgb.data();
    if (tjDecompress2(tj.get(), buf, len, dst, width, /*pitch=*/0, height,
                      cmyk ? TJPF_CMYK : TJPF_RGB, /*flags=*/0) != 0) {
        const std::string message = tjGetErrorStr2(tj.get());
        if (tjGetErrorCode(tj.get()) == TJERR_FATAL || means_lost_data(message))
            throw InputError("image '" + name + "' is a corrupt or truncated JPEG file (" +
                             message + "): replace or remove it");
    }
    if (cmyk) {
        // Adobe CMYK JPEGs store inverted inks (255 = no ink): R = (255 - C)(255 - K)/255.
        for (std::size_t p = 0; p < pixels; ++p) {
            const unsigned k = cmyk_pixels[4 * p + 3];
            for (int c = 0; c < 3; ++c)
                img.rgb[3 * p + c] =
                    static_cast<std::uint8_t>((cmyk_pixels[4 * p + c] * k + 127) / 255);
        }
    }
    return img;
}

DecodedImage decode_png(const std::uint8_t* bytes, std::size_t size, const std::string& name) {
    png_image image;
    std::memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
    auto fail = [&](const char* stage) {
        const std::string message = image.message;
        png_image_free(&image);
        return InputError("image '" + name + "' is a corrupt or truncated PNG file (" + stage +
                          ": " + message + "): replace or remove it");
    };
    if (!png_image_begin_read_from_memory(&image, bytes, size)) throw fail("header");
    if (std::uint64_t{image.width} * image.height > kMaxImagePixels) {
        png_image_free(&image);
        check_image_size(image.width, image.height, name, "PNG");
    }
    // RGBA, then the alpha channel is dropped: requesting RGB would composite onto a background.
    image.format = PNG_FORMAT_RGBA;
    std::vector<std::uint8_t> rgba(PNG_IMAGE_SIZE(image));
    if (!png_image_finish_read(&image, /*background=*/nullptr, rgba.data(), /*row_stride=*/0,
                               /*colormap=*/nullptr))
        throw fail("pixel data");
    DecodedImage img;
    img.height = image.height;
    img.width = image.width;
    const std::size_t pixels = static_cast<std::size_t>(img.height * img.width);
    img.rgb.resize(pixels * 3);
    for (std::size_t p = 0; p < pixels; ++p)
        std::memcpy(&img.rgb[3 * p], &rgba[4 * p], 3);
    return img;
}

} // namespace

DecodedImage decode_image(const std::uint8_t* bytes, std::size_t size, const std::string& name) {
    if (size == 0)
        throw InputError("image '" + name +
                         "' is empty (0 bytes; an interrupted copy?): replace "
                         "or remove it");
    if (is_jpeg(bytes, size)) return decode_jpeg(bytes, size, name);
    if (is_png(bytes, size)) return decode_png(bytes, size, name);
    throw InputError("image '" + name + "' is neither a JPEG nor a PNG file (" +
                     std::to_string(size) +
                     " bytes, unknown signature): only JPEG and PNG images are supported");
}

DecodedImage decode_image_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    if (!f) throw InputError("cannot open image '" + path + "': " + std::strerror(errno));
    const std::streamsize size = f.tellg();
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(std::max<std::streamsize>(size, 0)));
    f.seekg(0);
    if (size < 0 || !f.read(reinterpret_cast<char*>(bytes.data()), size))
        throw InputError("cannot read image '" + path + "': " + std::strerror(errno));
    return decode_image(bytes.data(), bytes.size(), path);
}

} // namespace trainscope::data
