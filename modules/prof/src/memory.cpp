// Memory counters: /proc/self/status (VmRSS, VmHWM) on the host; LibTorch's CUDA caching
// allocator statistics and cudaMemGetInfo on the device.
#include "trainscope/prof/memory.hpp"

#include <fstream>
#include <limits>
#include <string>

#include "trainscope/core/build_config.hpp"
#if TRAINSCOPE_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace trainscope::prof {

MemorySample sample_memory(int cuda_device) {
    MemorySample s;
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
        s.device_active_bytes = static_cast<double>(stats.active_bytes[agg].current);
        s.device_active_peak_bytes = static_cast<double>(stats.active_bytes[agg].peak);
        s.device_alloc_retries = static_cast<double>(stats.num_alloc_retries);
        s.device_ooms = static_cast<double>(stats.num_ooms);
        // cudaMemGetInfo reports the current device: select ours for the call only.
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(cuda_device));
        std::size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
            s.device_free_bytes = static_cast<double>(free_b);
            s.device_total_bytes = static_cast<double>(total_b);
        } else {
            (void)cudaGetLastError(); // leave no sticky error for the next CUDA call to trip on
        }
    }
#else
    (void)cuda_device;
#endif
    return s;
}

double device_allocated_peak_bytes(int cuda_device) {
#if TRAINSCOPE_HAVE_CUDA
    if (cuda_device >= 0) {
        using c10::CachingAllocator::StatType;
        auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_device);
        return static_cast<double>(
            stats.allocated_bytes[static_cast<std::size_t>(StatType::AGGREGATE)].peak);
    }
#else
    (void)cuda_device;
#endif
    return std::numeric_limits<double>::quiet_NaN();
}

void reset_device_peaks(int cuda_device) {
#if TRAINSCOPE_HAVE_CUDA
    if (cuda_device >= 0)
        c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(cuda_device));
#else
    (void)cuda_device;
#endif
}

} // namespace trainscope::prof
