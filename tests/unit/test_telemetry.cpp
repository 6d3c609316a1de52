// Serial tests of the telemetry sampler and the memory counters: without NVML the run goes on and
// says why; timestamps increase inside [start, stop] on the run clock; CPU utilisation follows a
// busy loop; with a fake NVML (fake_nvml.cpp) every GPU column has the right value and unit
// conversion and the energy is the counter difference.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/prof/memory.hpp"
#include "trainscope/prof/phase_timer.hpp"
#include "trainscope/prof/telemetry.hpp"

namespace prof = trainscope::prof;
namespace core = trainscope::core;

namespace {

prof::TelemetryOptions fast(const std::string& lib = "libtrainscope-test-no-such-nvml.so.1") {
    prof::TelemetryOptions o;
    o.interval_ms = 20;
    o.nvml_library = lib;
    return o;
}

void busy_for(double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    volatile double x = 0;
    while (std::chrono::steady_clock::now() < end)
        for (int i = 0; i < 1000; ++i)
            x = x + std::sqrt(static_cast<double>(i));
}

} // namespace

TEST(TelemetryOptions, DefaultsAndRange) {
    core::OptionRegistry r;
    prof::declare_telemetry_options(r);
    const auto o = prof::telemetry_options(core::Config::from_values(r, {}));
    EXPECT_TRUE(o.enabled);
    EXPECT_EQ(o.interval_ms, 500);
    const auto p = prof::telemetry_options(core::Config::from_values(
        r, {{"telemetry.enabled", "false"}, {"telemetry.interval_ms", "10"}}));
    EXPECT_FALSE(p.enabled);
    EXPECT_EQ(p.interval_ms, 10);
    try {
        r.validate("telemetry.interval_ms", "5");
        FAIL() << "interval 5 ms accepted";
    } catch (const core::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("telemetry.interval_ms"), std::string::npos)
            << e.what();
    }
}

TEST(TelemetrySampler, MissingNvmlIsRecordedAndHostColumnsStillSampled) {
    prof::TelemetrySampler s(fast(), /*cuda_device=*/0, "0000:3B:00.0");
    EXPECT_FALSE(s.gpu_available());
    EXPECT_NE(s.gpu_unavailable_reason().find("libtrainscope-test-no-such-nvml.so.1 not loadable"),
              std::string::npos)
        << s.gpu_unavailable_reason();
    s.start();
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    s.stop();
    const auto v = s.samples();
    ASSERT_GE(v.size(), 4u); // first + >= 2 periodic (150 ms / 20 ms, on a loaded machine) + last
    for (const auto& x : v) {
        EXPECT_GT(x.rss_bytes, 1e6);
        EXPECT_GE(x.load1, 0.0);
        EXPECT_TRUE(std::isnan(x.power_w));
        EXPECT_TRUE(std::isnan(x.energy_j));
        EXPECT_TRUE(std::isnan(x.gpu_util_percent));
        EXPECT_TRUE(std::isnan(x.nvlink_tx_bytes_per_s));
    }
    EXPECT_TRUE(std::isnan(s.energy_joules()));
    EXPECT_TRUE(std::isnan(s.energy_joules_between(v.front().t_s, v.back().t_s)));
}

TEST(TelemetrySampler, CpuRunAndLibraryWithoutNvmlSymbols) {
    prof::TelemetrySampler cpu(fast(), /*cuda_device=*/-1, "");
    EXPECT_FALSE(cpu.gpu_available());
    EXPECT_NE(cpu.gpu_unavailable_reason().find("CPU run"), std::string::npos);
    prof::TelemetrySampler libm(fast("libm.so.6"), 0, "");
    EXPECT_FALSE(libm.gpu_available());
    EXPECT_EQ(libm.gpu_unavailable_reason(),
              "nvmlInit_v2 not found in libm.so.6 (driver too old?)");
}

TEST(TelemetrySampler, TimestampsIncreaseInsideStartStopOnTheRunClock) {
    // A PhaseTimer iteration before and after the sampler: its t_start is on the same clock.
    prof::PhaseTimer timer;
    timer.begin_iteration(0);
    timer.end_iteration();
    prof::TelemetrySampler s(fast(), -1, "");
    s.start();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    s.stop();
    timer.begin_iteration(1);
    timer.end_iteration();
    const auto it = timer.collect(true);
    const auto v = s.samples();
    ASSERT_GE(v.size(), 3u);
    EXPECT_LE(it[0].t_start, s.started_at());
    EXPECT_LE(s.started_at(), v.front().t_s);
    for (std::size_t i = 1; i < v.size(); ++i)
        EXPECT_GT(v[i].t_s, v[i - 1].t_s) << "sample " << i;
    EXPECT_LE(v.back().t_s, s.stopped_at());
    EXPECT_LE(s.stopped_at(), it[1].t_start);
    EXPECT_NEAR(s.stopped_at() - s.started_at(), 0.1, 0.09);
    // Period: 20 ms between consecutive periodic samples (loose: shared CPUs).
    EXPECT_GE(v[2].t_s - v[1].t_s, 0.015);
}

