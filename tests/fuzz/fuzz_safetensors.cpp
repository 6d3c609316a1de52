// libFuzzer target: the safetensors header parser (models::parse_safetensors_header) on a whole
// file in memory. An accepted header must only describe bytes inside the file, without overlaps.
#include <cstdint>

#include "fuzz_input.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/models/safetensors_header.hpp"

using namespace trainscope;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    try {
        const models::SafetensorsHeader h =
            models::parse_safetensors_header(data, size, "fuzz.safetensors");
        fuzz::check(h.header_bytes >= 8 && h.header_bytes <= size, "header beyond the file");
        for (const auto& e : h.entries) {
            fuzz::check(e.begin <= e.end && e.end <= size - h.header_bytes,
                        "tensor outside the data section");
            std::uint64_t bytes = models::safetensors_element_size(e.dtype);
            for (auto d : e.shape) {
                fuzz::check(d >= 0, "negative dimension accepted");
                bytes *=
                    static_cast<std::uint64_t>(d); // modulo 2^64; the true product fits (parser)
            }
            fuzz::check(bytes == e.end - e.begin, "tensor bytes differ from dtype x shape");
        }
    } catch (const core::InputError&) {
    }
    return 0;
}
