// Summary statistics with exact expectations: percentiles equal numpy.percentile's default
// (linear) results, imbalance and stragglers on hand-made rank matrices, the MFU peak table's
// matching of real device names (unknown devices get no value), and the printed summary table.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "trainscope/prof/statistics.hpp"

namespace st = trainscope::prof::stats;

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}

TEST(Statistics, PercentileMatchesNumpyLinear) {
    // numpy.percentile([1, 2, 3, 4], 95) == 3.85; median of an even count is the midpoint.
    EXPECT_DOUBLE_EQ(st::percentile({4, 1, 3, 2}, 95), 3.85);
    EXPECT_DOUBLE_EQ(st::median({4, 1, 3, 2}), 2.5);
    EXPECT_DOUBLE_EQ(st::median({3, 1, 2}), 2.0);
    std::vector<double> v;
    for (int i = 20; i >= 1; --i)
        v.push_back(i);
    EXPECT_DOUBLE_EQ(st::p95(v), 19.05); // numpy.percentile(range(1, 21), 95)
    EXPECT_DOUBLE_EQ(st::percentile(v, 0), 1.0);
    EXPECT_DOUBLE_EQ(st::percentile(v, 100), 20.0);
    EXPECT_DOUBLE_EQ(st::percentile({7}, 95), 7.0);
    EXPECT_DOUBLE_EQ(st::median({kNaN, 1, 3}), 2.0); // NaNs ignored
    EXPECT_TRUE(std::isnan(st::median({})));
    EXPECT_TRUE(std::isnan(st::median({kNaN})));
    EXPECT_TRUE(std::isnan(st::percentile({1, 2}, 101)));
    EXPECT_DOUBLE_EQ(st::mean({1, kNaN, 2}), 1.5);
}

TEST(Statistics, ImbalanceIsMaxOverMeanPerIterationOnTheCommonPrefix) {
    const st::RankMatrix m = {{1, 2, 3}, {3, 2, 1, 9}};
    const auto imb = st::imbalance_per_iteration(m);
    ASSERT_EQ(imb.size(), 3u);
    EXPECT_DOUBLE_EQ(imb[0], 1.5);
    EXPECT_DOUBLE_EQ(imb[1], 1.0);
    EXPECT_DOUBLE_EQ(imb[2], 1.5);
    EXPECT_EQ(st::mean_over_ranks(m), (std::vector<double>{2, 2, 2}));
    EXPECT_TRUE(std::isnan(st::imbalance_per_iteration({{0.0}, {0.0}})[0]));
    EXPECT_TRUE(st::imbalance_per_iteration({}).empty());
}

TEST(Statistics, StragglerExceedsTheMeanOfRanksByMoreThanTheThreshold) {
    const st::RankMatrix slow3 = {{1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1, 1}, {1.2, 1.2, 1.2, 1.2}};
    const auto s = st::find_stragglers(slow3);
    EXPECT_EQ(s.ranks, (std::vector<int>{3}));
    EXPECT_EQ(s.slowest_count, (std::vector<std::int64_t>{0, 0, 0, 4}));
    EXPECT_DOUBLE_EQ(s.rank_mean[3], 1.2);
    // 1.04 vs a mean of ranks of 1.01: 3% above, under the 5% threshold.
    const st::RankMatrix mild = {{1, 1}, {1, 1}, {1, 1}, {1.04, 1.04}};
    EXPECT_TRUE(st::find_stragglers(mild).ranks.empty());
    EXPECT_EQ(st::find_stragglers(mild, 0.02).ranks, (std::vector<int>{3}));
    // Ties go to the lowest rank in slowest_count.
    EXPECT_EQ(st::find_stragglers({{1, 2}, {1, 1}}).slowest_count,
              (std::vector<std::int64_t>{2, 0}));
}

