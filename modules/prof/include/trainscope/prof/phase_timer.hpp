// Per-iteration phase times. The phase names are fixed (DESIGN.md): data, h2d, forward, backward,
// comm_wait, optimizer, control (what the harness does for itself: the non-finite check and the
// ranks' stop/checkpoint agreement), and step (the whole iteration). On CPU a steady clock times
// each phase on the spot; on GPU, CUDA events are recorded on the compute stream and resolved
// lazily (when the iteration is long past), so timing never adds a device synchronisation to the
// hot loop.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainscope/core/nvtx.hpp"

namespace trainscope::prof {

// The run clock: steady-clock seconds since one process-wide origin, fixed by the first call of
// either function. /iterations/t_start and /telemetry/t_s both use it, so they line up.
std::chrono::steady_clock::time_point run_clock_origin();
double run_clock_seconds();

enum class Phase { Data = 0, H2D, Forward, Backward, CommWait, Optimizer, Control, kCount };
constexpr std::size_t kNumPhases = static_cast<std::size_t>(Phase::kCount);
const char* phase_name(Phase p); // "data", "h2d", ...

// Seconds per phase plus the whole step (first phase start → last phase end).
struct PhaseTimes {
    std::int64_t iteration = 0;
    std::array<double, kNumPhases> seconds{}; // NaN for a phase that did not run
    double step_seconds = 0;
    double t_start = 0; // run clock seconds (run_clock_seconds()) at begin_iteration
};

// Device timestamps, implemented with a steady clock (CPU) or CUDA events on a stream (GPU).
class Clock;

class PhaseTimer {
  public:
    // `cuda_stream` is a cudaStream_t (or nullptr for the legacy default stream) when `cuda` is
    // true.
    explicit PhaseTimer(bool cuda = false, void* cuda_stream = nullptr);
    ~PhaseTimer();
    PhaseTimer(const PhaseTimer&) = delete;
    PhaseTimer& operator=(const PhaseTimer&) = delete;

    void begin_iteration(std::int64_t iteration);
    // A phase may start and stop several times in one iteration (gradient-accumulation
    // micro-batches); its time is the sum of its spans.
    void start(Phase p);
    void stop(Phase p);
    // Host-measured duration (e.g. comm_wait from the gradient synchronizer); replaces the phase.
    void set_host_seconds(Phase p, double seconds);
    void end_iteration();
    // Discards the current iteration (e.g. the loader turned out to be exhausted).
    void cancel_iteration();

    // Iterations whose times are known. On CPU every ended iteration; on GPU those whose last
    // event has completed, or all of them when `wait` is true (used at flush and at the end).
    std::vector<PhaseTimes> collect(bool wait);

    // The phase running now, or nullptr between phases. Safe to call from another thread (the
    // run's watchdog reports where a stalled iteration is stuck).
    const char* current_phase() const {
        const int p = current_phase_.load(std::memory_order_relaxed);
        return p < 0 ? nullptr : phase_name(static_cast<Phase>(p));
    }

  private:
    std::atomic<int> current_phase_{-1};
    struct Pending;
    void release(Pending& p);
    std::unique_ptr<Clock> clock_;
    std::deque<std::unique_ptr<Pending>> pending_;
    std::unique_ptr<Pending> current_;
    std::chrono::steady_clock::time_point origin_;
};

// RAII phase scope: timer.start(p) now, timer.stop(p) at scope exit, inside an NVTX range named
// after the phase (the range is opened first and closed last, so it encloses the timed span).
class PhaseScope {
  public:
    PhaseScope(PhaseTimer& t, Phase p) : range_(phase_name(p)), t_(t), p_(p) { t_.start(p_); }
    ~PhaseScope() { t_.stop(p_); }
    PhaseScope(const PhaseScope&) = delete;
    PhaseScope& operator=(const PhaseScope&) = delete;

  private:
    nvtx::ScopedRange range_;
    PhaseTimer& t_;
    Phase p_;
};

} // namespace trainscope::prof
