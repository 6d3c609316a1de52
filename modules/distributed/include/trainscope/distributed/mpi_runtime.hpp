// MPI start-up and shut-down (RAII) and collective error agreement: the pieces every rank runs
// before anything else, so that a user error on one rank ends all ranks with one clear message.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>

#include "trainscope/core/mpi_util.hpp"

namespace trainscope::dist {

// The thread level trainscope asks MPI for: MPI_THREAD_SERIALIZED. The MPI communicator's progress
// thread calls MPI, but never at the same time as another thread (see communicator.cpp); with Open
// MPI, MPI_THREAD_MULTIPLE would add locking to every call and cost small collectives up to half
// their bandwidth.
// Open MPI charges every level above MPI_THREAD_SINGLE (measured: FUNNELED and SERIALIZED as much
// as MULTIPLE) about 0.17 us per small collective; so run.workload=comm, which needs no progress
// thread, runs at MPI_THREAD_SINGLE (see thread_level_for_workload).
inline constexpr int kMpiThreadLevel = MPI_THREAD_SERIALIZED;

// The level to request for a workload: MPI_THREAD_SINGLE for "comm", kMpiThreadLevel otherwise.
inline int thread_level_for_workload(const std::string& workload) {
    return workload == "comm" ? MPI_THREAD_SINGLE : kMpiThreadLevel;
}

// Initialises MPI requesting kMpiThreadLevel (the level actually provided is checked where it
// matters, see make_communicator). If MPI is already initialised (e.g. by a test main) it is left
// alone and not finalized here.
class MpiRuntime {
  public:
    MpiRuntime(int& argc, char**& argv, int thread_level = kMpiThreadLevel);
    ~MpiRuntime(); // MPI_Finalize unless abort() ran or someone else owns MPI
    MpiRuntime(const MpiRuntime&) = delete;
    MpiRuntime& operator=(const MpiRuntime&) = delete;

    int thread_level() const { return provided_; } // MPI_THREAD_SINGLE..MPI_THREAD_MULTIPLE
    // MPI_Abort(MPI_COMM_WORLD, code): ends every rank; for errors that not all ranks share.
    [[noreturn]] static void abort(int code);

  private:
    int provided_ = MPI_THREAD_SINGLE;
    bool owns_mpi_ = false;
};

// "MPI_THREAD_MULTIPLE" etc.
std::string thread_level_name(int level);
// First line of MPI_Get_library_version, e.g. "Open MPI v4.1.4, package: ...".
std::string mpi_library_version();

// Collective error agreement lives with the other torch-free MPI helpers in core (see
// trainscope/core/mpi_util.hpp); dist's callers keep their spelling.
using core::agree_on_errors;

} // namespace trainscope::dist