TEST(Statistics, PeakTableMatchesKnownDevicesOnly) {
    struct Case {
        const char* name;
        const char* model; // nullptr: unknown
    };
    const Case cases[] = {
        {"NVIDIA H100 80GB HBM3", "H100 SXM"},
        {"NVIDIA H100 SXM5 80GB", "H100 SXM"},
        {"NVIDIA H100 PCIe", "H100 PCIe"},
        {"NVIDIA H200", "H200 SXM"},
        {"NVIDIA A100-SXM4-40GB", "A100 SXM"},
        {"NVIDIA A100-SXM4-80GB", "A100 SXM"},
        {"NVIDIA A100-PCIE-40GB", "A100 PCIe"},
        {"NVIDIA A100 80GB PCIe", "A100 PCIe"},
        {"NVIDIA H100 NVL", nullptr},
        {"NVIDIA H200 NVL", nullptr},
        {"NVIDIA GH200 480GB", nullptr},
        {"NVIDIA H800", nullptr},
        {"NVIDIA A100", nullptr},
        {"NVIDIA A10", nullptr},
        {"NVIDIA A800-SXM4-80GB", nullptr},
        {"Tesla V100-SXM2-32GB", nullptr},
        {"cpu", nullptr},
        {"", nullptr},
    };
    for (const Case& c : cases) {
        const auto p = st::device_peak(c.name);
        if (c.model) {
            ASSERT_TRUE(p) << c.name;
            EXPECT_STREQ(p->model, c.model) << c.name;
        } else {
            EXPECT_FALSE(p) << c.name << " matched " << p->model;
        }
    }
    EXPECT_DOUBLE_EQ(*st::peak_flops("NVIDIA H100 80GB HBM3", "bf16"), 989.5e12);
    EXPECT_DOUBLE_EQ(*st::peak_flops("NVIDIA H100 PCIe", "fp16-mixed"), 756.5e12);
    EXPECT_DOUBLE_EQ(*st::peak_flops("NVIDIA A100-SXM4-80GB", "tf32"), 156e12);
    EXPECT_DOUBLE_EQ(*st::peak_flops("NVIDIA A100-PCIE-40GB", "fp32"), 19.5e12);
    EXPECT_DOUBLE_EQ(*st::peak_flops("NVIDIA H200", "fp64"), 67e12);
    EXPECT_FALSE(st::peak_flops("NVIDIA H100 PCIe", "int8"));
}

// Every run.precision (train/precision.cpp accepts exactly these six) maps to the arithmetic its
// matmuls run in; mixed precisions to the autocast dtype's tensor cores (issue 16: they were
// "n/a" because the table knew only fp16/bf16/tf32/fp32/fp64).
TEST(Statistics, EveryRunPrecisionHasAPeak) {
    struct Case {
        const char* precision;
        st::PeakMath math;
        double h100_sxm, a100_pcie; // TFLOP/s, dense
        const char* basis;
    };
    const Case cases[] = {
        {"fp64", st::PeakMath::FP64, 67.0, 19.5, "fp64 tensor cores"},
        {"fp32", st::PeakMath::FP32, 67.0, 19.5, "fp32 CUDA cores (no tensor cores)"},
        {"tf32", st::PeakMath::TF32, 494.5, 156.0, "tf32 tensor cores"},
        {"fp16-mixed", st::PeakMath::FP16, 989.5, 312.0, "fp16 tensor cores (autocast)"},
        {"bf16-mixed", st::PeakMath::BF16, 989.5, 312.0, "bf16 tensor cores (autocast)"},
        {"bf16", st::PeakMath::BF16, 989.5, 312.0, "bf16 tensor cores"},
    };
    for (const Case& c : cases) {
        const auto m = st::precision_math(c.precision);
        ASSERT_TRUE(m) << c.precision;
        EXPECT_EQ(m->math, c.math) << c.precision;
        EXPECT_STREQ(m->basis, c.basis) << c.precision;
        const auto sxm = st::peak_flops("NVIDIA H100 80GB HBM3", c.precision);
        const auto pcie = st::peak_flops("NVIDIA A100-PCIE-40GB", c.precision);
        ASSERT_TRUE(sxm && pcie) << c.precision;
        EXPECT_DOUBLE_EQ(*sxm, c.h100_sxm * 1e12) << c.precision;
        EXPECT_DOUBLE_EQ(*pcie, c.a100_pcie * 1e12) << c.precision;
        EXPECT_FALSE(st::peak_flops("cpu", c.precision)) << c.precision;
    }
    // H100 PCIe: fp16 and bf16 mixed share the 16-bit tensor-core peak.
    EXPECT_DOUBLE_EQ(*st::peak_flops("NVIDIA H100 PCIe", "bf16-mixed"), 756.5e12);
    // Math names and misspellings are not run precisions: no peak rather than a guessed one.
    for (const char* other : {"fp16", "half", "bf16_mixed", "BF16-mixed", "int8", ""}) {
        EXPECT_FALSE(st::precision_math(other)) << other;
        EXPECT_FALSE(st::peak_flops("NVIDIA H100 80GB HBM3", other)) << other;
    }
}

