// DistributedSampler (see the header for the sharding rule). The permutation is built only from
// std::mt19937_64, whose output sequence the C++ standard fixes, so libstdc++ and libc++ builds
// (and every rank) agree on the order.
#include "trainscope/data/distributed_sampler.hpp"

#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "random_internal.hpp"
#include "trainscope/core/error.hpp"

namespace trainscope::data {

using detail::mix64;
using detail::uniform_below;

std::vector<std::int64_t> seeded_permutation(std::size_t n, std::uint64_t seed,
                                             std::int64_t epoch) {
    std::vector<std::int64_t> p(n);
    std::iota(p.begin(), p.end(), std::int64_t{0});
    std::mt19937_64 rng(mix64(seed ^ mix64(static_cast<std::uint64_t>(epoch))));
    for (std::size_t i = n; i > 1; --i) {
        std::size_t j = static_cast<std::size_t>(uniform_below(rng, i));
        std::swap(p[i - 1], p[j]);
    }
    return p;
}

DistributedSampler::DistributedSampler(std::size_t dataset_size, int rank, int world_size,
                                       bool shuffle, std::uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size), rank_(rank), world_size_(world_size), shuffle_(shuffle),
      seed_(seed) {
    if (world_size < 1 || rank < 0 || rank >= world_size)
        throw core::InternalError("DistributedSampler: rank " + std::to_string(rank) +
                                  " out of range for world size " + std::to_string(world_size));
    if (dataset_size == 0)
        throw core::InputError("the dataset is empty: there is nothing to train on");
    const auto n = dataset_size, w = static_cast<std::size_t>(world_size);
    num_samples_ = drop_last ? n / w : (n + w - 1) / w;
    if (num_samples_ == 0)
        // No advice to set data.drop_last=false: the LLM workload always drops the last partial
        // shard, and CV refuses fewer samples than ranks before (padding would train copies).
        throw core::ConfigError("the dataset has " + std::to_string(n) + " sample" +
                                (n == 1 ? "" : "s") + ", fewer than the " + std::to_string(w) +
                                " ranks: some ranks would get none; use more samples or fewer "
                                "ranks");
}

std::vector<std::int64_t> DistributedSampler::indices() const {
    std::vector<std::int64_t> order;
    if (shuffle_) {
        order = seeded_permutation(dataset_size_, seed_, epoch_);
    } else {
        order.resize(dataset_size_);
        std::iota(order.begin(), order.end(), std::int64_t{0});
    }
    // Position k of the padded (wrapped) or truncated order is order[k mod n].
    std::vector<std::int64_t> mine(num_samples_);
    const auto w = static_cast<std::size_t>(world_size_), r = static_cast<std::size_t>(rank_);
    for (std::size_t i = 0; i < num_samples_; ++i)
        mine[i] = order[(r + i * w) % dataset_size_];
    return mine;
}

} // namespace trainscope::data
