// TelemetrySampler: a background thread that samples host counters (process CPU utilisation, RSS,
// load average) and, through NVML loaded at run time, the rank's GPU (power, energy, utilisation,
// SM clock, temperature, memory, PCIe/NVLink throughput) every telemetry.interval_ms. Without NVML
// (no driver, CPU run) the host columns are still sampled and the file says why the GPU ones are
// NaN. Timestamps use the run clock (phase_timer.hpp), the clock of /iterations/t_start. The
// sampler hands its samples and cross-rank status over as plain data; train/run_file_tables.hpp
// writes them to /telemetry.
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trainscope/prof/telemetry_options.hpp"

namespace trainscope::prof {

// One sample; the order of the fields is the order of TelemetrySampler::columns(). GPU fields are
// NaN when NVML is unavailable or the device does not support the query.
struct TelemetrySample {
    double t_s = 0;         // run clock seconds
    double cpu_percent = 0; // process CPU time / wall time since the previous sample, % of a core
    double rss_bytes = 0;   // resident set size
    double load1 = 0;       // 1-minute load average of the node
    double power_w = 0;     // nvmlDeviceGetPowerUsage: averaged board power (1 s window on H100)
    double power_instant_w = 0;     // NVML field 186 (instant power), where the driver has it
    double energy_j = 0;            // energy counter minus its value at the first sample
    double gpu_util_percent = 0;    // % of the last period in which a kernel ran
    double mem_util_percent = 0;    // % of the last period in which device memory was read/written
    double sm_clock_mhz = 0;        // current SM clock
    double temperature_c = 0;       // GPU die temperature
    double gpu_mem_used_bytes = 0;  // device memory in use (all processes)
    double pcie_tx_bytes_per_s = 0; // PCIe throughput over NVML's ~20 ms window
    double pcie_rx_bytes_per_s = 0;
    double nvlink_tx_bytes_per_s = 0; // NVLink data throughput over all links since last sample
    double nvlink_rx_bytes_per_s = 0;
};

// One column of the telemetry table, e.g. {"power_w", "W"}.
struct TelemetryColumn {
    std::string name;
    std::string units;
};

// What the ranks' samplers could measure, agreed over a communicator (TelemetrySampler::status).
struct TelemetryStatus {
    bool gpu_available = false;  // every rank samples its GPU
    int gpu_available_ranks = 0; // ranks that do
    // "rank R: <why>" for the lowest rank R without GPU telemetry, "" when every rank has it.
    std::string reason;
    int interval_ms = 0;
    std::string gpu_name;          // this rank's NVML device name ("" when unavailable)
    std::string nvml_device_match; // this rank's: "pci_bus_id" | "index" | "" (unavailable)
};

class TelemetrySampler {
  public:
    // `cuda_device` is this rank's CUDA device index, or -1 on CPU; `pci_bus_id` (e.g.
    // "0000:3B:00.0", from /ranks) selects the NVML device, which is right even when
    // CUDA_VISIBLE_DEVICES renumbers devices; when empty or not found the NVML index cuda_device is
    // used. Loads NVML here (cheap), never throws for a missing or broken NVML.
    TelemetrySampler(const TelemetryOptions& options, int cuda_device,
                     const std::string& pci_bus_id);
    ~TelemetrySampler(); // stops the thread, shuts NVML down
    TelemetrySampler(const TelemetrySampler&) = delete;
    TelemetrySampler& operator=(const TelemetrySampler&) = delete;

    // Local. start() takes a first sample at once, then one every interval; stop() takes a last
    // one and joins, so the samples span [start, stop]. No-ops when telemetry.enabled is false.
    void start();
    void stop();

    bool enabled() const { return options_.enabled; }
    bool gpu_available() const { return gpu_available_; }
    // Why the GPU columns are NaN ("" when available), e.g. "libnvidia-ml.so.1 not loadable: ...".
    const std::string& gpu_unavailable_reason() const { return reason_; }
    // NVML's name of the sampled GPU ("" when unavailable).
    const std::string& gpu_name() const { return gpu_name_; }
    double started_at() const { return started_at_; } // run clock seconds; NaN before start()
    double stopped_at() const { return stopped_at_; }

    // Thread-safe copy of every sample taken so far.
    std::vector<TelemetrySample> samples() const;
    // GPU energy over [start, stop] (NVML counter difference) in J, or NaN without NVML energy.
    double energy_joules() const;
    // GPU energy between two run-clock times (e.g. the measured iterations' first t_start and last
    // end), interpolating the energy counter linearly between samples; NaN without NVML energy or
    // when [t0, t1] is not inside the sampled span.
    double energy_joules_between(double t0, double t1) const;

    // Columns of a sample with their units, in TelemetrySample's field order.
    static std::vector<TelemetryColumn> columns();
    // A sample's values in columns() order.
    static std::vector<double> values(const TelemetrySample& sample);

    // Local, thread-safe: the samples taken since the previous call (every sample at the first
    // call), so that each sample is handed over exactly once.
    std::vector<TelemetrySample> take_new_samples();

    // Collective over `comm`: whether every rank samples its GPU and, if not, why the lowest rank
    // without it does not (so a file says why on every run).
    TelemetryStatus status(MPI_Comm comm) const;

  private:
    struct Nvml;
    void run();
    TelemetrySample take_sample();

    TelemetryOptions options_;
    int cuda_device_;
    std::unique_ptr<Nvml> nvml_;
    bool gpu_available_ = false;
    std::string reason_;
    std::string gpu_name_;
    std::string device_match_; // "pci_bus_id" | "index"

    mutable std::mutex mutex_;
    std::condition_variable wake_;
    bool stop_requested_ = false;
    std::thread thread_;
    std::vector<TelemetrySample> samples_;
    std::size_t taken_ = 0; // samples already handed over by take_new_samples()
    double started_at_;
    double stopped_at_;

    // State of the previous sample, for rates (sampler thread only).
    double prev_t_ = -1;
    double prev_cpu_s_ = 0;
    double energy0_mj_ = -1;
    double prev_nvlink_tx_kib_ = -1, prev_nvlink_rx_kib_ = -1;
};

} // namespace trainscope::prof
