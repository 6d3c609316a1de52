// Recorder: turns each iteration's phase times, loss, sample count and memory counters into one
// row of the run file's per-rank /iterations series, flushes collectively every
// output.flush_every iterations, and computes /summary at the end (medians over the measured
// iterations, throughput, imbalance across ranks).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "trainscope/io/run_file.hpp"
#include "trainscope/prof/memory.hpp"
#include "trainscope/prof/phase_timer.hpp"

namespace trainscope::train {

// The values of one iteration that are not phase times.
struct IterationValues {
    std::int64_t iteration = 0;
    std::int64_t epoch = 0;
    double loss = std::numeric_limits<double>::quiet_NaN(); // may be filled in later (GPU)
    double samples = 0;                                     // samples this rank processed
    double lr = 0;
    double comm_bytes = 0; // bytes this rank reduced in gradient allreduces
    prof::MemorySample memory;
};

struct EpochValues {
    std::int64_t epoch = 0;
    double epoch_s = 0;
    double train_loss = 0; // mean over this rank's iterations
    double val_loss = 0;   // over the whole test set, reduced across ranks
    double val_accuracy = 0;
    double samples = 0;
};

class Recorder {
  public:
    Recorder(io::RunFile& file, MPI_Comm comm, prof::PhaseTimer& timer, int flush_every,
             int warmup_iters);

    void record_iteration(const IterationValues& v);
    // Loss resolved after the fact (GPU runs keep the loss on the device until a flush).
    void set_loss(std::int64_t iteration, double loss);
    void record_epoch(const EpochValues& v);
    // True when the caller must resolve deferred values and call flush() now.
    bool flush_due() const;
    void flush(); // collective
    // Collective: flush, then write /summary. `global_batch` = samples per step over all ranks.
    void finish(double wall_seconds, double global_batch,
                const std::vector<std::pair<std::string, std::string>>& extra);
    std::int64_t recorded_iterations() const { return recorded_; }

  private:
    io::RunFile& file_;
    MPI_Comm comm_;
    prof::PhaseTimer& timer_;
    int flush_every_;
    int warmup_iters_;
    std::int64_t recorded_ = 0;
    std::int64_t since_flush_ = 0;
    std::map<std::int64_t, IterationValues> pending_; // waiting for their phase times
    std::vector<double> step_seconds_;                // this rank, measured iterations
    std::vector<std::array<double, prof::kNumPhases>> phase_seconds_;
    std::vector<double> samples_;
    EpochValues last_epoch_;
    bool have_epoch_ = false;
    double peak_rss_ = 0;
    double peak_device_ = std::numeric_limits<double>::quiet_NaN();
};

} // namespace trainscope::train
