// Per-rank summary of a profiler window as plain structs (train/run_file_tables.hpp writes them to
// /profile). Kept free of LibTorch: ProfilerWindow turns Kineto's events into ProfileEvents, and
// everything here (the categories, top-N tables and Holistic Trace Analysis' temporal breakdown)
// is plain arithmetic.
#pragma once

#include "trainscope/core/numeric.hpp"
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace trainscope::prof {

// What a profiler event is, decided once from Kineto's activity type (by enum symbol).
enum class EventKind {
    CpuOp,          // CPU operator (aten::*, autograd nodes such as ConvolutionBackward0)
    ProfilerStep,   // our ProfilerStep#N user scope
    UserAnnotation, // any other user scope
    Kernel,         // GPU kernel (NCCL kernels too: split off by name)
    Memcpy,         // GPU memcpy; direction from the name ("Memcpy HtoD (Pageable -> Device)")
    Memset,         // GPU memset
    CudaRuntime,    // host-side CUDA runtime call (cudaLaunchKernel, cudaMemcpyAsync, ...)
    CudaDriver,     // host-side CUDA driver call (cuLaunchKernel, ...)
    CudaSync,       // CUDA synchronization event (stream/event/context sync)
    Other,          // ignored by the summary
};

struct ProfileEvent {
    EventKind kind = EventKind::Other;
    std::string name;
    std::uint64_t thread = 0; // host thread of CPU-side events (nesting is per thread)
    std::int64_t start_ns = 0;
    std::int64_t end_ns = 0; // >= start_ns
};

using core::kNaN;

// Inclusive statistics of one category; durations in seconds.
struct CategoryStats {
    std::string name; // cpu_op, cpu_op_top_level, profiler_step, gpu_kernel, nccl_kernel,
                      // memcpy_htod|dtoh|dtod|other, memset, cuda_runtime:<call>,
                      // cuda_driver:<call>, cuda_sync, user_annotation
    std::int64_t count = 0;
    double total_s = 0;
    double min_s = 0;
    double max_s = 0;
};

// One row of the top-N operators or kernels, by total (inclusive) time.
struct TopEntry {
    std::string name;
    std::int64_t count = 0;
    double total_s = 0;
    double self_s = kNaN; // operators: total minus directly nested operators; kernels: NaN
};

// HTA's temporal breakdown over the window, from device intervals (kernels, memcpy, memset).
// compute + communication + memory + idle = span; communication and memory count only time not
// already counted as compute (resp. compute or communication). NaN when there is no device event.
struct TemporalBreakdown {
    std::int64_t gpu_kernels = 0; // kernel events seen (0 on CPU runs)
    std::int64_t gpu_events = 0;  // kernels + memcpy + memset
    double compute_s = kNaN;
    double communication_s = kNaN;
    double memory_s = kNaN;
    double idle_s = kNaN;
    double span_s = kNaN;        // last device end - first device start
    double overlap_ratio = kNaN; // time computing while communicating / time communicating
};

// HTA's kernel classes: communication (^nccl or contains ncclKernel), memory (Memcpy, Memset,
// dma) and compute (the rest).
enum class KernelClass { Compute, Communication, Memory };
KernelClass classify_kernel(const std::string& name);

TemporalBreakdown temporal_breakdown(const std::vector<ProfileEvent>& events);

// Whether a CUDA runtime call (by name) blocks the host until the device caught up: the explicit
// synchronisations (cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize) and the
// synchronous copies and sets (cudaMemcpy, cudaMemcpy2D/3D, cudaMemcpyToSymbol/FromSymbol,
// cudaMemset, cudaMemset2D/3D). `.item()` and `.cpu()` show as cudaMemcpyAsync followed by
// cudaStreamSynchronize, so each counts once. Asynchronous calls (cudaMemcpyAsync,
// cudaStreamWaitEvent, cudaEventQuery) do not count.
bool is_host_synchronising_call(const std::string& name);

struct ProfileSummary {
    // disabled | not_reached (the run ended before start_iter) | incomplete (ended inside the
    // window) | complete
    std::string status = "disabled";
    std::int64_t first_iteration = -1;
    std::int64_t iterations = 0;           // iterations inside the window
    double window_s = kNaN;                // host wall time from enabling to disabling the profiler
    std::vector<CategoryStats> categories; // sorted by name
    std::vector<TopEntry> top_ops;         // by total_s, descending, at most top_n
    std::vector<TopEntry> top_kernels;     // by total_s, descending, at most top_n
    TemporalBreakdown breakdown;
    // CUDA runtime calls in the window that blocked the host (is_host_synchronising_call); 0 on
    // CPU runs, which have no runtime events.
    std::int64_t host_sync_calls = 0;
    std::string trace_path; // this rank's Chrome trace, "" when not saved
};

// Categories, top-N tables and breakdown of one rank's events (status and window fields are left
// for the caller).
ProfileSummary summarise_events(const std::vector<ProfileEvent>& events, std::size_t top_n);

// "<dir>/<stem>.rank<R>.trace.json" beside run file `run_file_path`.
std::string trace_path_for(const std::string& run_file_path, int rank);

} // namespace trainscope::prof
