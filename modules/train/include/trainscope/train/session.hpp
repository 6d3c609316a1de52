// Session: one trainscope job on this rank. Validates the configuration against the world
// (collectively, so every rank reports the same error), binds the device, loads the data, builds
// the model and the communicator, prints the --dry-run plan, owns the run file and runs the
// workload. app/main.cpp drives it step by step.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "trainscope/core/config.hpp"
#include "trainscope/dist/topology.hpp"

namespace trainscope::train {

// What a run will do, computed before anything heavy: printed by --dry-run, stored in the file.
struct Plan {
    std::string workload, strategy, precision, device, backend;
    int world_size = 1, num_nodes = 1, threads_per_rank = 1;
    std::int64_t batch_per_rank = 0, global_batch = 0;
    std::int64_t train_samples = 0, test_samples = 0;
    std::int64_t samples_per_rank_per_epoch = 0, iterations_per_epoch = 0, total_iterations = 0;
    std::int64_t epochs = 0, image_size = 0, channels = 0, num_classes = 0;
    std::int64_t parameters = 0, macs_per_sample = 0;
    double bucket_mb = 0;
    double memory_estimate_bytes = 0; // params + grads + optimizer state + buckets + activations
    std::string dataset_description;
    int pipeline_stages = 0, pipeline_replicas = 0; // run.strategy=pipeline
    std::string pipeline_split;                     // describe(PipelinePlan), for --dry-run
    std::string llm_text; // run.workload=llm: the whole plan text (model, method, data, memory)
};

class Session {
  public:
    Session(const core::CommandLine& cli, const dist::Topology& topo, MPI_Comm world);
    ~Session();

    const Plan& plan() const;
    std::string plan_text() const; // --dry-run output (rank 0 prints it)
    // Collective: refuses to overwrite unless output.overwrite. With --resume: finds and checks
    // the newest checkpoint and writes the continuation into <stem>.resume<k>.h5 when the
    // interrupted run's file is at output.file.
    void open_run_file();
    void prepare();                // collective: loads data, builds model and communicator
    void run();                    // collective: trains, records, writes /summary
    bool interrupted() const;      // after run(): a stop signal ended it early (checkpointed)
    void close_run_file(const std::string& status, const std::string& error = ""); // collective
    bool run_file_open() const;

  private:
    struct State;
    std::unique_ptr<State> s_;
};

} // namespace trainscope::train
