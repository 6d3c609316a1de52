// TrainingLoop (see training_loop.hpp). One iteration:
//   data (loop) -> lr -> step: h2d, forward, backward, comm_wait (workload) -> control (loop:
//   the non-finite flag on the device, the reads the optimizer decides on, one host allreduce of
//   the stop/checkpoint/non-finite flags) -> optimizer (workload) -> record, progress,
//   checkpoint, stop (loop, outside the timed phases).
// Host syncs: a GPU step of an fp32/bf16/tf32 run under run.nonfinite=abort reads nothing from
// the device; the flag is read with the deferred losses. run.nonfinite=skip reads the flag and
// fp16-mixed the loss scaler's verdict once per iteration, in the control phase, after a
// synchronize bounded by dist.timeout. /iterations/host_syncs counts them (host_sync.hpp).
#include "trainscope/train/training_loop.hpp"

#include <chrono>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "trainscope/core/log.hpp"
#include "trainscope/core/numeric.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/prof/profiler_window.hpp"
#include "trainscope/train/checkpoint.hpp"
#include "trainscope/train/host_sync.hpp"

namespace trainscope::train {
namespace {

using core::kNaN;
using Clock = std::chrono::steady_clock;

std::string format_duration(double seconds) {
    if (!std::isfinite(seconds) || seconds < 0) return "?";
    auto s = static_cast<long long>(seconds + 0.5);
    std::ostringstream o;
    if (s >= 3600) o << s / 3600 << "h";
    if (s >= 60) o << (s % 3600) / 60 << "m";
    o << s % 60 << "s";
    return o.str();
}

} // namespace

TrainingLoop::TrainingLoop(const LoopOptions& options, TrainStep& step, dist::Communicator& comm,
                           prof::PhaseTimer& timer, Recorder* recorder,
                           prof::ProfilerWindow* window, RunControl* control,
                           Checkpointer* checkpointer)
    : o_(options), step_(step),
      total_(options.length.total_iterations(step.iterations_per_epoch())),
      schedule_(
          make_schedule(options.schedule, options.base_lr, total_, step.iterations_per_epoch())),
      comm_(comm), timer_(timer), recorder_(recorder), window_(window), control_(control),
      checkpointer_(checkpointer) {}

void TrainingLoop::resolve_pending() {
    if (pending_.empty()) return;
    comm_.synchronize("the loss resolution"); // NCCL: the host read below, bounded
    if (control_) inject_resolve_fault(*control_, pending_.back().iteration);
    if (recorder_) // collective durations: their events completed before the synchronize above
        for (const DeferredStep& d : pending_)
            if (IterationValues* v = recorder_->pending_values(d.iteration))
                step_.resolve_accounting(d.iteration, *v);
    step_.resolve(pending_);
    const std::vector<int> columns = step_.metric_columns();
    // run.nonfinite=abort: the flags of every rank in one allreduce (Max) and one read. Every
    // rank has the same iterations pending with the same flags defined, so this is collective.
    std::vector<torch::Tensor> flags;
    std::vector<std::int64_t> flagged;
    for (const DeferredStep& d : pending_)
        if (d.nonfinite.defined()) {
            flags.push_back(d.nonfinite.reshape({1}));
            flagged.push_back(d.iteration);
        }
    if (!flags.empty()) {
        torch::Tensor all = torch::cat(flags).to(torch::kFloat64); // [flagged]
        comm_.allreduce(all, dist::ReduceOp::Max);
        // Bounded by dist.timeout too: the allreduce started after the synchronize above.
        comm_.synchronize("the non-finite flags' allreduce");
        const torch::Tensor host = read_to_host(all);
        const double* f = host.data_ptr<double>();
        for (std::size_t k = 0; k < flagged.size(); ++k)
            if (f[k] != 0 && first_nonfinite_ < 0) {
                first_nonfinite_ = flagged[k];
                nonfinite_found_after_ = pending_.back().iteration;
            }
    }
    for (const DeferredStep& d : pending_) {
        if (recorder_) {
            recorder_->set_loss(d.iteration, d.loss_value);
            for (std::size_t k = 0; k < columns.size() && k < d.metric_values.size(); ++k)
                recorder_->set_extra(d.iteration, columns[k], d.metric_values[k]);
        }
        if (d.epoch == current_epoch_) {
            epoch_loss_sum_ += d.shared_loss;
            ++epoch_resolved_;
        }
    }
    last_resolved_ = pending_.back();
    pending_.clear();
}

void TrainingLoop::flush() {
    resolve_pending();
    if (recorder_) {
        if (control_) inject_flush_fault(*control_, last_resolved_.iteration);
        // Collective HDF5 writes wait inside MPI-IO for every rank, with no deadline of their own.
        RunControl::PeerWait wait(control_,
                                  "a run-file flush (collective HDF5 write of every rank)");
        recorder_->flush();
    }
    if (first_nonfinite_ >= 0) throw_nonfinite(first_nonfinite_, nonfinite_found_after_);
}

void TrainingLoop::resolve_and_check() {
    resolve_pending();
    if (first_nonfinite_ >= 0) flush(); // throws
}

void TrainingLoop::progress_line(std::int64_t iteration, std::int64_t epoch) {
    resolve_and_check();
    // Samples and tokens of every rank since the last line (a replica's stages count once).
    std::vector<double> counts = {samples_since_log_, tokens_since_log_};
    comm_.allreduce_host(counts, dist::ReduceOp::Sum);
    const auto now = Clock::now();
    const double dt = std::chrono::duration<double>(now - t_log_).count();
    const double elapsed = std::chrono::duration<double>(now - t_begin_).count();
    const std::int64_t total = total_;
    const double done = static_cast<double>(iteration - first_iteration_);
    const double eta = done > 0 ? elapsed / done * static_cast<double>(total - iteration) : kNaN;
    std::ostringstream line;
    line << "iter " << iteration << "/" << total << "  epoch " << epoch + 1 << "/"
         << o_.length.epochs << "  loss " << std::fixed << std::setprecision(4)
         << last_resolved_.shared_loss << "  lr " << std::scientific << std::setprecision(2)
         << schedule_.at(iteration - 1) << std::fixed << std::setprecision(1) << "  "
         << (dt > 0 ? counts[0] / o_.ranks_per_replica / dt : 0.0) << " samples/s";
    if (!std::isnan(counts[1]))
        line << std::setprecision(0) << "  " << counts[1] / dt << " tokens/s";
    line << "  ETA " << format_duration(eta) << step_.progress_suffix(last_resolved_);
    core::log::info() << line.str();
    t_log_ = now;
    samples_since_log_ = 0;
    tokens_since_log_ = 0;
}

void TrainingLoop::checkpoint(std::int64_t next_iteration) {
    flush(); // the file holds every iteration the checkpoint covers
    control_->begin_activity("checkpoint write");
    const auto t0 = Clock::now();
    comm_.synchronize("a checkpoint write"); // NCCL: the state's copy to the host, bounded
    const std::string dir = step_.save_checkpoint(*checkpointer_, next_iteration);
    control_->checkpoint_written();
    control_->idle();
    core::log::info() << "checkpoint " << dir << " (resumes at iteration " << next_iteration
                      << ", written in " << std::fixed << std::setprecision(2)
                      << std::chrono::duration<double>(Clock::now() - t0).count() << " s)";
}

void TrainingLoop::run() {
    const std::int64_t total = total_;
    const std::int64_t per_epoch = step_.iterations_per_epoch();
    std::int64_t iteration = step_.start_iteration();
    first_iteration_ = iteration;
    t_begin_ = t_log_ = Clock::now();
    const std::int64_t first_epoch = per_epoch > 0 ? iteration / per_epoch : 0;
    const bool checkpointing = checkpointer_ && checkpointer_->enabled();
    for (std::int64_t epoch = first_epoch;
         epoch < o_.length.epochs && iteration < total && !interrupted_; ++epoch) {
        const auto t_epoch = Clock::now();
        current_epoch_ = epoch;
        epoch_loss_sum_ = 0;
        epoch_resolved_ = 0;
        double epoch_samples = 0;
        step_.begin_epoch(epoch, epoch == first_epoch ? iteration - epoch * per_epoch : 0);

        while (iteration < total) {
            timer_.begin_iteration(iteration);
            if (o_.accounting) prof::begin_iteration_peaks(o_.cuda_index);
            const std::int64_t syncs_before = host_syncs();
            if (window_) window_->begin_iteration(iteration);
            if (control_) control_->begin_iteration(iteration);
            bool have_batch = false;
            {
                prof::PhaseScope p(timer_, prof::Phase::Data);
                have_batch = step_.next_batch();
            }
            if (!have_batch) {
                timer_.cancel_iteration(); // end of epoch: nothing was trained
                if (window_) window_->cancel_iteration();
                if (control_) control_->idle();
                break;
            }
            const double lr = schedule_.at(iteration);
            step_.set_lr(lr);
            StepResult r = step_.step(iteration, timer_, control_);

            // The harness's own work, never folded into the phases it measures.
            Verdict verdict;
            torch::Tensor deferred_flag; // run.nonfinite=abort: read with the loss
            if (control_) {
                prof::PhaseScope p(timer_, prof::Phase::Control);
                torch::Tensor flag = step_.nonfinite_flag(r);
                bool local_nonfinite = false;
                if (flag.defined() && control_->options().skip_nonfinite) {
                    comm_.synchronize("the non-finite check"); // NCCL: the read, bounded
                    local_nonfinite = read_scalar(flag) != 0;
                } else {
                    deferred_flag = flag;
                }
                step_.prepare_apply(r);
                verdict = control_->agree(iteration, local_nonfinite);
            } else {
                step_.prepare_apply(r);
            }
            double optimizer_peak = kNaN;
            bool stepped = true;
            {
                prof::PhaseScope p(timer_, prof::Phase::Optimizer);
                stepped = step_.apply(verdict.nonfinite, optimizer_peak);
            }
            timer_.end_iteration();
            if (window_ && window_->in_last_iteration())
                comm_.synchronize("the profiler window's last iteration");
            if (window_) window_->end_iteration(iteration);

            epoch_samples += r.samples;
            samples_since_log_ += r.samples;
            tokens_since_log_ += r.tokens; // NaN for image workloads: the line leaves tokens out
            if (recorder_) {
                IterationValues v;
                v.iteration = iteration;
                v.epoch = epoch;
                v.samples = r.samples;
                v.tokens = r.tokens;
                v.label_tokens = r.label_tokens;
                v.lr = lr;
                v.loss_scale = r.loss_scale;
                v.step_skipped = stepped ? 0.0 : 1.0;
                v.nonfinite_skipped = verdict.nonfinite ? 1.0 : 0.0;
                v.extra = std::move(r.extra);
                v.forward_peak_bytes = r.forward_peak;
                v.backward_peak_bytes = r.backward_peak;
                v.optimizer_peak_bytes = optimizer_peak;
                if (o_.accounting) {
                    step_.account(v); // its memory sample's *_peak_bytes: the iteration's peaks
                } else {
                    v.comm_bytes = v.comm_collective_s = kNaN;
                    v.comm_uncompressed_bytes = v.comm_error_norm = kNaN;
                    v.parameter_bytes = v.gradient_bytes = v.optimizer_state_bytes = kNaN;
                    v.memory.host_rss_bytes = v.memory.host_peak_rss_bytes = kNaN;
                }
                v.host_syncs = static_cast<double>(host_syncs() - syncs_before);
                recorder_->record_iteration(v);
            }
            pending_.push_back(
                {iteration, epoch, r.loss, r.metrics, deferred_flag, kNaN, kNaN, {}});
            if (recorder_ && recorder_->flush_due()) flush();
            ++iteration;

            if (o_.log_every > 0 && (iteration % o_.log_every == 0 || iteration == total))
                progress_line(iteration, epoch);
            if (control_) control_->idle();
            if (verdict.checkpoint && checkpointing) checkpoint(iteration);
            if (verdict.stop) {
                core::log::info() << "signal " << verdict.signal << " received: stopped after "
                                  << "iteration " << iteration - 1
                                  << (verdict.checkpoint && checkpointing
                                          ? " with a checkpoint"
                                          : " (no checkpoint.dir: nothing to resume from)");
                interrupted_ = true;
                break;
            }
        }
        if (interrupted_) break; // the epoch is incomplete: neither evaluated nor recorded

        resolve_and_check();
        EpochValues ev;
        ev.epoch = epoch;
        ev.samples = epoch_samples;
        ev.train_loss =
            epoch_resolved_ ? epoch_loss_sum_ / static_cast<double>(epoch_resolved_) : kNaN;
        ev.val_loss = ev.val_accuracy = kNaN;
        if (step_.evaluates()) {
            // Outside every iteration (no phase counts it); its own column, eval_s.
            const auto t_eval = Clock::now();
            if (control_) control_->begin_activity("evaluation");
            comm_.synchronize("the evaluation");
            std::tie(ev.val_loss, ev.val_accuracy) = step_.evaluate();
            if (control_) control_->idle();
            ev.eval_s = std::chrono::duration<double>(Clock::now() - t_eval).count();
            if (step_.reports_perplexity()) ev.val_perplexity = std::exp(ev.val_loss);
            std::ostringstream line;
            line << "epoch " << epoch + 1 << "/" << o_.length.epochs << "  train_loss "
                 << ev.train_loss << "  val_loss " << ev.val_loss;
            if (!std::isnan(ev.val_perplexity)) line << "  val_perplexity " << ev.val_perplexity;
            if (!std::isnan(ev.val_accuracy))
                line << "  val_accuracy " << std::setprecision(4) << 100.0 * ev.val_accuracy << "%";
            line << "  (" << std::setprecision(2) << ev.eval_s << " s)";
            core::log::info() << line.str();
        }
        ev.epoch_s = std::chrono::duration<double>(Clock::now() - t_epoch).count();
        if (recorder_) recorder_->record_epoch(ev);
    }
    flush();
}

} // namespace trainscope::train
