// TrainingLoop: the one training loop of every workload (torchtitan's Trainer.train shape). It owns
// everything per iteration except the step itself: the data phase, the learning rate, the
// harness's own work in its own `control` phase (non-finite check, the ranks' stop/checkpoint
// agreement), recording, deferred loss resolution, the progress line with ETA, checkpoints, stop
// signals and epochs. A workload plugs in through TrainStep: `step()` runs h2d, forward, backward
// and comm_wait, `apply()` the optimizer. Nothing the loop does for itself is timed as forward,
// backward, comm_wait or optimizer, and losses stay on the device until a flush or a progress
// line needs them (no host synchronisation per iteration just to record).
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "trainscope/prof/memory.hpp"
#include "trainscope/prof/phase_timer.hpp"
#include "trainscope/train/checkpoint.hpp"
#include "trainscope/train/lr_schedule.hpp"
#include "trainscope/train/options.hpp"
#include "trainscope/train/recorder.hpp"
#include "trainscope/train/run_control.hpp"

namespace trainscope::dist {
class Communicator;
}
namespace trainscope::prof {
class ProfilerWindow;
}

namespace trainscope::train {

// What one step (h2d .. comm_wait) produced on this rank.
struct StepResult {
    // Detached, on the device; read only when the loop resolves it (flush, progress line, epoch
    // end), all pending iterations at once.
    torch::Tensor loss;
    // Optional 1-D device tensor of workload values resolved with the loss (e.g. DPO rewards).
    torch::Tensor metrics;
    double samples = 0; // samples this rank processed (DPO: preference pairs)
    double tokens = std::numeric_limits<double>::quiet_NaN();
    double label_tokens = std::numeric_limits<double>::quiet_NaN();
    // Allocator peaks within forward and backward (NaN where not measured).
    double forward_peak = std::numeric_limits<double>::quiet_NaN();
    double backward_peak = std::numeric_limits<double>::quiet_NaN();
    double loss_scale = std::numeric_limits<double>::quiet_NaN(); // fp16-mixed: the scale used
    std::vector<double> extra; // the workload's host-known /iterations columns
};

// A step whose loss (and metrics) await resolution.
struct DeferredStep {
    std::int64_t iteration = 0, epoch = 0;
    torch::Tensor loss, metrics;
    // Filled by resolve(): the value this rank records, the value every rank of the job agrees
    // on (progress line, epoch mean; differs only where a rank has no loss of its own, e.g. the
    // first stages of a pipeline, which record NaN but show the last stage's), and the metrics.
    // run.nonfinite=abort: this rank's non-finite flag (see TrainStep::nonfinite_flag), read
    // with the loss; undefined when the iteration needs no deferred check.
    torch::Tensor nonfinite;
    double loss_value = std::numeric_limits<double>::quiet_NaN();
    double shared_loss = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> metric_values;
};

// The workload side of the loop. Phases the step runs itself are timed through `timer`.
class TrainStep {
  public:
    virtual ~TrainStep() = default;
    // The epoch's length; the run's (train.epochs, train.max_iters) and the learning rate by
    // iteration are the loop's (LoopOptions).
    virtual std::int64_t iterations_per_epoch() const = 0;
    virtual std::int64_t start_iteration() const { return 0; } // > 0 after a restore