TEST(TelemetrySampler, CpuPercentFollowsABusyThread) {
    prof::TelemetryOptions o = fast();
    o.interval_ms = 50;
    prof::TelemetrySampler s(o, -1, "");
    s.start();
    busy_for(0.4);
    s.stop();
    const auto v = s.samples();
    EXPECT_TRUE(std::isnan(v.front().cpu_percent)); // no interval before the first sample
    const double cores = std::max(1u, std::thread::hardware_concurrency());
    double peak = 0;
    for (std::size_t i = 1; i < v.size(); ++i) {
        EXPECT_GE(v[i].cpu_percent, 0.0);
        EXPECT_LE(v[i].cpu_percent, 100.0 * cores + 5.0); // + rounding of short intervals
        peak = std::max(peak, v[i].cpu_percent);
    }
    // One thread spinning: near 100 % of a core when it gets one; 30 % even on a crowded node.
    EXPECT_GT(peak, 30.0);
}

TEST(TelemetrySampler, DisabledDoesNothing) {
    prof::TelemetryOptions o = fast();
    o.enabled = false;
    prof::TelemetrySampler s(o, -1, "");
    s.start();
    s.stop();
    EXPECT_TRUE(s.samples().empty());
    EXPECT_TRUE(std::isnan(s.started_at()));
}

#ifdef TRAINSCOPE_FAKE_NVML
TEST(TelemetrySampler, FakeNvmlGivesEveryGpuColumnInSiUnits) {
    // Rates come from counter differences over an interval: a long one keeps scheduling jitter
    // (ctest runs two tests at a time on two cores) small against it.
    prof::TelemetryOptions o = fast(TRAINSCOPE_FAKE_NVML);
    o.interval_ms = 100;
    prof::TelemetrySampler s(o, 0, "0000:3B:00.0");
    ASSERT_TRUE(s.gpu_available()) << s.gpu_unavailable_reason();
    EXPECT_EQ(s.gpu_unavailable_reason(), "");
    EXPECT_EQ(s.gpu_name(), "NVIDIA H100 80GB HBM3");
    s.start();
    std::this_thread::sleep_for(std::chrono::milliseconds(450));
    s.stop();
    const auto v = s.samples();
    ASSERT_GE(v.size(), 3u);
    EXPECT_EQ(v.front().energy_j, 0.0); // counter difference from the first sample
    for (std::size_t i = 0; i < v.size(); ++i) {
        const auto& x = v[i];
        EXPECT_DOUBLE_EQ(x.power_w, 250.0);
        EXPECT_DOUBLE_EQ(x.power_instant_w, 260.0);
        EXPECT_DOUBLE_EQ(x.gpu_util_percent, 87.0);
        EXPECT_DOUBLE_EQ(x.mem_util_percent, 41.0);
        EXPECT_DOUBLE_EQ(x.sm_clock_mhz, 1980.0);
        EXPECT_DOUBLE_EQ(x.temperature_c, 61.0);
        EXPECT_DOUBLE_EQ(x.gpu_mem_used_bytes, 3.0 * (1ull << 30));
        EXPECT_DOUBLE_EQ(x.pcie_tx_bytes_per_s, 1e6);
        EXPECT_DOUBLE_EQ(x.pcie_rx_bytes_per_s, 2e6);
        if (i == 0) {
            EXPECT_TRUE(std::isnan(x.nvlink_tx_bytes_per_s));
        } else {
            // 1 GiB/s; the fake's clock and the sampler's are read a few microseconds apart.
            EXPECT_NEAR(x.nvlink_tx_bytes_per_s, 1073741824.0, 0.25 * 1073741824.0) << i;
            EXPECT_GE(x.energy_j, v[i - 1].energy_j);
        }
    }
    // 250 W over the sampled span (the fake's counter has 1 mJ steps).
    const double span = v.back().t_s - v.front().t_s;
    EXPECT_NEAR(s.energy_joules(), 250.0 * span, 0.01 * 250.0 * span + 0.002);
    const double t0 = v.front().t_s + 0.25 * span, t1 = v.front().t_s + 0.75 * span;
    EXPECT_NEAR(s.energy_joules_between(t0, t1), 250.0 * (t1 - t0), 0.02 * 250.0 * span);
    EXPECT_TRUE(std::isnan(s.energy_joules_between(v.front().t_s - 1, t1))); // outside the span
}

TEST(TelemetrySampler, FakeNvmlFallsBackToTheIndexForAnUnknownBusId) {
    prof::TelemetrySampler s(fast(TRAINSCOPE_FAKE_NVML), 0, "0000:AA:00.0");
    EXPECT_TRUE(s.gpu_available());
    prof::TelemetrySampler t(fast(TRAINSCOPE_FAKE_NVML), 3, "0000:AA:00.0");
    EXPECT_FALSE(t.gpu_available());
    EXPECT_NE(t.gpu_unavailable_reason().find("no NVML device for PCI bus id '0000:AA:00.0' or "
                                              "index 3: fake error"),
              std::string::npos)
        << t.gpu_unavailable_reason();
}
#endif

TEST(MemorySample, CpuRunHasHostCountersAndNaNDeviceCounters) {
    const prof::MemorySample m = prof::sample_memory(-1);
    EXPECT_GT(m.host_rss_bytes, 1e6);
    EXPECT_GE(m.host_peak_rss_bytes, m.host_rss_bytes);
    for (double d :
         {m.device_allocated_bytes, m.device_allocated_peak_bytes, m.device_reserved_bytes,
          m.device_reserved_peak_bytes, m.device_active_bytes, m.device_active_peak_bytes,
          m.device_alloc_retries, m.device_ooms, m.device_free_bytes, m.device_total_bytes})
        EXPECT_TRUE(std::isnan(d));
    prof::reset_device_peaks(-1); // no-op without a device
}
