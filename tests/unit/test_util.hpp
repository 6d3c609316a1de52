// Helpers shared by the unit tests (one definition each: the tests compile as a unity build, so two
// files may not define the same file-local helper).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace trainscope::testing {

// An empty directory <tmp>/trainscope_<prefix>_<name>, removed first if an earlier run left it.
inline std::filesystem::path temp_dir(const std::string& prefix, const std::string& name) {
    const auto d = std::filesystem::temp_directory_path() / ("trainscope_" + prefix + "_" + name);
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
}

// The whole file as bytes.
inline std::vector<std::uint8_t> file_bytes(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), {}};
}

// Every batch a loader yields, in order (until it reports the end of the epoch).
template <class Loader> auto drain(Loader& loader) {
    std::vector<typename std::decay_t<decltype(*loader.next())>> out;
    while (auto b = loader.next())
        out.push_back(std::move(*b));
    return out;
}

} // namespace trainscope::testing
