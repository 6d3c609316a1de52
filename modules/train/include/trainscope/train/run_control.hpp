// Run control: what keeps a job safe on a shared cluster. SIGTERM/SIGUSR1/SIGINT become a request
// to stop at the next iteration boundary (a second signal ends the process at once); a watchdog
// thread aborts the world when an iteration stalls, the communicator fails asynchronously or a
// wait for the peers inside a library (collective HDF5 writes) exceeds dist.timeout; and
// once per iteration all ranks agree, in one small allreduce, on non-finite values, stop requests
// and whether a checkpoint is due, so that every rank takes the same decision at the same step.
#pragma once

#include <mpi.h>
#include <torch/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trainscope/core/config.hpp"

namespace trainscope::dist {
class Communicator;
}
namespace trainscope::prof {
class PhaseTimer;
}

namespace trainscope::train {

// Process-wide signal handlers (installed once; async-signal-safe: they only store the signal).
// The first SIGTERM, SIGUSR1 (Slurm's --signal) or SIGINT is remembered; a second one of any of
// them calls _exit(128 + signal) at once, leaving the run file as last flushed (status running).
namespace stop_signals {
void install();
int received(); // the first signal's number, 0 when none arrived
} // namespace stop_signals

// Test hook (never set by users):
// TRAINSCOPE_FAULT="stall|nonfinite|checkpoint_stall|flush_stall:rank=R:iteration=I" makes rank R
// hang in the forward phase of iteration I, or turn its loss into NaN there, or hang half-way
// through writing its file of the checkpoint that resumes at iteration I (checkpoint.cpp), or hang
// before the first run-file flush that holds iteration I (so that its peers wait inside the
// collective HDF5 write), so that the watchdog, run.nonfinite, a crash during a checkpoint write
// and dist.timeout around collective I/O can be tested on real runs.
struct FaultInjection {
    enum class Kind {
        None,
        Stall,
        NonFinite,
        CheckpointStall,
        FlushStall,
        ResolveStall
    } kind = Kind::None;
    int rank = -1;
    std::int64_t iteration = -1;
    static FaultInjection from_environment(); // throws ConfigError on a malformed value
    bool fires(Kind k, int my_rank, std::int64_t it) const {
        return kind == k && rank == my_rank && iteration == it;
    }
};

struct RunControlOptions {
    double iteration_timeout_s = 1800; // 0: no watchdog
    double peer_timeout_s = 600;       // dist.timeout: bounds begin_peer_wait .. end_peer_wait
    bool skip_nonfinite = false;       // run.nonfinite=skip
    bool checkpointing = false;        // checkpoint.dir set
    std::int64_t checkpoint_every_iters = 0;
    double checkpoint_every_s = 0;
    // Parses checkpoint.every ("N" iterations, "Nmin" minutes) and the run.* options.
    static RunControlOptions from_config(const core::Config& c);
};

// What all ranks decided together for one iteration.
struct Verdict {
    bool nonfinite = false;  // some rank saw a NaN/Inf loss or gradient
    bool stop = false;       // some rank received a stop signal
    bool checkpoint = false; // write a checkpoint after this iteration's step
    int signal = 0;          // the signal behind `stop` (the largest number any rank saw)
};

class RunControl;

// A 0-d float64 device tensor, 1 when the loss (if defined) or some defined gradient holds a
// NaN/Inf, else 0; computed on the device (no host read). `sums` are further float64 sums to
// check (e.g. a sharded optimizer's gradient shard, see ZeroOptimizer/FsdpModel).
torch::Tensor nonfinite_flag(const torch::Tensor& loss, const std::vector<torch::Tensor>& params,
                             const std::vector<torch::Tensor>& sums = {});
// The collective NumericalError of run.nonfinite=abort (every rank decided it together).
// `found_after`: the last iteration trained when the flags were read (run.nonfinite=abort reads
// them with the deferred losses), or -1 when found at once.
[[noreturn]] void throw_nonfinite(std::int64_t iteration, std::int64_t found_after = -1);
// TRAINSCOPE_FAULT at this point of the forward phase: hangs, or makes `loss` NaN.
void inject_fault(const RunControl& control, std::int64_t iteration, torch::Tensor& loss);
// TRAINSCOPE_FAULT=flush_stall at a run-file flush holding iterations up to `last_iteration`.
void inject_flush_fault(const RunControl& control, std::int64_t last_iteration);
// resolve_stall: the rank hangs in the loss resolution after the bounded synchronize, before the
// collectives that follow it (their peers must still end within dist.timeout).
void inject_resolve_fault(const RunControl& control, std::int64_t last_iteration);

class RunControl {
  public:
    // RAII for begin_peer_wait/end_peer_wait; a null control does nothing.
    class PeerWait {
      public:
        PeerWait(RunControl* control, const char* what) : control_(control) {
            if (control_) control_->begin_peer_wait(what);
        }
        ~PeerWait() {
            if (control_) control_->end_peer_wait();
        }
        PeerWait(const PeerWait&) = delete;
        PeerWait& operator=(const PeerWait&) = delete;

