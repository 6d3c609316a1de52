// Memory counters sampled once per iteration: host resident set (current and peak), the bytes of
// live LibTorch CPU tensors (current and peak, from trainscope's counting CPU allocator) and, on
// CUDA, the caching allocator's allocated/reserved/active bytes (current and peak), its retry and
// OOM counts, and the device's free/total memory as the driver sees it (other processes included).
#pragma once

#include <cstdint>
#include <limits>

namespace trainscope::prof {

struct MemorySample {
    static constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
    double host_rss_bytes = 0;
    double host_peak_rss_bytes = 0;
    // Bytes of live LibTorch CPU tensor storage: what the tensors hold, not what the C heap keeps
    // (RSS also counts freed memory glibc has not returned to the kernel). NaN until
    // install_host_tensor_counter() ran. Its peak follows the same rule as the device peaks.
    double host_tensor_bytes = kNaN;
    double host_tensor_peak_bytes = kNaN;
    // Device counters are NaN on CPU runs: they do not exist there (not zero, which would read as
    // "measured"). Every *_peak_bytes is the peak since the last begin_iteration_peaks() (the
    // training loop calls it at every iteration's start, so in /iterations they are iteration
    // peaks on both devices), or since the process start when it was never called. Phase resets
    // (PhasePeak) do not shorten them: what each phase saw is folded in before its reset.
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

// Resets the caching allocator's peak counters of `cuda_device` (allocated, reserved, active), so
// its next reading covers only what ran in between. No-op for cuda_device < 0 or a build without
// CUDA. Use begin_iteration_peaks / PhasePeak rather than this: a bare reset shortens the
// iteration peaks sample_memory reports.
void reset_device_peaks(int cuda_device);

// Starts a new peak window for sample_memory's *_peak_bytes: forgets the peaks folded so far and
// resets the counters (the device allocator's of `cuda_device`, when >= 0, and the host tensor
// counter's, when installed). Host-side only: no device synchronisation.
void begin_iteration_peaks(int cuda_device);

// Replaces LibTorch's default CPU allocator by one that allocates the same way (c10::alloc_cpu,
// 64-byte aligned) and counts the live bytes and their peak, like the CUDA caching allocator's
// allocated_bytes. Call once at start, before tensors are made: storage allocated before it is
// not counted (neither its allocation nor its release). Idempotent and thread-safe. Memory
// profiling events (the profiler's profile_memory) are still reported.
void install_host_tensor_counter();
bool host_tensor_counter_installed();

// How the C library's malloc treats freed host memory (run.host_memory). Retain: blocks up to
// 32 MiB come from the heap (glibc's largest mmap threshold) and the heap is never trimmed, so the
// tensors an iteration frees are reused by the next one instead of being returned to the kernel
// and page-faulted in again (28k minor faults, ~11 % of a 1-thread MobileNetV2 CPU step, measured
// in issue 15). Larger blocks are still mmapped. Release: glibc's defaults (dynamic mmap
// threshold from 128 KiB, heap trimmed above twice that). Returns a one-line description for the
// log, or an empty string where the policy is not available (not glibc: nothing is changed).
enum class HostMemoryPolicy { Retain, Release };
std::string apply_host_memory_policy(HostMemoryPolicy policy);

struct HostTensorBytes {
    double current = MemorySample::kNaN;
    double peak = MemorySample::kNaN;
};
// NaN in both fields when the counter is not installed.
HostTensorBytes host_tensor_bytes();
// Sets the peak to the current value, so the next reading's peak covers only what ran since.
void reset_host_tensor_peak();

// Peak memory of one phase: the device allocator's peak on CUDA, the host tensor counter's on CPU.
// begin() folds every peak counter reached so far into the iteration's peaks (sample_memory) and
// then resets the counters, on both devices; end() folds the phase's peak since begin() into a
// slot (max, so a phase that repeats within an iteration, e.g. per micro-batch, keeps its largest
// peak). Disabled (slots stay NaN) when accounting is off or, on CPU, when the counter is not
// installed.
class PhasePeak {
  public:
    PhasePeak(int cuda_device, bool enabled);
    void begin() const;
    void end(double& slot) const;
    bool enabled() const { return enabled_; }

  private:
    int cuda_device_;
    bool enabled_;
};

} // namespace trainscope::prof
