// Memory counters: /proc/self/status (VmRSS, VmHWM) and a counting CPU tensor allocator on the
// host; LibTorch's CUDA caching allocator statistics and cudaMemGetInfo on the device.
#include "trainscope/prof/memory.hpp"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include "trainscope/core/log.hpp"

#include "trainscope/core/build_config.hpp"
#if TRAINSCOPE_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace trainscope::prof {

namespace {

// Each allocation carries its size in a 64-byte header in front of the data, so the data keeps
// c10's 64-byte alignment and the deleter (which only gets the data pointer) knows what to
// subtract. The data pointer doubles as the DataPtr context, which keeps raw_allocate working.
constexpr std::size_t kHeader = 64;
std::atomic<std::int64_t> g_live{0};
std::atomic<std::int64_t> g_peak{0};
std::atomic<bool> g_installed{false};

void raise_peak(std::int64_t now) {
    std::int64_t seen = g_peak.load(std::memory_order_relaxed);
    while (now > seen && !g_peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
}

void counted_free(void* data) {
    if (data == nullptr) return;
    char* base = static_cast<char*>(data) - kHeader;
    std::size_t n = 0;
    std::memcpy(&n, base, sizeof n);
    const auto bytes = static_cast<std::int64_t>(n);
    const std::int64_t now = g_live.fetch_sub(bytes, std::memory_order_relaxed) - bytes;
    if (c10::memoryProfilingEnabled())
        c10::reportMemoryUsageToProfiler(data, -bytes, static_cast<std::size_t>(now),
                                         static_cast<std::size_t>(now),
                                         c10::Device(c10::DeviceType::CPU));
    c10::free_cpu(base);
}

class CountingCpuAllocator final : public c10::Allocator {
  public:
    c10::DataPtr allocate(std::size_t n) override {
        const c10::Device cpu(c10::DeviceType::CPU);
        if (n == 0) return {nullptr, nullptr, &counted_free, cpu};
        char* base = static_cast<char*>(c10::alloc_cpu(n + kHeader)); // throws on OOM
        std::memcpy(base, &n, sizeof n);
        void* data = base + kHeader;
        const auto bytes = static_cast<std::int64_t>(n);
        const std::int64_t now = g_live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
        raise_peak(now);
        if (c10::memoryProfilingEnabled())
            c10::reportMemoryUsageToProfiler(data, bytes, static_cast<std::size_t>(now),
                                             static_cast<std::size_t>(now), cpu);
        return {data, data, &counted_free, cpu};
    }
    c10::DeleterFnPtr raw_deleter() const override { return &counted_free; }
    void copy_data(void* dest, const void* src, std::size_t count) const override {
        default_copy_data(dest, src, count);
    }
};

} // namespace

void install_host_tensor_counter() {
    static std::once_flag once;
    std::call_once(once, [] {
        // Never destroyed: tensors may be released during static destruction.
        static auto* counter = new CountingCpuAllocator();
        // Priority 1 wins over LibTorch's default CPU allocator (registered at 0).
        c10::SetCPUAllocator(counter, /*priority=*/1);
        if (c10::GetCPUAllocator() == counter) {
            g_installed.store(true);
        } else {
            core::log::warn() << "host tensor memory counter not installed: another CPU "
                                 "allocator has priority; host_tensor_* columns will be NaN";
        }
    });
}

std::string apply_host_memory_policy(HostMemoryPolicy policy) {
#if defined(__GLIBC__)
    if (policy == HostMemoryPolicy::Release) return "glibc malloc defaults";
    // Setting either threshold turns off glibc's dynamic mmap threshold, so both are set: the
    // mmap threshold at its maximum (glibc refuses more than 32 MiB on 64-bit), trimming off.
    constexpr int kMmapThreshold = 32 << 20;
    const bool ok = mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
                    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max()) == 1;
    if (!ok) return {};
    return "glibc malloc retains freed memory (mmap threshold 32 MiB, no trimming)";
#else
    (void)policy;
    return {};
#endif
}

bool host_tensor_counter_installed() {
    return g_installed.load();
}

