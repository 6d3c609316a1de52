// The torch-free MPI helpers every module shares, in one place: MPI_CHECK, the bounded wait for
// peers (dist.timeout), string broadcast, gather and allgather, the node's ranks and a file read
// once per node, the lowest failing rank's message, and agree_on_errors (every rank fails together
// with the same typed error, or none does). io, prof, dist and train use these instead of their own
// copies.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace trainscope::core {

// Throws DistributedError naming the call, MPI's own message and the place when code is not
// MPI_SUCCESS. Only meaningful on communicators whose error handler is MPI_ERRORS_RETURN (the
// default MPI_ERRORS_ARE_FATAL aborts before we could report).
void mpi_check(int code, const char* call, const char* file, int line);

// A wait on peers (dist.timeout, in seconds) ------------------------------------------------------
// A rank that waits for its peers inside a blocking MPI call waits forever when one of them is
// stopped (SIGSTOP, a hung file system, a swapping node) without dying: MPI notices dead processes,
// not stalled ones. So the waits of a training run have a deadline: the communicators' (see
// distributed/communicator.hpp), these helpers' (nonblocking calls completed by wait_for_peers) and
// the watchdog's for collective file writes (train/run_control.hpp).

// The message of a wait on peers that exceeded its limit: names the wait, dist.timeout and what to
// do. Shared with the watchdog, which bounds waits inside libraries (collective HDF5 writes).
std::string peer_timeout_message(const std::string& what, double timeout_s);

// Completes `request` (a nonblocking operation that peers must join) by polling MPI_Test, which is
// also what makes Open MPI progress it. The poll spins for the first 2 ms (a collective about to
// complete keeps its latency), then yields the core between polls, and after 20 ms sleeps 50 us
// growing to 250 us between polls, so a long wait for a late peer does not take a core from
// computation (~4000 wake-ups/s at most) and adds at most 250 us once the peer arrives (Open MPI
// progresses the operation only inside MPI_Test, on both sides).
// When timeout_s > 0 and the request is still pending after timeout_s seconds, throws
// PeerTimeoutError(peer_timeout_message(what, timeout_s)); the request stays pending (MPI cannot
// cancel a collective), so the communicator it belongs to cannot be used again: the caller lets
// the error end the job (main aborts the world, so no peer is left waiting either).
// timeout_s <= 0 waits without limit.
void wait_for_peers(MPI_Request& request, double timeout_s, const char* what);

// wait_for_peers for a request whose buffers `keep` owns: when the wait times out, a late peer may
// still make MPI write into (or read from) them, so `keep` is released on purpose and never freed
// (the job is being aborted). Allocate the buffers of a bounded nonblocking call this way, never
// on the stack.
template <class T>
void wait_for_peers(MPI_Request& request, std::unique_ptr<T>& keep, double timeout_s,
                    const char* what) {
    try {
        wait_for_peers(request, timeout_s, what);
    } catch (...) {
        (void)keep.release(); // leaked: see above
        throw;
    }
}

// Collective over comm: rank `root`'s string on every rank (any length: sent in pieces).
// timeout_s bounds the wait for the peers as in wait_for_peers (0: no limit).
std::string broadcast_string(MPI_Comm comm, const std::string& text, int root = 0,
                             double timeout_s = 0);
// Collective over comm: every rank's string, in rank order, on every rank.
std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& mine);
// Collective over comm: every rank's string, in rank order, on `root`; an empty vector elsewhere.
// For what only the root writes or prints (placement): O(N) memory on the root alone.
std::vector<std::string> gather_strings(MPI_Comm comm, const std::string& mine, int root = 0);
// Collective over comm: `bytes` bytes at `data` from `root` to every rank, in MPI_Bcast calls of
// at most 1 GiB (MPI counts are int).
void broadcast_bytes(MPI_Comm comm, void* data, std::size_t bytes, int root = 0);

// The ranks of one node -------------------------------------------------------------------------
// A node is what MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) groups: the identity
// dist::discover_topology numbers nodes by and /ranks records. The emulated nodes of
// tests/multinode (each started by its own Open MPI daemon under its own host name) are apart.
// Start-up and resume read a file once per node through it (read_file_on_node) instead of once
// per rank: at 16k ranks on 4k nodes, 4k opens of a weights file instead of 16k.
class NodeComm {
  public:
    explicit NodeComm(MPI_Comm comm); // collective over comm
    ~NodeComm();                      // MPI_Comm_free
    NodeComm(const NodeComm&) = delete;
    NodeComm& operator=(const NodeComm&) = delete;
    MPI_Comm get() const { return comm_; }
    int rank() const { return rank_; } // local rank: 0 is the node's leader
    int size() const { return size_; }

  private:
    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0, size_ = 1;
};

// What a shared read of one file gave: its bytes, or why it could not be read (the reader's
// strerror text); the same on every rank of the communicator.
struct SharedFile {
    std::string bytes;
    std::string error; // empty: read
};
// Local: the whole of `path` into `bytes` with one open(); "" or why not ("cannot open:
// <strerror>", "not a regular file": a FIFO or device is refused before reading).
std::string read_whole_file(const std::string& path, std::string& bytes);
// Collective over `comm` (a NodeComm's): rank `reader` alone opens and reads the whole of `path`;
// its verdict goes to every rank first, then the bytes (broadcast_string), so a missing or
// unreadable file is the same error everywhere and no rank waits for bytes that never come.
SharedFile read_file_on_node(MPI_Comm comm, const std::string& path, int reader = 0);
// Collective over comm, for a step that may fail on some ranks only: "" when local_error is empty
// on every rank, else the lowest failing rank's message (with " (on rank r)" when r > 0) on all.
std::string first_failure(MPI_Comm comm, const std::string& local_error);

// Runs `fn` on every rank of `comm`, then agrees (one MPI_Allgather) on whether any rank threw.
// - nobody threw: returns normally;
// - this rank's wait for its peers timed out (PeerTimeoutError): rethrown at once, unmarked (the
//   peers cannot take part in an agreement);
// - this rank threw: rethrows its own error, marked collective (a std::exception that is not a
//   core::Error becomes a core::InternalError with the same message);
// - another rank threw: throws an error of the *same kind* as the lowest failing rank's (so every
//   rank exits with the same code), marked collective, whose message is
//   "rank k failed: <first line of rank k's message>" ("ranks 1, 3 failed; rank 1: ..." if
//   several).
// Use it around configuration, data and output checks, so that every rank can report and finalize
// MPI cleanly instead of one rank calling MPI_Abort. `fn` must not itself communicate in a way
// that a failing rank would skip. timeout_s bounds the agreement's wait for the peers as in
// wait_for_peers (0: no limit; pass dist.timeout where it is known, e.g. checkpoint writes).
void agree_on_errors(MPI_Comm comm, const std::function<void()>& fn, double timeout_s = 0);

} // namespace trainscope::core

#define MPI_CHECK(call) ::trainscope::core::mpi_check((call), #call, __FILE__, __LINE__)
