// ProfilerWindow: LibTorch's Kineto profiler over iterations [start_iter, start_iter + iters), each
// inside a ProfilerStep#N user scope, summarised per rank (profile_summary.hpp); finish() hands the
// summary over and train/run_file_tables.hpp writes it to /profile. The trainer calls
// begin_iteration/end_iteration around every iteration; when profile.enabled is false both return
// at once. Profiler state is thread-local: operators run by the thread that calls begin_iteration
// (and autograd's device threads) are recorded, the data loader's worker threads are not.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "trainscope/prof/options.hpp"
#include "trainscope/prof/profile_summary.hpp"

namespace trainscope::prof {

class ProfilerWindow {
  public:
    // `backend` goes into the trace's distributedInfo metadata ("mpi", "nccl").
    ProfilerWindow(const ProfileOptions& options, int rank, int world_size, bool cuda,
                   std::string backend = "mpi");
    // Stops a still-running profiler (without summarising); never throws.
    ~ProfilerWindow();
    ProfilerWindow(const ProfilerWindow&) = delete;
    ProfilerWindow& operator=(const ProfilerWindow&) = delete;

    bool enabled() const { return options_.enabled; }
    const ProfileOptions& options() const { return options_; }
    int world_size() const { return world_size_; }
    // True between enabling and disabling the profiler.
    bool active() const;
    // True inside the window's last iteration: its end_iteration synchronises the device, which
    // the caller may first do itself with a bound (Communicator::synchronize: a stalled peer's
    // collectives would keep the device's queue from ever draining).
    bool in_last_iteration() const;

    // Enables the profiler when `iteration` == start_iter, then opens the ProfilerStep#<iteration>
    // scope for any iteration inside the window.
    void begin_iteration(std::int64_t iteration);
    // Closes the scope; after the window's last iteration synchronises the device (CUDA), adds the
    // distributed metadata, disables the profiler and keeps its result.
    void end_iteration(std::int64_t iteration);
    // The iteration begun last did not happen (e.g. the loader was exhausted): closes its scope
    // without counting it.
    void cancel_iteration();
    // Summary of this rank's window (computed once, after the window closed; a window never
    // reached or disabled gives status "not_reached"/"disabled" and empty tables).
    const ProfileSummary& summarise();

    // Local; call once the run is over. Ends a window the run did not finish (fewer iterations
    // than start_iter + iters), summarises it and, when profile.trace is set, saves this rank's
    // Chrome trace beside the run file `run_file_path` (trace_path_for; a failed save is logged
    // and leaves trace_path ""). Idempotent: the trace is saved once.
    const ProfileSummary& finish(const std::string& run_file_path);

  private:
    struct Kineto; // LibTorch state, only in the .cpp
    void stop();

    ProfileOptions options_;
    int rank_;
    int world_size_;
    bool cuda_;
    std::string backend_;
    std::unique_ptr<Kineto> kineto_;
    ProfileSummary summary_;
    bool summarised_ = false;
    bool trace_attempted_ = false;
};

} // namespace trainscope::prof