TEST(Statistics, ModelFlopsUtilization) {
    EXPECT_DOUBLE_EQ(st::training_flops_per_sample(1e6), 6e6);
    EXPECT_DOUBLE_EQ(*st::model_flops_utilization(494.75e12, "NVIDIA H100 80GB HBM3", "bf16"), 0.5);
    EXPECT_DOUBLE_EQ(*st::model_flops_utilization(494.75e12, "NVIDIA H100 80GB HBM3", "bf16-mixed"),
                     0.5);
    EXPECT_DOUBLE_EQ(*st::model_flops_utilization(78e12, "NVIDIA A100-SXM4-40GB", "fp16-mixed"),
                     0.25);
    EXPECT_FALSE(st::model_flops_utilization(1e12, "cpu", "fp32"));
    EXPECT_FALSE(st::model_flops_utilization(1e12, "NVIDIA H100 NVL", "bf16"));
}

TEST(Statistics, SummaryTable) {
    st::SummaryReport r;
    r.world_size = 2;
    r.measured_iterations = 55;
    r.warmup_iterations = 5;
    r.phases = {{"forward", 0.01234, 0.01301}, {"step", 0.1, 0.125}};
    r.throughput_samples_per_s = 1234.56;
    r.imbalance_median = 1.0123;
    r.imbalance_p95 = 1.0456;
    r.stragglers = {1, 3};
    r.device_name = "cpu";
    r.precision = "fp32";
    r.peak_host_rss_bytes = 512.0 * 1024 * 1024;
    const std::string t = st::format_summary_table(r);
    const std::string expected =
        "summary over 55 measured iterations (5 warm-up excluded), 2 rank(s)\n"
        "  phase             median ms     p95 ms\n"
        "  forward               12.34      13.01\n"
        "  step                 100.00     125.00\n"
        "  throughput                  1234.6 samples/s\n"
        "  imbalance (max/mean)        median 1.012, p95 1.046\n"
        "  stragglers                  rank 1, 3\n"
        "  MFU                         n/a (no peak known for 'cpu', fp32)\n"
        "  GPU energy                  n/a (no NVML energy counter)\n"
        "  peak host RSS               512.0 MiB";
    EXPECT_EQ(t, expected);

    r.stragglers.clear();
    r.mfu = 0.4321;
    r.device_name = "NVIDIA H100 80GB HBM3";
    r.precision = "bf16-mixed";
    r.energy_j = 1000;
    r.energy_per_iteration_j = 20;
    r.energy_per_sample_j = 0.01;
    r.peak_device_bytes = 1024.0 * 1024 * 1024;
    r.throughput_tokens_per_s = 5e4;
    const std::string g = st::format_summary_table(r);
    EXPECT_NE(g.find("  stragglers                  none\n"), std::string::npos) << g;
    EXPECT_NE(g.find("  MFU                         43.2 % of 989.5 TFLOP/s, bf16 tensor cores "
                     "(autocast) (NVIDIA H100 80GB HBM3, bf16-mixed)\n"),
              std::string::npos)
        << g;
    EXPECT_NE(
        g.find("  GPU energy                  1000.0 J; 20.000 J/iteration, 10.000 mJ/sample"),
        std::string::npos)
        << g;
    EXPECT_NE(g.find("1234.6 samples/s, 50000 tokens/s"), std::string::npos) << g;
    EXPECT_NE(g.find("  peak device allocated       1024.0 MiB"), std::string::npos) << g;
    EXPECT_EQ(g.find("WARNING"), std::string::npos) << g;

    // All iterations warm-up: the warning follows the title line.
    r.measured_iterations = 0;
    r.warning = "no measured iterations: all 3 iteration(s) run were warm-up";
    const std::string w = st::format_summary_table(r);
    EXPECT_EQ(w.rfind("summary over 0 measured iterations (5 warm-up excluded), 2 rank(s)\n"
                      "  WARNING: no measured iterations: all 3 iteration(s) run were warm-up\n"
                      "  phase ",
                      0),
              0u)
        << w;
}
