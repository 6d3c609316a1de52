// ProfilerWindow on LibTorch's Kineto API (torch/csrc/autograd/profiler_kineto.h): prepare and
// enable with CPU (+ CUDA) activities, one ProfilerStep#N user scope per iteration, disable, and
// translate the events into ProfileEvents by activity-type symbol. API differences between
// LibTorch releases are guarded with TORCH_VERSION_MAJOR/MINOR.
#include "trainscope/prof/profiler_window.hpp"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdlib>
#include <torch/csrc/profiler/kineto_shim.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <chrono>
#include <exception>
#include <optional>
#include <set>
#include <utility>

#include "trainscope/core/log.hpp"

// KinetoEvent's timestamps became nanoseconds (startNs/durationNs); older releases have
// startUs/durationUs. The CUDA sync activity and ExperimentalConfig::enable_cuda_sync_events came
// with 2.2.
#define TRAINSCOPE_TORCH_AT_LEAST(major, minor)                                                    \
    (TORCH_VERSION_MAJOR > (major) ||                                                              \
     (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
#define TRAINSCOPE_KINETO_NS TRAINSCOPE_TORCH_AT_LEAST(2, 4)
#define TRAINSCOPE_KINETO_CUDA_SYNC TRAINSCOPE_TORCH_AT_LEAST(2, 2)

namespace trainscope::prof {

namespace kp = torch::autograd::profiler;

struct ProfilerWindow::Kineto {
    bool reached = false; // the window has started (it runs at most once)
    bool active = false;  // the profiler is on
    bool completed = false;
    std::int64_t first = -1;
    std::int64_t iterations = 0;
    std::string step_name; // outlives the scope that refers to it
    std::optional<at::RecordFunction> step;
    std::chrono::steady_clock::time_point t_enable;
    double window_s = kNaN;
    std::unique_ptr<kp::ProfilerResult> result;
    std::set<kp::ActivityType> activities;
    std::optional<torch::profiler::impl::ProfilerConfig> config;
};

namespace {

EventKind kind_of(const kp::KinetoEvent& e) {
    using libkineto::ActivityType;
    switch (static_cast<ActivityType>(e.activityType())) {
    case ActivityType::CPU_OP:
        return EventKind::CpuOp;
    case ActivityType::USER_ANNOTATION:
        return e.name().rfind("ProfilerStep#", 0) == 0 ? EventKind::ProfilerStep
                                                       : EventKind::UserAnnotation;
    case ActivityType::CONCURRENT_KERNEL:
        return EventKind::Kernel;
    case ActivityType::GPU_MEMCPY:
        return EventKind::Memcpy;
    case ActivityType::GPU_MEMSET:
        return EventKind::Memset;
    case ActivityType::CUDA_RUNTIME:
        return EventKind::CudaRuntime;
    case ActivityType::CUDA_DRIVER:
        return EventKind::CudaDriver;
#if TRAINSCOPE_KINETO_CUDA_SYNC
    case ActivityType::CUDA_SYNC:
        return EventKind::CudaSync;
#endif
    default:
        return EventKind::Other;
    }
}

std::vector<ProfileEvent> translate(const std::vector<kp::KinetoEvent>& events) {
    std::vector<ProfileEvent> out;
    out.reserve(events.size());
    for (const auto& e : events) {
        ProfileEvent p;
        p.kind = kind_of(e);
        if (p.kind == EventKind::Other) continue;
        p.name = e.name();
        p.thread = e.startThreadId();
#if TRAINSCOPE_KINETO_NS
        p.start_ns = static_cast<std::int64_t>(e.startNs());
        p.end_ns = p.start_ns + static_cast<std::int64_t>(e.durationNs());
#else
        p.start_ns = static_cast<std::int64_t>(e.startUs()) * 1000;
        p.end_ns = p.start_ns + static_cast<std::int64_t>(e.durationUs()) * 1000;
#endif
        out.push_back(std::move(p));
    }
    return out;
}

} // namespace

ProfilerWindow::ProfilerWindow(const ProfileOptions& options, int rank, int world_size, bool cuda,
                               std::string backend)
    : options_(options), rank_(rank), world_size_(world_size), cuda_(cuda),
      backend_(std::move(backend)), kineto_(std::make_unique<Kineto>()) {
    summary_.status = options_.enabled ? "not_reached" : "disabled";
    // Kineto logs stage markers and, without a CUDA driver, an "ERROR ... gpuGetDeviceCount" on
    // every rank of a CPU run: noise that looks like a failure. Silence it on CPU runs unless the
    // user chose a level (GPU runs keep Kineto's default, whose warnings matter there). Kineto
    // reads the variable when its logger first runs, at the first prepare.
    if (options_.enabled && !cuda_) ::setenv("KINETO_LOG_LEVEL", "6", /*overwrite=*/0);
}

ProfilerWindow::~ProfilerWindow() {
    try {
        if (kineto_ && kineto_->active) {
            kineto_->step.reset();
            kineto_->result = kp::disableProfiler();
        }
    } catch (...) {
        // Unwinding or shutting down: the profile is lost, nothing else to do.
    }
}

bool ProfilerWindow::active() const {
    return kineto_->active;
}

void ProfilerWindow::begin_iteration(std::int64_t iteration) {
    if (!options_.enabled) return;
    Kineto& k = *kineto_;
    k.step.reset(); // a begun iteration that was neither ended nor cancelled
    if (!k.reached && iteration >= options_.start_iter) {
        k.activities = {kp::ActivityType::CPU};
        torch::profiler::impl::ExperimentalConfig experimental;
        if (cuda_) {
            k.activities.insert(kp::ActivityType::CUDA);
#if TRAINSCOPE_KINETO_CUDA_SYNC
            experimental.enable_cuda_sync_events = true;
#endif
        }
        k.config.emplace(torch::profiler::impl::ProfilerState::KINETO,
                         /*report_input_shapes=*/false, /*profile_memory=*/false,
                         /*with_stack=*/false, /*with_flops=*/false, /*with_modules=*/false,
                         experimental);
        kp::prepareProfiler(*k.config, k.activities);
        kp::enableProfiler(*k.config, k.activities);
        // HTA and Perfetto read the rank from this entry ("rank": N, with the space).
        kp::addMetadataJson("distributedInfo",
                            "{\"backend\": \"" + backend_ +
                                "\", \"rank\": " + std::to_string(rank_) +
                                ", \"world_size\": " + std::to_string(world_size_) + "}");
        k.reached = true;
        k.active = true;
        k.first = iteration;
        k.t_enable = std::chrono::steady_clock::now();
    }
    if (!k.active) return;
    k.step_name = "ProfilerStep#" + std::to_string(iteration);
    k.step.emplace(at::RecordScope::USER_SCOPE);
    if (k.step->isActive()) k.step->before(k.step_name.c_str());
}

bool ProfilerWindow::in_last_iteration() const {
    return kineto_->active && kineto_->iterations + 1 >= options_.iters;
}

void ProfilerWindow::end_iteration(std::int64_t /*iteration*/) {
    Kineto& k = *kineto_;
    if (!k.active) return;
    k.step.reset(); // RecordFunction's destructor ends the scope
    ++k.iterations;
    if (k.iterations >= options_.iters) {
        k.completed = true;
        stop();
    }
}

void ProfilerWindow::cancel_iteration() {
    kineto_->step.reset();
}

void ProfilerWindow::stop() {
    Kineto& k = *kineto_;
    // Kernels still queued belong to the window: wait for them before the profiler stops.
    if (cuda_) torch::cuda::synchronize();
    k.window_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - k.t_enable).count();
    k.result = kp::disableProfiler();
    k.active = false;
}

const ProfileSummary& ProfilerWindow::summarise() {
    Kineto& k = *kineto_;
    if (summarised_ || k.active) return summary_;
    if (k.result) {
        summary_ = summarise_events(translate(k.result->events()),
                                    static_cast<std::size_t>(options_.top_n));
        summary_.status = k.completed ? "complete" : "incomplete";
        summary_.first_iteration = k.first;
        summary_.iterations = k.iterations;
        summary_.window_s = k.window_s;
    }
    summarised_ = true;
    return summary_;
}

const ProfileSummary& ProfilerWindow::finish(const std::string& run_file_path) {
    Kineto& k = *kineto_;
    if (k.active) {
        k.step.reset();
        stop();
    }
    summarise();
    if (options_.enabled && options_.trace && k.result && !trace_attempted_) {
        trace_attempted_ = true;
        const std::string path = trace_path_for(run_file_path, rank_);
        try {
            k.result->save(path);
            summary_.trace_path = path;
        } catch (const std::exception& e) {
            // A missing trace must not fail the run (the summary is in the file): say so.
            core::log::warn() << "profile.trace: could not save the Chrome trace to '" << path
                              << "': " << e.what();
        }
    }
    return summary_;
}

} // namespace trainscope::prof
