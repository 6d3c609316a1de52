// Recorder: the only writer of per-iteration series. Turns each iteration's phase times, loss,
// sample count and memory counters into one row of the run file's per-rank /iterations series (and
// its gradient buckets' timings into /comm/buckets), flushes collectively every
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
#include "trainscope/prof/telemetry.hpp"

namespace trainscope::train {

// The values of one iteration that are not phase times.
struct IterationValues {
    std::int64_t iteration = 0;
    std::int64_t epoch = 0;
    double loss = std::numeric_limits<double>::quiet_NaN(); // may be filled in later (GPU)
    double samples = 0;                                     // samples this rank processed
    double lr = 0;
    double comm_bytes = 0;        // bytes this rank reduced in gradient allreduces (as sent)
    double comm_collective_s = 0; // time inside those collectives, where they ran
    // dist.compress: what the same collectives would have sent uncompressed (= comm_bytes under
    // none), and PowerSGD's error-feedback norm on this rank (NaN for the other modes).
    double comm_uncompressed_bytes = 0;
    double comm_error_norm = std::numeric_limits<double>::quiet_NaN();
    // Model state held by this rank (the CPU counterpart of the device allocator figures).
    double parameter_bytes = 0, gradient_bytes = 0, optimizer_state_bytes = 0;
    prof::MemorySample memory;
    // Device allocator peak within the forward, backward and optimizer phases (the peak counter is
    // reset when each phase starts); NaN on CPU, where the allocator keeps no such counter.
    double forward_peak_bytes = std::numeric_limits<double>::quiet_NaN();
    double backward_peak_bytes = std::numeric_limits<double>::quiet_NaN();
    double optimizer_peak_bytes = std::numeric_limits<double>::quiet_NaN();
    // fp16-mixed: the loss scale used for this iteration's backward and whether the optimizer
    // step was skipped because a gradient was inf/NaN. Other precisions: scale NaN, skipped 0.
    double loss_scale = std::numeric_limits<double>::quiet_NaN();
    double step_skipped = 0;
    // 1 when run.nonfinite=skip dropped this iteration's step (NaN/Inf loss or gradient).
    double nonfinite_skipped = 0;
    // Device->host reads the harness made within this iteration (host_sync.hpp): on a GPU each is
    // a host synchronisation. 0 for an fp32/bf16 step under run.nonfinite=abort.
    double host_syncs = 0;
    // Token workloads: tokens this rank processed (non-padding) and those with a label (what the
    // loss averages over). NaN for image workloads.
    double tokens = std::numeric_limits<double>::quiet_NaN();
    double label_tokens = std::numeric_limits<double>::quiet_NaN();
    // The workload's own columns, in the order of the Recorder's extra_columns.
    std::vector<double> extra;
    // Per gradient bucket: the allreduce's own duration (s), launch order; a row of /comm/buckets
    // when the Recorder declared them (declare_buckets).
    std::vector<double> bucket_s;
};

struct EpochValues {
    std::int64_t epoch = 0;
    double epoch_s = 0;
    double train_loss = 0; // mean over this rank's iterations
    double val_loss = 0;   // over the whole test set, reduced across ranks
    double val_accuracy = 0;
    double samples = 0;
    double val_perplexity = std::numeric_limits<double>::quiet_NaN(); // exp(val_loss), LLM SFT
    double eval_s = std::numeric_limits<double>::quiet_NaN(); // evaluation (part of epoch_s)
};

class Recorder {
  public:
    // extra_columns: workload-specific /iterations columns after the common ones (LLM: padding,
    // sequence lengths, DPO rewards, memory by category, ...).
    // expected_iterations: the rows this run will record (0 = unknown), for the chunk size.
    Recorder(io::RunFile& file, MPI_Comm comm, prof::PhaseTimer& timer, int flush_every,
             int warmup_iters, std::vector<io::Column> extra_columns = {},
             std::int64_t expected_iterations = 0);

    void record_iteration(const IterationValues& v);
    // Collective: declares /comm/buckets (one column bucket_<k>_s per gradient bucket of the rank
    // with the most buckets, NaN where a rank has fewer; /comm/buckets/bytes: rank 0's payload per
    // bucket), filled from IterationValues::bucket_s. No-op when no rank has buckets.
    void declare_buckets(const std::vector<std::size_t>& bucket_bytes);
    // Values resolved after the fact (losses stay on the device until a flush).
    void set_loss(std::int64_t iteration, double loss);
    void set_extra(std::int64_t iteration, int column, double value);
    // The values of a recorded iteration not yet flushed (nullptr once flushed or never recorded),
    // for values resolved after the fact (TrainStep::resolve_accounting).
    IterationValues* pending_values(std::int64_t iteration);
    void record_epoch(const EpochValues& v);
    // True when the caller must resolve deferred values and call flush() now.
    bool flush_due() const;
    void flush(); // collective
    // What /summary needs beyond the recorded rows.
    struct RunInfo {
        double wall_seconds = 0;
        double global_batch = 0;    // samples per step over all ranks
        double macs_per_sample = 0; // forward multiply-accumulates (MFU)
        std::string device_name;    // for the MFU peak table ("cpu": none)
        std::string precision;
        const prof::TelemetrySampler* telemetry = nullptr; // energy, when NVML is there
        // Token workloads: training FLOPs per token (model FLOPs, recomputation excluded) for
        // MFU; 0 = use macs_per_sample.
        double flops_per_token = 0;
    };
    // Collective: flush, then write /summary and print its table on rank 0.
    void finish(const RunInfo& info);
    // Telemetry rows are appended at every flush, so a killed job keeps them too.
    void set_telemetry(prof::TelemetrySampler* telemetry) { telemetry_ = telemetry; }
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
    prof::TelemetrySampler* telemetry_ = nullptr;
    std::vector<double> step_seconds_; // this rank, measured iterations
    std::vector<double> t_start_;      // run-clock start of each of them
    std::vector<std::array<double, prof::kNumPhases>> phase_seconds_;
    std::vector<double> samples_;
    std::vector<double> tokens_; // this rank, measured iterations (NaN: not a token workload)
    std::size_t extra_count_ = 0;
    std::size_t buckets_ = 0;
    std::size_t chunk_rows_ = 8;
    double last_flush_s_ = 0; // the last flush's time, for the next row's flush_s
    EpochValues last_epoch_;
    bool have_epoch_ = false;
    double peak_rss_ = 0;
    double nonfinite_skipped_ = 0; // steps dropped by run.nonfinite=skip (same on every rank)
    double host_syncs_ = 0;        // this rank's host_syncs over the measured iterations
    double peak_device_ = std::numeric_limits<double>::quiet_NaN();
    double peak_tensor_ = std::numeric_limits<double>::quiet_NaN();
};

} // namespace trainscope::train