      private:
        RunControl* control_;
    };

    // timer: where the watchdog reads the current phase (may be null); comm: polled for
    // asynchronous failures (may be null), as are `others` (the pipeline's groups: a failure on
    // one would otherwise show only as a timeout of what waits for it, or never without
    // dist.timeout). Starts the watchdog thread when a timeout is set or a communicator given.
    RunControl(const RunControlOptions& options, MPI_Comm world, const prof::PhaseTimer* timer,
               dist::Communicator* comm, std::vector<dist::Communicator*> others = {});
    ~RunControl();
    RunControl(const RunControl&) = delete;
    RunControl& operator=(const RunControl&) = delete;

    const RunControlOptions& options() const { return o_; }
    const FaultInjection& fault() const { return fault_; }
    int rank() const { return rank_; }

    // Watchdog: an iteration starts / some other bounded activity starts ("evaluation",
    // "checkpoint") / nothing is being timed.
    void begin_iteration(std::int64_t iteration);
    void begin_activity(const char* what);
    void idle();

    // A wait for the peers inside a library that has no deadline of its own (the collective HDF5
    // writes of a run-file flush wait inside MPI-IO for every rank): the watchdog ends the job
    // (exit 5) when it lasts longer than dist.timeout, naming `what` (a literal: it must outlive
    // the wait). Independent of the iteration clock; not nested.
    void begin_peer_wait(const char* what);
    void end_peer_wait();

    // Collective over the world, once per iteration after the gradients are final and before the
    // optimizer step: one MPI_Allreduce (max) of this rank's flags.
    Verdict agree(std::int64_t iteration, bool local_nonfinite);
    // A checkpoint was written now (restarts the checkpoint.every clock).
    void checkpoint_written();

  private:
    void watch();
    [[noreturn]] void abort_world(const std::string& why);

    RunControlOptions o_;
    MPI_Comm world_;
    int rank_ = 0, size_ = 1;
    const prof::PhaseTimer* timer_;
    dist::Communicator* comm_;
    std::vector<dist::Communicator*> polled_; // comm_ and the others: the watchdog's polls
    FaultInjection fault_;
    std::chrono::steady_clock::time_point last_checkpoint_;

    std::mutex mutex_;
    std::condition_variable wake_;
    bool quit_ = false;
    bool armed_ = false;
    std::int64_t iteration_ = -1;
    std::string activity_; // "" inside an iteration
    std::chrono::steady_clock::time_point since_;
    const char* peer_wait_ = nullptr; // begin_peer_wait's `what` while one is open
    std::chrono::steady_clock::time_point peer_wait_since_;
    std::thread watchdog_;
};

} // namespace trainscope::train