HostTensorBytes host_tensor_bytes() {
    HostTensorBytes b;
    if (!g_installed.load(std::memory_order_relaxed)) return b;
    b.current = static_cast<double>(g_live.load(std::memory_order_relaxed));
    b.peak = static_cast<double>(g_peak.load(std::memory_order_relaxed));
    return b;
}

void reset_host_tensor_peak() {
    g_peak.store(g_live.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

namespace {

// The peaks of the current iteration window folded in at phase resets (begin_iteration_peaks,
// PhasePeak::begin); sample_memory reports the larger of these and the live counters.
struct FoldedPeaks {
    double device_allocated = MemorySample::kNaN;
    double device_reserved = MemorySample::kNaN;
    double device_active = MemorySample::kNaN;
    double host_tensor = MemorySample::kNaN;
};
std::mutex g_folded_mutex;
FoldedPeaks g_folded;

void raise(double& into, double value) {
    if (!std::isnan(value) && (std::isnan(into) || value > into)) into = value;
}

struct PeakCounters {
    double device_allocated = MemorySample::kNaN;
    double device_reserved = MemorySample::kNaN;
    double device_active = MemorySample::kNaN;
};

PeakCounters device_peaks(int cuda_device) {
    PeakCounters p;
#if TRAINSCOPE_HAVE_CUDA
    if (cuda_device >= 0) {
        using c10::CachingAllocator::StatType;
        auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_device);
        const auto agg = static_cast<std::size_t>(StatType::AGGREGATE);
        p.device_allocated = static_cast<double>(stats.allocated_bytes[agg].peak);
        p.device_reserved = static_cast<double>(stats.reserved_bytes[agg].peak);
        p.device_active = static_cast<double>(stats.active_bytes[agg].peak);
    }
#else
    (void)cuda_device;
#endif
    return p;
}

void reset_counters(int cuda_device) {
    reset_device_peaks(cuda_device);
    if (host_tensor_counter_installed()) reset_host_tensor_peak();
}

} // namespace

void begin_iteration_peaks(int cuda_device) {
    {
        std::lock_guard<std::mutex> lock(g_folded_mutex);
        g_folded = FoldedPeaks{};
    }
    reset_counters(cuda_device);
}

PhasePeak::PhasePeak(int cuda_device, bool enabled)
    : cuda_device_(cuda_device),
      enabled_(enabled && (cuda_device >= 0 || host_tensor_counter_installed())) {}

void PhasePeak::begin() const {
    if (!enabled_) return;
    // What ran since the last reset (the previous phase, or work between phases) stays in the
    // iteration's peaks.
    const PeakCounters d = device_peaks(cuda_device_);
    const double host = host_tensor_bytes().peak;
    {
        std::lock_guard<std::mutex> lock(g_folded_mutex);
        raise(g_folded.device_allocated, d.device_allocated);
        raise(g_folded.device_reserved, d.device_reserved);
        raise(g_folded.device_active, d.device_active);
        raise(g_folded.host_tensor, host);
    }
    reset_counters(cuda_device_);
}

void PhasePeak::end(double& slot) const {
    if (!enabled_) return;
    const double peak =
        cuda_device_ >= 0 ? device_allocated_peak_bytes(cuda_device_) : host_tensor_bytes().peak;
    if (std::isnan(slot) || peak > slot) slot = peak;
}

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
    const HostTensorBytes tensors = host_tensor_bytes();
    s.host_tensor_bytes = tensors.current;
    s.host_tensor_peak_bytes = tensors.peak;
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
    {
        std::lock_guard<std::mutex> lock(g_folded_mutex);
        if (!std::isnan(s.host_tensor_peak_bytes))
            raise(s.host_tensor_peak_bytes, g_folded.host_tensor);
        if (!std::isnan(s.device_allocated_peak_bytes)) {
            raise(s.device_allocated_peak_bytes, g_folded.device_allocated);
            raise(s.device_reserved_peak_bytes, g_folded.device_reserved);
            raise(s.device_active_peak_bytes, g_folded.device_active);
        }
    }
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
