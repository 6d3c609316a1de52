// MPI start-up and shut-down (RAII) and collective error agreement: the pieces every rank runs
// before anything else, so that a user error on one rank ends all ranks with one clear message.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>

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

// Runs `fn` on every rank of `comm`, then agrees (one MPI_Allgather) on whether any rank threw.
// - nobody threw: returns normally;
// - this rank threw: rethrows its own error, marked collective (a std::exception that is not a
//   core::Error becomes a core::InternalError with the same message);
// - another rank threw: throws an error of the *same kind* as the lowest failing rank's (so every
//   rank exits with the same code), marked collective, whose message is
//   "rank k failed: <first line of rank k's message>" ("ranks 1, 3 failed; rank 1: ..." if
//   several).
// Use it around configuration, data and output checks, so that every rank can report and finalize
// MPI cleanly instead of one rank calling MPI_Abort. `fn` must not itself communicate in a way
// that a failing rank would skip.
void agree_on_errors(MPI_Comm comm, const std::function<void()>& fn);

} // namespace trainscope::dist
