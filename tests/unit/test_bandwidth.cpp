// nccl-tests' bandwidth conventions (distributed/bandwidth.hpp) against their closed forms: algbw
// in GB/s of 1e9 bytes, busbw factors 2(n-1)/n, (n-1)/n, (n-1)/n and 1.
#include <gtest/gtest.h>

#include "trainscope/core/error.hpp"
#include "trainscope/distributed/bandwidth.hpp"

namespace dist = trainscope::dist;
using dist::Collective;

TEST(Bandwidth, AlgbwIsBytesPerSecondInDecimalGigabytes) {
    EXPECT_DOUBLE_EQ(dist::algbw_GBps(1e9, 1.0), 1.0);
    EXPECT_DOUBLE_EQ(dist::algbw_GBps(268435456, 0.5), 0.536870912); // 256 MiB in 0.5 s
    EXPECT_DOUBLE_EQ(dist::algbw_GBps(8, 2e-6), 0.004);
    EXPECT_EQ(dist::algbw_GBps(1e6, 0.0), 0.0); // no time measured: no bandwidth, not inf
}

TEST(Bandwidth, BusFactorsFollowNcclTests) {
    for (int n : {1, 2, 3, 4, 8, 64}) {
        SCOPED_TRACE("ranks " + std::to_string(n));
        EXPECT_DOUBLE_EQ(dist::busbw_factor(Collective::AllReduce, n), 2.0 * (n - 1) / n);
        EXPECT_DOUBLE_EQ(dist::busbw_factor(Collective::AllGather, n), double(n - 1) / n);
        EXPECT_DOUBLE_EQ(dist::busbw_factor(Collective::ReduceScatter, n), double(n - 1) / n);
        EXPECT_DOUBLE_EQ(dist::busbw_factor(Collective::Broadcast, n), 1.0);
    }
    EXPECT_DOUBLE_EQ(dist::busbw_factor(Collective::AllReduce, 2), 1.0);
    EXPECT_DOUBLE_EQ(dist::busbw_factor(Collective::AllReduce, 4), 1.5);
    EXPECT_DOUBLE_EQ(dist::busbw_factor(Collective::AllGather, 4), 0.75);
    // 1 GB allreduced in 1 s on 8 ranks: algbw 1, busbw 1.75.
    EXPECT_DOUBLE_EQ(dist::busbw_GBps(Collective::AllReduce, 1e9, 1.0, 8), 1.75);
    EXPECT_DOUBLE_EQ(dist::busbw_GBps(Collective::Broadcast, 3e9, 2.0, 8), 1.5);
}

TEST(Bandwidth, CollectiveNamesRoundTripAndTypoIsConfigError) {
    for (Collective c : {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter,
                         Collective::Broadcast})
        EXPECT_EQ(dist::parse_collective(dist::to_string(c)), c);
    EXPECT_STREQ(dist::to_string(Collective::ReduceScatter), "reduce_scatter");
    try {
        dist::parse_collective("all_reduce", "comm.ops");
        FAIL() << "no ConfigError";
    } catch (const trainscope::core::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("comm.ops"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("'all_reduce'"), std::string::npos) << e.what();
    }
}
