// PhaseTimer: steady-clock timing on CPU, lazily resolved CUDA events on GPU.
#include "trainscope/prof/phase_timer.hpp"

#include <cmath>
#include <limits>

#include "trainscope/core/build_config.hpp"
#include "trainscope/core/error.hpp"
#if TRAINSCOPE_HAVE_CUDA
#include "trainscope/core/numeric.hpp"
#include <cuda_runtime_api.h>
#endif

namespace trainscope::prof {
namespace {
using core::kNaN;
}

std::chrono::steady_clock::time_point run_clock_origin() {
    static const std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();
    return origin;
}

double run_clock_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - run_clock_origin())
        .count();
}

const char* phase_name(Phase p) {
    static const char* names[] = {"data",      "h2d",       "forward", "backward",
                                  "comm_wait", "optimizer", "control"};
    return names[static_cast<std::size_t>(p)];
}

// A timestamp source: host clock readings, or CUDA events on one stream.
class Clock {
  public:
    virtual ~Clock() = default;
    virtual void* mark() = 0;                     // records a timestamp, returns its handle
    virtual bool ready(void* mark) = 0;           // has the timestamp been reached?
    virtual double seconds(void* a, void* b) = 0; // b - a; both ready
    virtual void release(void* mark) = 0;
};

namespace {
class HostClock : public Clock {
  public:
    void* mark() override {
        auto* t = new std::chrono::steady_clock::time_point(std::chrono::steady_clock::now());
        return t;
    }
    bool ready(void*) override { return true; }
    double seconds(void* a, void* b) override {
        auto* ta = static_cast<std::chrono::steady_clock::time_point*>(a);
        auto* tb = static_cast<std::chrono::steady_clock::time_point*>(b);
        return std::chrono::duration<double>(*tb - *ta).count();
    }
    void release(void* m) override {
        delete static_cast<std::chrono::steady_clock::time_point*>(m);
    }
};

#if TRAINSCOPE_HAVE_CUDA
void cuda_check(cudaError_t e, const char* what) {
    if (e != cudaSuccess)
        throw core::InternalError(std::string(what) + " failed: " + cudaGetErrorString(e));
}
class CudaEventClock : public Clock {
  public:
    explicit CudaEventClock(void* stream) : stream_(static_cast<cudaStream_t>(stream)) {}
    void* mark() override {
        cudaEvent_t ev;
        cuda_check(cudaEventCreate(&ev), "cudaEventCreate"); // default flags: timing enabled
        cuda_check(cudaEventRecord(ev, stream_), "cudaEventRecord");
        return ev;
    }
    bool ready(void* m) override {
        return cudaEventQuery(static_cast<cudaEvent_t>(m)) == cudaSuccess;
    }
    double seconds(void* a, void* b) override {
        cuda_check(cudaEventSynchronize(static_cast<cudaEvent_t>(b)), "cudaEventSynchronize");
        float ms = 0;
        cuda_check(
            cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a), static_cast<cudaEvent_t>(b)),
            "cudaEventElapsedTime");
        return ms * 1e-3;
    }
    void release(void* m) override { cudaEventDestroy(static_cast<cudaEvent_t>(m)); }

  private:
    cudaStream_t stream_;
};
#endif
} // namespace

struct PhaseTimer::Pending {
    std::int64_t iteration = 0;
    double t_start = 0;
    // Spans of each phase: usually one; several when a phase repeats inside one iteration (the
    // forward and backward of gradient-accumulation micro-batches). Their durations add up.
    std::array<std::vector<std::pair<void*, void*>>, kNumPhases> spans;
    std::array<double, kNumPhases> host_seconds;
    void* first = nullptr;
    void* last = nullptr;
    Pending() { host_seconds.fill(kNaN); }
};

PhaseTimer::PhaseTimer(bool cuda, void* cuda_stream) : origin_(run_clock_origin()) {
#if TRAINSCOPE_HAVE_CUDA
    if (cuda) clock_ = std::make_unique<CudaEventClock>(cuda_stream);
#else
    (void)cuda_stream;
    if (cuda)
        throw core::InternalError("PhaseTimer: CUDA timing requested in a build without CUDA");
#endif
    if (!clock_) clock_ = std::make_unique<HostClock>();
}

void PhaseTimer::release(Pending& p) {
    for (auto& phase : p.spans)
        for (auto& [b, e] : phase) {
            if (b) clock_->release(b);
            if (e) clock_->release(e);
        }
    if (p.first) clock_->release(p.first);
    if (p.last) clock_->release(p.last);
}

PhaseTimer::~PhaseTimer() {
    for (auto& p : pending_)
        release(*p);
    if (current_) release(*current_);
}

void PhaseTimer::cancel_iteration() {
    if (current_) release(*current_);
    current_.reset();
}

void PhaseTimer::begin_iteration(std::int64_t iteration) {
    if (current_) throw core::InternalError("PhaseTimer: begin_iteration twice without end");
    current_ = std::make_unique<Pending>();
    current_->iteration = iteration;
    current_->t_start =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - origin_).count();
    current_->first = clock_->mark();
}

void PhaseTimer::start(Phase p) {
    auto i = static_cast<std::size_t>(p);
    if (!current_ || (!current_->spans[i].empty() && !current_->spans[i].back().second))
        throw core::InternalError(std::string("PhaseTimer: bad start of phase ") + phase_name(p));
    current_->spans[i].emplace_back(clock_->mark(), nullptr);
    current_phase_.store(static_cast<int>(p), std::memory_order_relaxed);
}

void PhaseTimer::stop(Phase p) {
    auto i = static_cast<std::size_t>(p);
    if (!current_ || current_->spans[i].empty() || current_->spans[i].back().second)
        throw core::InternalError(std::string("PhaseTimer: bad stop of phase ") + phase_name(p));
    current_->spans[i].back().second = clock_->mark();
    current_phase_.store(-1, std::memory_order_relaxed);
}

void PhaseTimer::set_host_seconds(Phase p, double seconds) {
    if (!current_) throw core::InternalError("PhaseTimer: set_host_seconds outside an iteration");
    current_->host_seconds[static_cast<std::size_t>(p)] = seconds;
}

void PhaseTimer::end_iteration() {
    if (!current_) throw core::InternalError("PhaseTimer: end_iteration without begin");
    current_->last = clock_->mark();
    pending_.push_back(std::move(current_));
}

std::vector<PhaseTimes> PhaseTimer::collect(bool wait) {
    std::vector<PhaseTimes> out;
    while (!pending_.empty()) {
        Pending& p = *pending_.front();
        if (!wait && !clock_->ready(p.last)) break;
        PhaseTimes t;
        t.iteration = p.iteration;
        t.t_start = p.t_start;
        for (std::size_t i = 0; i < kNumPhases; ++i) {
            double sum = 0;
            bool complete = !p.spans[i].empty();
            for (auto& [b, e] : p.spans[i]) {
                if (b && e)
                    sum += clock_->seconds(b, e);
                else
                    complete = false;
                if (b) clock_->release(b);
                if (e) clock_->release(e);
            }
            p.spans[i].clear();
            if (!std::isnan(p.host_seconds[i]))
                t.seconds[i] = p.host_seconds[i];
            else
                t.seconds[i] = complete ? sum : kNaN;
        }
        t.step_seconds = clock_->seconds(p.first, p.last);
        clock_->release(p.first);
        clock_->release(p.last);
        out.push_back(t);
        pending_.pop_front();
    }
    return out;
}

} // namespace trainscope::prof
