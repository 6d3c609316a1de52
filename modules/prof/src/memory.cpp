// Memory counters: /proc/self/status (VmRSS, VmHWM) on the host; LibTorch's CUDA caching
// allocator statistics on the device.
#include "trainscope/prof/memory.hpp"

#include <fstream>
#include <limits>
#include <string>

#include "trainscope/core/build_config.hpp"
#if TRAINSCOPE_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace trainscope::prof {

MemorySample sample_memory(int cuda_device) {
    constexpr double nan = std::numeric_limits<double>::quiet_NaN();
    MemorySample s{0, 0, nan, nan, nan, nan};
    std::ifstream status("/proc/self/status");
    std::string key;
    while (status >> key) {
        double kib = 0;
        if (key == "VmRSS:" && status >> kib)
            s.host_rss_bytes = kib * 1024;
        else if (key == "VmHWM:" && status >> kib)
            s.host_peak_rss_bytes = kib * 1024;
        status.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    }
#if TRAINSCOPE_HAVE_CUDA
    if (cuda_device >= 0) {
        using c10::CachingAllocator::StatType;
        auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_device);
        const auto agg = static_cast<std::size_t>(StatType::AGGREGATE);
        s.device_allocated_bytes = static_cast<double>(stats.allocated_bytes[agg].current);
        s.device_allocated_peak_bytes = static_cast<double>(stats.allocated_bytes[agg].peak);
        s.device_reserved_bytes = static_cast<double>(stats.reserved_bytes[agg].current);
        s.device_reserved_peak_bytes = static_cast<double>(stats.reserved_bytes[agg].peak);
    }
#else
    (void)cuda_device;
#endif
    return s;
}

} // namespace trainscope::prof
