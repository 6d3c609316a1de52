// The torch-free MPI helpers every module shares, in one place: MPI_CHECK, string broadcast and
// allgather, the lowest failing rank's message, and agree_on_errors (every rank fails together
// with the same typed error, or none does). io, prof, dist and train use these instead of their
// own copies.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

namespace trainscope::core {

// Throws DistributedError naming the call, MPI's own message and the place when code is not
// MPI_SUCCESS. Only meaningful on communicators whose error handler is MPI_ERRORS_RETURN (the
// default MPI_ERRORS_ARE_FATAL aborts before we could report).
void mpi_check(int code, const char* call, const char* file, int line);

// Collective over comm: rank `root`'s string on every rank (any length: sent in pieces).
std::string broadcast_string(MPI_Comm comm, const std::string& text, int root = 0);
// Collective over comm: every rank's string, in rank order, on every rank.
std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& mine);
// Collective over comm, for a step that may fail on some ranks only: "" when local_error is empty
// on every rank, else the lowest failing rank's message (with " (on rank r)" when r > 0) on all.
std::string first_failure(MPI_Comm comm, const std::string& local_error);

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

} // namespace trainscope::core

#define MPI_CHECK(call) ::trainscope::core::mpi_check((call), #call, __FILE__, __LINE__)
