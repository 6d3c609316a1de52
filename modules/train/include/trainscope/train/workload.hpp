// Workload: what a run does, behind one interface with three implementations (cv: MobileNetV2
// image classification; llm: Llama fine-tuning; comm: the communication benchmark), created by
// one factory. Each owns its options, its checks, its plan (the --dry-run text and the /plan
// attributes) and its build; training workloads hand the TrainingLoop a TrainStep. The run.workload
// and run.strategy strings are parsed here, once, into enums: nothing else compares them.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainscope/core/config.hpp"
#include "trainscope/distributed/device.hpp"
#include "trainscope/distributed/options.hpp"
#include "trainscope/distributed/topology.hpp"
#include "trainscope/io/run_file.hpp"
#include "trainscope/train/checkpoint.hpp"
#include "trainscope/train/options.hpp"
#include "trainscope/train/parallel_layout.hpp"
#include "trainscope/train/precision.hpp"
#include "trainscope/train/recorder.hpp"
#include "trainscope/train/run_control.hpp"

namespace trainscope::dist {
class Communicator;
}

namespace trainscope::train {

class TrainStep;

enum class WorkloadKind { Cv, Llm, Comm };
WorkloadKind parse_workload(const std::string& name); // ConfigError for anything else
const char* to_string(WorkloadKind k);

// What the Session resolved before a workload is built, the same for every workload. Owned by the
// Session; workloads keep a reference.
struct RunEnvironment {
    core::Config cfg;
    dist::Topology topo;
    MPI_Comm world = MPI_COMM_NULL;
    TrainConfig train;     // train.*, run.seed, profile.accounting, read once
    ParallelLayout layout; // strategy, dist.zero, stages, replicas, batch: read it, never cfg
    dist::DistOptions dist;
    dist::DeviceBinding device;
    std::string precision; // the run.precision name the policy was resolved from
    PrecisionPolicy policy;
    int threads_per_rank = 1;
    std::vector<std::string> devices; // per rank on rank 0 (the plan): "cuda:0 (NVIDIA H100)"
    bool dry_run = false;
    std::optional<CheckpointManifest> resumed; // --resume: the checkpoint to continue from
};

class Workload {
  public:
    virtual ~Workload();
    virtual WorkloadKind kind() const = 0;

    // Before the environment exists (inside the Session's collective error agreement):
    // the run.precision this workload runs (LLM: bf16 unless set, torchtune's default) and the
    // layout parameters it needs.
    virtual std::string precision() const;
    virtual int pipeline_stages() const { return 1; }
    virtual bool sharded_data() const { return true; }
    virtual std::int64_t gradient_accumulation() const { return 1; }
    // Checks that need the bound device and the layout; ConfigError names the options.
    virtual void check(const RunEnvironment&) {}

    // Collective: loads data, builds the model and the communicator. On a dry run only what the
    // plan needs (never the model's weights).
    virtual void build() = 0;
    virtual std::string plan_text() const = 0;                      // --dry-run output
    virtual std::vector<io::Attribute> plan_attributes() const = 0; // /plan
    // Collective, before the run file is created: files the workload will write beside
    // `run_file` (LoRA adapters) are refused like the run file when they exist.
    virtual void claim_outputs(const std::string& /*run_file*/) {}

    // Collective: runs to the end (or a stop signal) and writes its results into `file`. The
    // default runs the training harness around train_step(): phase timer, telemetry, profiler
    // window, Recorder, RunControl and the TrainingLoop, then /summary.
    virtual void run(io::RunFile& file, Checkpointer* checkpointer);
    bool interrupted() const { return interrupted_; }

  protected:
    explicit Workload(const RunEnvironment& env) : env_(env) {}
    // Training workloads: the step, the Recorder's extra columns, the gradient buckets' bytes
    // (/comm/buckets), what /summary needs, the log line that opens the run, and what to do when
    // training ended (e.g. write the adapters).
    virtual TrainStep* train_step() { return nullptr; }
    virtual dist::Communicator* communicator() = 0; // the run's (world) communicator
    // Other communicators the run's collectives use (the pipeline's pipe and data-parallel
    // groups), which the watchdog polls for asynchronous failures beside communicator().
    virtual std::vector<dist::Communicator*> side_communicators() { return {}; }
    virtual std::vector<io::Column> extra_columns() const { return {}; }
    virtual std::vector<std::size_t> bucket_bytes() const { return {}; }
    virtual void describe_run(Recorder::RunInfo&) const {}
    virtual std::string start_message(const std::string& file) const = 0;
    virtual void after_training(io::RunFile&) {}
    virtual int ranks_per_replica() const { return 1; }
    // The plan's "ranks" line and one line per rank (host, device), for the --dry-run texts.
    std::string ranks_text() const;
    // Where batches are built, for the plan: pinned or pageable host memory, and whether
    // data.pin_memory=true was dropped (a CPU device has no use for pinned memory).
    std::string pinning_text(bool pinned) const;
    // dist.compress for the plan: the text ("uncompressed", "compressed to fp16", "PowerSGD rank
    // 2 from iteration 2, warm start") and the /plan attributes (compress, powersgd_*).
    std::string compression_text() const;
    std::vector<io::Attribute> compression_attributes() const;

    const RunEnvironment& env_;
    bool interrupted_ = false;
};

// The workload run.workload names, with its options parsed and checked against `env` (whose
// layout, device and policy are not resolved yet: see Session).
std::unique_ptr<Workload> make_workload(const RunEnvironment& env);
// dist.compress against the workload, strategy and precision (after Workload::check): a
// ConfigError naming the option, its value and the fix where it would do nothing (comm
// workload, run.strategy=dp) or could not work (powersgd with fp16-mixed's loss scaling).
void check_compression(const RunEnvironment& env, WorkloadKind kind);

// "12.3 MiB", for plans.
std::string mib(double bytes);

} // namespace trainscope::train
