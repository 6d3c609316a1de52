// Memory counters sampled once per iteration: host resident set (current and peak) and, on CUDA,
// the caching allocator's allocated/reserved/active bytes (current and peak), its retry and OOM
// counts, and the device's free/total memory as the driver sees it (other processes included).
#pragma once

#include <cstdint>
#include <limits>

namespace trainscope::prof {

struct MemorySample {
    static constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
    double host_rss_bytes = 0;
    double host_peak_rss_bytes = 0;
    // Device counters are NaN on CPU runs: they do not exist there (not zero, which would read as
    // "measured"). Peaks are since the process start or the last reset_device_peaks(); the
    // trainer resets them at every phase, so in /iterations they are peaks within the iteration.
    double device_allocated_bytes = kNaN;
    double device_allocated_peak_bytes = kNaN;
    double device_reserved_bytes = kNaN;
    double device_reserved_peak_bytes = kNaN;
    double device_active_bytes =
        kNaN; // allocated blocks not yet released back (incl. pending frees)
    double device_active_peak_bytes = kNaN;
    double device_alloc_retries = kNaN; // cudaMalloc retries after freeing cached blocks (count)
    double device_ooms = kNaN;          // out-of-memory errors the allocator raised (count)
    double device_free_bytes = kNaN;    // cudaMemGetInfo: free on the device
    double device_total_bytes = kNaN;   // cudaMemGetInfo: device capacity
};

// `cuda_device` < 0 means no CUDA device.
MemorySample sample_memory(int cuda_device);

// Only the allocator's allocated-bytes peak (no driver call): cheap enough to read at every phase
// boundary. NaN for cuda_device < 0 or a build without CUDA.
double device_allocated_peak_bytes(int cuda_device);

// Resets the caching allocator's peak counters of `cuda_device`, so the next sample's peaks cover
// only what ran in between (e.g. one phase). No-op for cuda_device < 0 or a build without CUDA.
void reset_device_peaks(int cuda_device);

} // namespace trainscope::prof
