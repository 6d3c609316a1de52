// Portable random draws shared by the sampler, the synthetic set and the image-folder crops: built
// only on std::mt19937_64, whose output sequence the C++ standard fixes (std:: distributions are
// not portable across standard libraries), so every rank and every build draws the same numbers.
#pragma once

#include <cstdint>
#include <random>

namespace trainscope::data::detail {

// SplitMix64 finaliser: spreads a key over all 64 bits so that nearby seeds, epochs and sample
// indices give unrelated generator states.
inline std::uint64_t mix64(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

// Uniform integer in [0, bound) without modulo bias: reject draws below 2^64 mod bound.
inline std::uint64_t uniform_below(std::mt19937_64& rng, std::uint64_t bound) {
    const std::uint64_t threshold = (0 - bound) % bound;
    std::uint64_t r;
    do
        r = rng();
    while (r < threshold);
    return r % bound;
}

// Uniform double in [0, 1) from the top 53 bits.
inline double unit(std::mt19937_64& rng) {
    return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

} // namespace trainscope::data::detail
