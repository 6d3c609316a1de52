// Memory counters sampled once per iteration: host resident set (current and peak) and, on CUDA,
// the caching allocator's allocated/reserved bytes (current and peak) for this rank's device.
#pragma once

#include <cstdint>

namespace trainscope::prof {

struct MemorySample {
    double host_rss_bytes = 0;
    double host_peak_rss_bytes = 0;
    // NaN on CPU runs: the counters do not exist there (not zero, which would read as "measured").
    double device_allocated_bytes;
    double device_allocated_peak_bytes;
    double device_reserved_bytes;
    double device_reserved_peak_bytes;
};

// `cuda_device` < 0 means no CUDA device.
MemorySample sample_memory(int cuda_device);

} // namespace trainscope::prof
