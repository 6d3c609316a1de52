// safetensors header parser (see safetensors_header.hpp). Every number in the header is checked
// against the file before it is used: a corrupt or hostile header must give a message naming the
// file and the tensor, never an allocation, an overflow or a read outside the file.
#include "trainscope/models/safetensors_header.hpp"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

#include "trainscope/core/error.hpp"

namespace trainscope::models {

using json = nlohmann::json;

namespace {

// Header sizes above this are not plausible (HF caps it at 100 MB as well).
constexpr std::uint64_t kMaxHeader = 100ull << 20;

// numel * element_size in bytes, or kTooMany when that does not fit in 64 bits.
constexpr std::uint64_t kTooMany = std::numeric_limits<std::uint64_t>::max();
std::uint64_t tensor_bytes(const std::vector<std::int64_t>& shape, std::size_t element_size) {
    if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
    std::uint64_t n = element_size;
    for (auto d : shape) {
        const auto u = static_cast<std::uint64_t>(d);
        if (n > kTooMany / u) return kTooMany;
        n *= u;
    }
    return n;
}

} // namespace

std::size_t safetensors_element_size(const std::string& dtype) {
    static const std::map<std::string, std::size_t> sizes = {
        {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},
        {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
    auto it = sizes.find(dtype);
    if (it == sizes.end())
        throw core::InputError("safetensors dtype '" + dtype +
                               "' is not supported (F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)");
    return it->second;
}

void safetensors_error(const std::string& path, const std::string& what) {
    throw core::InputError("safetensors file '" + path + "': " + what);
}

SafetensorsHeader parse_safetensors_header(const unsigned char* bytes, std::uint64_t size,
                                           const std::string& path) {
    if (size < 8)
        safetensors_error(path, "only " + std::to_string(size) +
                                    " bytes: too short for the 8-byte header length");
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i)
        n = (n << 8) | bytes[i];
    if (n > kMaxHeader || n > size - 8)
        safetensors_error(path, "header length " + std::to_string(n) + " exceeds the file (" +
                                    std::to_string(size) +
                                    " bytes): truncated or not a safetensors file");
    json header;
    try {
        header = json::parse(reinterpret_cast<const char*>(bytes) + 8,
                             reinterpret_cast<const char*>(bytes) + 8 + n);
    } catch (const json::exception& e) {
        safetensors_error(path, std::string("header is not valid JSON: ") + e.what());
    }
    if (!header.is_object()) safetensors_error(path, "header is not a JSON object");
    SafetensorsHeader out;
    const std::uint64_t data_size = size - 8 - n;
    for (auto it = header.begin(); it != header.end(); ++it) {
        const std::string& name = it.key();
        if (name == "__metadata__") {
            if (!it->is_object()) safetensors_error(path, "__metadata__ is not an object");
            for (auto m = it->begin(); m != it->end(); ++m) {
                if (!m->is_string())
                    safetensors_error(path, "__metadata__['" + m.key() + "'] is not a string");
                out.metadata[m.key()] = m->get<std::string>();
            }
            continue;
        }
        const json& e = *it;
        if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
            !e.contains("data_offsets"))
            safetensors_error(path, "tensor '" + name + "' lacks dtype, shape or data_offsets");
        SafetensorsHeaderEntry entry;
        entry.name = name;
        std::size_t element_size = 0;
        try {
            entry.dtype = e.at("dtype").get<std::string>();
            element_size = safetensors_element_size(entry.dtype);
        } catch (const json::exception& ex) {
            safetensors_error(path, "tensor '" + name + "': " + ex.what());
        } catch (const core::InputError& ex) {
            safetensors_error(path, "tensor '" + name + "': " + ex.what());
        }
        // Integers only: a float such as 1e300 converted to an integer is undefined behaviour.
        if (!e["shape"].is_array())
            safetensors_error(path, "tensor '" + name + "': shape must be an array of integers");
        for (const auto& d : e["shape"]) {
            if (!d.is_number_integer())
                safetensors_error(path,
                                  "tensor '" + name + "' has a dimension that is not an integer");
            if (d.get<std::int64_t>() < 0)
                safetensors_error(path, "tensor '" + name + "' has a negative dimension");
            entry.shape.push_back(d.get<std::int64_t>());
        }
        const json& off = e["data_offsets"];
        if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
            !off[1].is_number_unsigned())
            safetensors_error(path, "tensor '" + name +
                                        "': data_offsets must be [begin, end] (byte offsets)");
        entry.begin = off[0].get<std::uint64_t>();
        entry.end = off[1].get<std::uint64_t>();
        if (entry.begin > entry.end || entry.end > data_size)
            safetensors_error(path,
                              "tensor '" + name + "' data_offsets [" + std::to_string(entry.begin) +
                                  ", " + std::to_string(entry.end) +
                                  "] outside the data section of " + std::to_string(data_size) +
                                  " bytes (truncated file? copy or download it again)");
        const std::uint64_t want = tensor_bytes(entry.shape, element_size);
        if (entry.end - entry.begin != want)
            safetensors_error(
                path,
                "tensor '" + name + "' holds " + std::to_string(entry.end - entry.begin) +
                    " bytes but its dtype and shape need " +
                    (want == kTooMany ? std::string("more than 2^64") : std::to_string(want)));
        out.entries.push_back(std::move(entry));
    }
    // No two tensors may share bytes.
    std::vector<const SafetensorsHeaderEntry*> sorted;
    for (const auto& e : out.entries)
        sorted.push_back(&e);
    std::sort(sorted.begin(), sorted.end(),
              [](const auto* a, const auto* b) { return a->begin < b->begin; });
    for (std::size_t i = 1; i < sorted.size(); ++i)
        if (sorted[i]->begin < sorted[i - 1]->end)
            safetensors_error(path, "tensors '" + sorted[i - 1]->name + "' and '" +
                                        sorted[i]->name + "' overlap");
    out.header_bytes = 8 + n;
    return out;
}

} // namespace trainscope::models
