// Session: one trainscope job on this rank, orchestration and run-file metadata only. Validates the
// configuration against the world (collectively, so every rank reports the same error), resolves
// the environment every workload shares (batch layout, threads, device, precision), creates the
// workload, owns the run file and the checkpointer, and hands the run to the workload.
// app/main.cpp drives it step by step.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "trainscope/core/config.hpp"
#include "trainscope/distributed/topology.hpp"

namespace trainscope::train {

class Session {
  public:
    Session(const core::CommandLine& cli, const dist::Topology& topo, MPI_Comm world);
    ~Session();

    std::string plan_text() const; // --dry-run output (rank 0 prints it)
    // Collective: refuses to overwrite unless output.overwrite. With --resume: finds and checks
    // the newest checkpoint and writes the continuation into <stem>.resume<k>.h5 when the
    // interrupted run's file is at output.file.
    void open_run_file();
    void prepare();           // collective: builds the workload (data, model, communicator)
    void run();               // collective: trains or measures, records, writes /summary
    bool interrupted() const; // after run(): a stop signal ended it early (checkpointed)
    void close_run_file(const std::string& status, const std::string& error = ""); // collective
    bool run_file_open() const;
    // --resume failed before the checkpoint's state was restored (the checkpoint was refused):
    // the continuation file holds nothing, so discard_run_file() (collective) closes and removes
    // it instead of keeping a "failed" file.
    bool refused_resume() const;
    void discard_run_file();

  private:
    struct State;
    std::unique_ptr<State> s_;
};

} // namespace trainscope::train