    // Starts epoch `epoch` after `skip` of its iterations (a resumed run starts mid-epoch).
    virtual void begin_epoch(std::int64_t epoch, std::int64_t skip) = 0;
    // The data phase (timed by the loop): the next batch of the epoch; false when it is over.
    virtual bool next_batch() = 0;
    virtual void set_lr(double lr) = 0;
    // h2d, forward, backward, comm_wait for the current batch.
    virtual StepResult step(std::int64_t iteration, prof::PhaseTimer& timer,
                            RunControl* control) = 0;
    // Control phase: a 0-d device tensor, nonzero when this rank sees a NaN/Inf loss or gradient
    // that the run.nonfinite policy has to act on; undefined when the loss scaler handles
    // non-finite steps itself. Computed without a host read: the loop reads it at once only
    // under run.nonfinite=skip (the optimizer phase depends on it), else with the losses.
    virtual torch::Tensor nonfinite_flag(const StepResult& r) = 0;
    // Control phase, before the ranks' agreement: read the device values the optimizer phase
    // decides on (fp16-mixed: the loss scaler's inf/NaN verdict, and the scale the backward used
    // into r.loss_scale), after the communicator's bounded synchronize. Default: none.
    virtual void prepare_apply(StepResult& r) { (void)r; }
    // Optimizer phase. skip: no rank steps (run.nonfinite=skip). Returns whether the optimizer
    // stepped (the loss scaler may skip); writes the phase's allocator peak.
    virtual bool apply(bool skip, double& optimizer_peak) = 0;
    // After the iteration: communication and memory accounting into `v`, only what is known
    // without waiting for the device (durations the device still has to finish stay NaN).
    virtual void account(IterationValues& v) = 0;
    // At the loop's resolution point, after Communicator::synchronize, for every iteration still
    // pending in the Recorder: fills what account() left open (collective durations and exposed
    // waits), from handles kept since. Default: nothing deferred.
    virtual void resolve_accounting(std::int64_t iteration, IterationValues& v) {
        (void)iteration;
        (void)v;
    }
    // Collective: turns the deferred losses (and metrics) into values, all at once.
    virtual void resolve(std::vector<DeferredStep>& steps) = 0;
    // Indices into StepResult::extra (the Recorder's extra columns) where resolved metric values
    // go, in metric order.
    virtual std::vector<int> metric_columns() const { return {}; }
    // End of an epoch: validation loss and accuracy (NaN when the workload has none).
    virtual std::pair<double, double> evaluate() {
        return {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::quiet_NaN()};
    }
    virtual bool evaluates() const { return false; }
    // Whether exp(val_loss) is a perplexity (token-level cross-entropy: LLM SFT methods).
    virtual bool reports_perplexity() const { return false; }
    // Collective: writes the checkpoint that resumes at `next_iteration`; returns its directory.
    virtual std::string save_checkpoint(Checkpointer& checkpointer,
                                        std::int64_t next_iteration) = 0;
    // Workload values for the progress line (e.g. "  reward acc 0.62"), from resolved metrics.
    virtual std::string progress_suffix(const DeferredStep&) const { return ""; }
};

struct LoopOptions {
    int log_every = 20;
    // Data-parallel shards a sample counts once over (pipeline: the stages of a replica all see
    // the same batch), for the progress line's global throughput.
    int ranks_per_replica = 1;
    bool accounting = true;
    int cuda_index = -1;
    // The run length and the learning-rate schedule (TrainConfig): the loop sizes the run from
    // the step's epoch and sets the rate of every iteration.
    RunLength length;
    ScheduleConfig schedule;
    double base_lr = 0.1;
};

class TrainingLoop {
  public:
    // recorder, window, control, checkpointer may be null (tests, benchmarks). `comm` carries the
    // progress line's host counts.
    TrainingLoop(const LoopOptions& options, TrainStep& step, dist::Communicator& comm,
                 prof::PhaseTimer& timer, Recorder* recorder, prof::ProfilerWindow* window,
                 RunControl* control, Checkpointer* checkpointer);
    // Collective: trains to the end, a stop signal or an error; flushes the recorder at the end.
    void run();
    bool interrupted() const { return interrupted_; }

  private:
    // Collective: the deferred losses, metrics and non-finite flags of the pending iterations
    // (one synchronize, then host reads); a flag sets first_nonfinite_.
    void resolve_pending();
    // Collective: resolve, flush the recorder; then throws the run.nonfinite=abort error if a
    // resolved flag was set (the file holds every iteration trained until then).
    void flush();
    // resolve_pending, then flush() (which throws) if a non-finite iteration was found.
    void resolve_and_check();
    void progress_line(std::int64_t iteration, std::int64_t epoch);
    void checkpoint(std::int64_t next_iteration);

    LoopOptions o_;
    TrainStep& step_;
    std::int64_t total_ = 0; // iterations of the whole run
    LrSchedule schedule_;
    dist::Communicator& comm_;
    prof::PhaseTimer& timer_;
    Recorder* recorder_;
    prof::ProfilerWindow* window_;
    RunControl* control_;
    Checkpointer* checkpointer_;
    bool interrupted_ = false;

    std::vector<DeferredStep> pending_;
    DeferredStep last_resolved_;
    // run.nonfinite=abort: the first iteration whose resolved flag was set (-1: none), and the
    // last iteration trained when it was read.
    std::int64_t first_nonfinite_ = -1, nonfinite_found_after_ = -1;
    double epoch_loss_sum_ = 0;
    std::int64_t epoch_resolved_ = 0, current_epoch_ = -1;
    // Progress line: counts since the last line, and the clock.
    double samples_since_log_ = 0, tokens_since_log_ = 0;
    std::int64_t first_iteration_ = 0;
    std::chrono::steady_clock::time_point t_begin_, t_log_;
};

} // namespace trainscope::train
