// libFuzzer target: data::read_idx on raw and gzip-compressed IDX files (the input is the file).
// A file that is accepted must hold exactly product(dims) bytes.
#include <cstdint>
#include <string_view>

#include "fuzz_input.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/data/idx_reader.hpp"

using namespace trainscope;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static fuzz::FuzzFile file("images-idx3-ubyte");
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    try {
        const data::IdxArray a = data::read_idx(file.write(bytes));
        std::uint64_t count = 1;
        for (auto d : a.dims)
            count *= static_cast<std::uint64_t>(d);
        fuzz::check(count == a.data.size(), "accepted IDX data size differs from its dims");
        fuzz::check(!data::format_dims(a.dims).empty(), "format_dims is empty");
    } catch (const core::InputError&) {
    }
    return 0;
}
