// Which sample indices each rank trains on in an epoch: the "DS" of the studies' DDP-DS strategy
// (PyTorch's DistributedSampler semantics), reproducible bit for bit across standard libraries.
// No LibTorch and no MPI: rank and world size are given by the caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace trainscope::data {

// Splits dataset indices 0..n-1 into world_size disjoint shards, one per rank.
//
// Order: with shuffle, one permutation of 0..n-1 per epoch, generated from (seed, epoch) with
// std::mt19937_64 and our own Fisher-Yates and bounded-integer draws (std::shuffle and
// std::uniform_int_distribution differ between standard libraries), so every rank computes the
// same permutation without communicating, and runs repeat exactly. Without shuffle: 0, 1, ..., n-1.
//
// Sharding: rank r takes positions r, r+N, r+2N, ... of that order (N = world_size).
//
// When N does not divide n:
//   drop_last = true:  the last n mod N positions are dropped; every rank gets floor(n/N) samples
//                      and each index appears at most once per epoch (which ones are dropped
//                      changes with the shuffle).
//   drop_last = false: the order is padded by wrapping around to its start; every rank gets
//                      ceil(n/N) samples, every index appears at least once, and the first
//                      ceil(n/N)*N - n positions are seen twice (as PyTorch's DistributedSampler).
class DistributedSampler {
  public:
    // Throws InternalError for rank/world_size out of range, InputError for an empty dataset and
    // ConfigError when drop_last would leave the ranks without samples (n < world_size).
    DistributedSampler(std::size_t dataset_size, int rank, int world_size, bool shuffle,
                       std::uint64_t seed, bool drop_last);

    // Selects the epoch's permutation; call before each epoch (as with PyTorch's set_epoch).
    void set_epoch(std::int64_t epoch) { epoch_ = epoch; }
    std::int64_t epoch() const { return epoch_; }

    // This rank's indices for the current epoch, in training order; num_samples() of them.
    std::vector<std::int64_t> indices() const;
    // Samples per rank per epoch (equal on every rank).
    std::size_t num_samples() const { return num_samples_; }
    std::size_t dataset_size() const { return dataset_size_; }

  private:
    std::size_t dataset_size_;
    int rank_;
    int world_size_;
    bool shuffle_;
    std::uint64_t seed_;
    std::size_t num_samples_;
    std::int64_t epoch_ = 0;
};

// The permutation of 0..n-1 for (seed, epoch) that DistributedSampler uses; exposed for tests and
// for single-process shuffling.
std::vector<std::int64_t> seeded_permutation(std::size_t n, std::uint64_t seed, std::int64_t epoch);

} // namespace trainscope::data
