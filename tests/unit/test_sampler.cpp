// DistributedSampler: every index covered once per epoch across ranks (the padding/dropping rule
// for sizes not divisible by the rank count), disjoint shards, reproducible seeded shuffles.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "trainscope/core/error.hpp"
#include "trainscope/data/distributed_sampler.hpp"

using trainscope::data::DistributedSampler;
using trainscope::data::seeded_permutation;

namespace {

std::vector<std::vector<std::int64_t>> shards(std::size_t n, int world, bool shuffle,
                                              std::uint64_t seed, bool drop_last,
                                              std::int64_t epoch) {
    std::vector<std::vector<std::int64_t>> out;
    for (int r = 0; r < world; ++r) {
        DistributedSampler s(n, r, world, shuffle, seed, drop_last);
        s.set_epoch(epoch);
        out.push_back(s.indices());
        EXPECT_EQ(out.back().size(), s.num_samples());
    }
    return out;
}

} // namespace

TEST(DistributedSampler, EveryIndexOncePerEpochOverAllRanks) {
    for (int world : {1, 2, 3, 4, 7}) {
        for (std::size_t n : {std::size_t(world) * 10, std::size_t(world) * 10 + 1,
                              std::size_t(world) * 10 + std::size_t(world) - 1, std::size_t(97)}) {
            for (bool shuffle : {false, true}) {
                SCOPED_TRACE("world " + std::to_string(world) + " n " + std::to_string(n) +
                             " shuffle " + std::to_string(shuffle));
                const std::size_t floor_n = n / world, ceil_n = (n + world - 1) / world;

                // drop_last: floor(n/N) each, no index twice, so the shards are disjoint.
                auto dropped = shards(n, world, shuffle, 7, true, 3);
                std::set<std::int64_t> seen;
                for (const auto& s : dropped) {
                    EXPECT_EQ(s.size(), floor_n);
                    for (auto i : s) {
                        EXPECT_TRUE(i >= 0 && i < std::int64_t(n));
                        EXPECT_TRUE(seen.insert(i).second) << "index " << i << " twice";
                    }
                }
                EXPECT_EQ(seen.size(), floor_n * world);

                // padding: ceil(n/N) each, every index at least once, ceil*N - n seen twice.
                auto padded = shards(n, world, shuffle, 7, false, 3);
                std::map<std::int64_t, int> count;
                for (const auto& s : padded) {
                    EXPECT_EQ(s.size(), ceil_n);
                    for (auto i : s)
                        ++count[i];
                }
                EXPECT_EQ(count.size(), n);
                std::size_t twice = 0;
                for (auto [i, c] : count) {
                    EXPECT_TRUE(i >= 0 && i < std::int64_t(n));
                    EXPECT_LE(c, 2);
                    twice += c == 2;
                }
                EXPECT_EQ(twice, ceil_n * world - n);
            }
        }
    }
}

TEST(DistributedSampler, UnshuffledShardsMatchPyTorch) {
    // torch.utils.data.DistributedSampler(range(10), num_replicas=4, shuffle=False)
    auto padded = shards(10, 4, false, 0, false, 0);
    EXPECT_EQ(padded[0], (std::vector<std::int64_t>{0, 4, 8}));
    EXPECT_EQ(padded[1], (std::vector<std::int64_t>{1, 5, 9}));
    EXPECT_EQ(padded[2], (std::vector<std::int64_t>{2, 6, 0}));
    EXPECT_EQ(padded[3], (std::vector<std::int64_t>{3, 7, 1}));
    auto dropped = shards(10, 4, false, 0, true, 0);
    EXPECT_EQ(dropped[0], (std::vector<std::int64_t>{0, 4}));
    EXPECT_EQ(dropped[3], (std::vector<std::int64_t>{3, 7}));
}

TEST(DistributedSampler, NewOrderEachEpochSameForSameSeed) {
    DistributedSampler a(1000, 1, 4, true, 42, true), b(1000, 1, 4, true, 42, true);
    DistributedSampler c(1000, 1, 4, true, 43, true);
    a.set_epoch(0);
    auto e0 = a.indices();
    a.set_epoch(1);
    auto e1 = a.indices();
    EXPECT_NE(e0, e1);
    b.set_epoch(1);
    EXPECT_EQ(b.indices(), e1); // another sampler (another rank's process) agrees
    c.set_epoch(1);
    EXPECT_NE(c.indices(), e1);
    a.set_epoch(0);
    EXPECT_EQ(a.indices(), e0); // going back repeats exactly

    // Epoch 1 is a reshuffle, not a rotation: the set of indices rank 1 gets changes too.
    std::set<std::int64_t> s0(e0.begin(), e0.end()), s1(e1.begin(), e1.end());
    EXPECT_NE(s0, s1);
}

TEST(DistributedSampler, PermutationIsFixedAcrossBuilds) {
    // Golden values: the order must not depend on the standard library (std::mt19937_64 is fully
    // specified; std::shuffle is not). A change here changes every run's sample order.
    EXPECT_EQ(seeded_permutation(10, 42, 0),
              (std::vector<std::int64_t>{9, 6, 2, 0, 1, 4, 3, 8, 5, 7}));
    EXPECT_EQ(seeded_permutation(10, 42, 1),
              (std::vector<std::int64_t>{5, 4, 1, 3, 0, 2, 7, 8, 6, 9}));
}

TEST(DistributedSampler, PermutationIsUniform) {
    // Position 0 of 20000 permutations of 10: each value ~2000 times. A biased Fisher-Yates
    // (e.g. Sattolo's j < i, which never leaves an element in place) fails this.
    std::vector<int> first(10, 0), fixed(10, 0);
    for (int e = 0; e < 20000; ++e) {
        auto p = seeded_permutation(10, 5, e);
        ++first[static_cast<std::size_t>(p[0])];
        for (std::size_t i = 0; i < 10; ++i)
            fixed[i] += p[i] == std::int64_t(i);
    }
    for (int v = 0; v < 10; ++v) {
        EXPECT_NEAR(first[v], 2000, 200) << "value " << v;
        EXPECT_NEAR(fixed[v], 2000, 200) << "position " << v;
    }
}

TEST(DistributedSampler, RejectsImpossibleSplits) {
    EXPECT_THROW(DistributedSampler(10, 4, 4, true, 0, true), trainscope::core::InternalError);
    EXPECT_THROW(DistributedSampler(10, 0, 0, true, 0, true), trainscope::core::InternalError);
    EXPECT_THROW(DistributedSampler(0, 0, 1, true, 0, true), trainscope::core::InputError);
    try {
        DistributedSampler(3, 0, 4, true, 0, true);
        FAIL() << "expected ConfigError";
    } catch (const trainscope::core::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("3 samples, fewer than the 4 ranks"),
                  std::string::npos)
            << e.what();
    }
    // Padding still gives every rank one sample.
    EXPECT_EQ(DistributedSampler(3, 3, 4, true, 0, false).num_samples(), 1u);
}
