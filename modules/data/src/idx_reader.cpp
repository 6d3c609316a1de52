// IDX reader (see idx_reader.hpp): the file is read into memory, inflated with zlib when it starts
// with the gzip magic, and its header is checked against the byte count so that a truncated
// download or a wrong file gives a message naming the file and the numbers, not a crash later.
#include "trainscope/data/idx_reader.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>

#include "trainscope/core/error.hpp"

namespace trainscope::data {
namespace {

using core::InputError;

std::string hex32(std::uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", v);
    return buf;
}

std::vector<std::uint8_t> read_file(const std::string& path) {
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (!f) throw InputError("cannot open IDX file '" + path + "': " + std::strerror(errno));
    std::vector<std::uint8_t> bytes;
    std::uint8_t chunk[1 << 16];
    std::size_t n;
    while ((n = std::fread(chunk, 1, sizeof chunk, f.get())) > 0)
        bytes.insert(bytes.end(), chunk, chunk + n);
    if (std::ferror(f.get()))
        throw InputError("cannot read IDX file '" + path + "': " + std::strerror(errno));
    return bytes;
}

// Inflates a gzip file (possibly several concatenated members, as gzip allows).
std::vector<std::uint8_t> gunzip(const std::vector<std::uint8_t>& in, const std::string& path) {
    auto corrupt = [&](const std::string& why) {
        return InputError("IDX file '" + path + "': gzip stream corrupt (" + why +
                          "); download or install the file again");
    };
    std::vector<std::uint8_t> out;
    // The gzip trailer holds the uncompressed size modulo 2^32: a good first guess for the buffer.
    if (in.size() >= 18) {
        const std::uint8_t* t = in.data() + in.size() - 4;
        std::size_t isize = std::uint32_t(t[0]) | std::uint32_t(t[1]) << 8 |
                            std::uint32_t(t[2]) << 16 | std::uint32_t(t[3]) << 24;
        // A truncated file has garbage there: never reserve more than a plausible ratio.
        out.reserve(std::min(isize, 64 * in.size()));
    }
    z_stream zs{};
    if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) throw corrupt("zlib initialisation failed");
    std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&zs, &inflateEnd);
    zs.next_in = const_cast<Bytef*>(in.data());
    std::size_t consumed = 0;
    std::uint8_t chunk[1 << 16];
    while (true) {
        // zlib counts in uInt: feed at most 1 GiB at a time.
        std::size_t avail = std::min<std::size_t>(in.size() - consumed, 1u << 30);
        zs.next_in = const_cast<Bytef*>(in.data() + consumed);
        zs.avail_in = static_cast<uInt>(avail);
        zs.next_out = chunk;
        zs.avail_out = sizeof chunk;
        int rc = inflate(&zs, Z_NO_FLUSH);
        consumed += avail - zs.avail_in;
        out.insert(out.end(), chunk, chunk + (sizeof chunk - zs.avail_out));
        if (rc == Z_STREAM_END) {
            // Another gzip member may follow; trailing zero padding is tolerated.
            std::size_t rest = in.size() - consumed;
            if (rest == 0) break;
            if (rest < 2 || in[consumed] != 0x1f || in[consumed + 1] != 0x8b) {
                bool zeros = true;
                for (std::size_t i = consumed; i < in.size() && zeros; ++i)
                    zeros = in[i] == 0;
                if (zeros) break;
                throw corrupt(std::to_string(rest) + " stray bytes after the compressed data");
            }
            inflateReset(&zs);
            continue;
        }
        if (rc == Z_OK) continue;
        if (rc == Z_BUF_ERROR && consumed == in.size())
            throw corrupt("compressed data ends early, the file is truncated");
        throw corrupt(zs.msg ? zs.msg : "zlib error " + std::to_string(rc));
    }
    return out;
}

const char* idx_type_name(std::uint8_t type) {
    switch (type) {
    case 0x08:
        return "unsigned byte";
    case 0x09:
        return "signed byte";
    case 0x0B:
        return "int16";
    case 0x0C:
        return "int32";
    case 0x0D:
        return "float32";
    case 0x0E:
        return "float64";
    }
    return nullptr;
}

} // namespace

std::string format_dims(const std::vector<std::int64_t>& dims) {
    std::string s;
    for (std::size_t i = 0; i < dims.size(); ++i)
        s += (i ? "x" : "") + std::to_string(dims[i]);
    return s.empty() ? "scalar" : s;
}

IdxArray read_idx(const std::string& path) {
    std::vector<std::uint8_t> bytes = read_file(path);
    if (bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b) bytes = gunzip(bytes, path);

    const std::string where = "IDX file '" + path + "'";
    if (bytes.size() < 4)
        throw InputError(where + ": truncated header: " + std::to_string(bytes.size()) +
                         " bytes, an IDX header needs at least 4");
    const std::uint32_t magic = std::uint32_t(bytes[0]) << 24 | std::uint32_t(bytes[1]) << 16 |
                                std::uint32_t(bytes[2]) << 8 | bytes[3];
    const std::uint8_t type = bytes[2];
    const std::size_t ndims = bytes[3];
    if (bytes[0] != 0 || bytes[1] != 0 || !idx_type_name(type) || ndims == 0)
        throw InputError(where + " is not an IDX file (magic " + hex32(magic) + "; expected " +
                         hex32(kIdxImagesMagic) + " for images or " + hex32(kIdxLabelsMagic) +
                         " for labels)");
    if (type != 0x08)
        throw InputError(where + " holds " + idx_type_name(type) + " elements (magic " +
                         hex32(magic) +
                         "); only unsigned-byte IDX files (MNIST-family images and labels) are "
                         "supported");
    const std::size_t header = 4 + 4 * ndims;
    if (bytes.size() < header)
        throw InputError(where + ": truncated header: " + std::to_string(ndims) +
                         " dimensions need " + std::to_string(header) + " bytes, file has " +
                         std::to_string(bytes.size()));

    IdxArray out;
    std::uint64_t count = 1;
    bool overflow = false;
    for (std::size_t d = 0; d < ndims; ++d) {
        const std::uint8_t* p = bytes.data() + 4 + 4 * d;
        std::uint32_t n =
            std::uint32_t(p[0]) << 24 | std::uint32_t(p[1]) << 16 | std::uint32_t(p[2]) << 8 | p[3];
        out.dims.push_back(n);
        if (n != 0 && count > std::numeric_limits<std::uint64_t>::max() / n) overflow = true;
        count *= n;
    }
    const std::uint64_t have = bytes.size() - header;
    if (overflow || count != have) {
        std::ostringstream m;
        m << where << (count > have || overflow ? " is truncated" : " is too long")
          << ": header says " << format_dims(out.dims) << " = "
          << (overflow ? std::string("more than 2^64") : std::to_string(count))
          << " bytes, file has " << have << " after the header";
        throw InputError(m.str());
    }
    out.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
    return out;
}

} // namespace trainscope::data
