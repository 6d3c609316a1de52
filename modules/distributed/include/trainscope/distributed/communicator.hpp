// Communicator: the collectives trainscope needs (allreduce, async allreduce, broadcast, allgather,
// reduce-scatter, barrier) over one group of ranks, with two backends: MPI for host tensors (a
// progress thread makes asynchronous allreduce really overlap) and NCCL for GPU tensors.
#pragma once

#include <mpi.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainscope/distributed/hierarchical_allreduce.hpp"

namespace trainscope::dist {

enum class ReduceOp { Sum, Average, Max, Min };
const char* to_string(ReduceOp op);

// Handle of an asynchronous collective.
class Work {
  public:
    virtual ~Work() = default;
    // MPI: blocks until the collective finished and its result is in the tensor; rethrows its
    // error; with a timeout (Communicator::set_timeout) gives up after it with
    // core::PeerTimeoutError. NCCL: makes the caller's current CUDA stream wait for it (no host
    // synchronisation), so work queued afterwards on that stream sees the result; the first
    // wait() also records where that stream reached the wait (for exposed_seconds).
    virtual void wait() = 0;
    virtual bool completed() = 0; // non-blocking query
    // Seconds the collective itself took where it ran, for communication accounting. MPI: from
    // its start to its end on the progress thread (time queued behind other collectives
    // excluded); blocks like wait() until then. NCCL: elapsed time between CUDA events recorded
    // around it on the communicator's stream; blocks the host (bounded by dist.timeout) until
    // the collective finished on the device, so resolve it late: the training loop does so at
    // its resolution point, after Communicator::synchronize, where it costs nothing. 0 for a
    // no-op.
    virtual double seconds() = 0;
    // The exposed wait: how long the waiter was held up by this collective at its first wait().
    // MPI: host seconds spent inside that wait() (the calling thread blocks). NCCL: the host
    // does not wait, the caller's stream does: exposed_wait_seconds(end - reached), with
    // `reached` an event recorded on the caller's stream at wait() and `end` the collective's
    // end event on the communicator's stream, i.e. how long that stream stalled. 0 before
    // wait() and for a no-op. Needs the collective finished, like seconds(): resolve it late.
    virtual double exposed_seconds() = 0;
};

// The exposed part of a wait, from the collective's end minus the moment the waiter reached the
// wait (seconds; negative when it had finished before): max(0, end_minus_reached_s).
inline double exposed_wait_seconds(double end_minus_reached_s) {
    return end_minus_reached_s > 0 ? end_minus_reached_s : 0.0;
}

// One operation of a point-to-point batch (Communicator::exchange; PyTorch's P2POp).
struct P2POp {
    enum class Kind { Send, Recv };
    Kind kind = Kind::Send;
    torch::Tensor tensor; // contiguous; Recv fills it in place
    int peer = 0;
};

// Cumulative accounting per collective kind. bytes = payload of the tensor given (for allgather the
// input, for reduce_scatter the output: the per-rank share, as nccl-tests count "size"). seconds =
// host time inside the collective call (MPI, measured on the thread that runs it) or launch time
// (NCCL, asynchronous: GPU time is the profiler's business). The MPI backend's blocking allreduce
// on host tensors counts calls and bytes but not seconds: two clock reads would cost a small
// allreduce a measurable share (time it around the call, as CommBenchmark does).
struct CommStats {
    std::uint64_t calls = 0, bytes = 0;
    double seconds = 0;
};

// All calls are collective over the communicator: every rank calls the same collectives in the same
// order with the same sizes (tensors of equal numel and dtype). Empty tensors are no-ops on every
// rank. In-place tensors must be contiguous.
class Communicator {
  public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual std::string backend() const = 0; // "mpi" | "nccl"
    // How allreduce (blocking, asynchronous and host) runs, for the run file (/plan@allreduce):
    // MPI "flat" or "hierarchical" (dist.allreduce resolved for this communicator's ranks, see
    // hierarchical_allreduce.hpp); NCCL "nccl" (NCCL's own algorithms, already node-aware).
    virtual std::string allreduce_algorithm() const { return backend(); }
    virtual torch::Device device() const = 0;

    // In place. Average divides the sum by size() (floating-point tensors only).
    virtual std::shared_ptr<Work> allreduce_async(torch::Tensor tensor, ReduceOp op) = 0;
    // Blocking allreduce. Default: allreduce_async + wait; the MPI backend runs it on the calling
    // thread instead (no hand-off to its progress thread, which costs microseconds per call).
    virtual void allreduce(const torch::Tensor& tensor, ReduceOp op);
    virtual void broadcast(torch::Tensor tensor, int root) = 0; // in place
    // out: size() * in.numel() elements, rank r's input at [r * in.numel(), (r+1) * in.numel()).
    virtual void allgather(const torch::Tensor& in, torch::Tensor out) = 0;
    // in: size() * out.numel() elements; rank r receives the reduction of block r. The split must
    // be exact (callers pad), as MPI_Reduce_scatter_block and ncclReduceScatter require.
    virtual void reduce_scatter(const torch::Tensor& in, torch::Tensor out, ReduceOp op) = 0;
    // Asynchronous forms of the two (FSDP's per-unit all-gathers and gradient reduce-scatters,
    // which overlap compute). Same shapes and rules; `in` and `out` must stay untouched until the
    // handle's wait() returned. MPI: on the progress thread, in issue order with the other
    // asynchronous collectives; NCCL: on the communicator's stream, ordered after the work queued
    // so far on the caller's stream.
    virtual std::shared_ptr<Work> allgather_async(const torch::Tensor& in, torch::Tensor out) = 0;
    virtual std::shared_ptr<Work> reduce_scatter_async(const torch::Tensor& in, torch::Tensor out,
                                                       ReduceOp op) = 0;
    // The blocking reduce_scatter above, whose handle tells its duration (Work::seconds) for
    // accounting, to be resolved later (ZeRO's gradient reduce-scatter). Default (MPI): the host
    // time of the blocking call, known at once (the caller's thread runs it; exposed_seconds is
    // the same). NCCL: CUDA events around the collective on the communicator's stream (the host
    // does not wait; resolve it late, see Work::seconds).
    virtual std::shared_ptr<Work> reduce_scatter_timed(const torch::Tensor& in, torch::Tensor out,
                                                       ReduceOp op);
    virtual void barrier() = 0;
    // Host-side control traffic: a few numbers (flags, counts) that must neither wait for nor
    // synchronise with the device, e.g. the ranks' per-iteration stop/checkpoint agreement. In
    // place over `values` (Sum, Max or Min; Average divides the sum). MPI: the blocking allreduce
    // on the caller's thread. NCCL: an MPI allreduce over a duplicate of the MPI communicator NCCL
    // was bootstrapped from, so it never touches a CUDA stream.
    virtual void allreduce_host(std::vector<double>& values, ReduceOp op) = 0;

    // Point-to-point (pipeline stages), blocking like the collectives above. Not collective: only
    // the two ranks take part. send's tensor and the peer's recv tensor must be contiguous with the
    // same dtype and numel (nothing checks this across ranks; a mismatch is an MPI truncation error
    // or undefined with NCCL). recv fills `t` in place. Sends and recvs between two ranks match in
    // the order they are issued; a send may block until the peer receives, so two ranks that both
    // send to each other first deadlock: order them (e.g. by rank parity). MPI: MPI_Send/MPI_Recv
    // on the host (CUDA tensors staged through host memory). NCCL: ncclSend/ncclRecv on the
    // communicator's stream, ordered with the caller's stream like broadcast (no host wait).
    virtual void send(const torch::Tensor& t, int peer) = 0;
    virtual void recv(torch::Tensor t, int peer) = 0;
    // A batch of sends and receives posted together (PyTorch's batch_isend_irecv), blocking like
    // send/recv until all of them completed. No operation of the batch waits for another to be
    // matched first, so a stage may send its output to the next stage and receive its next input
    // from the previous one in one batch without coupling the two. Between two ranks, messages
    // still match in the order they are issued (batches included). Empty tensors are skipped.
    // MPI: MPI_Isend/MPI_Irecv of every operation on the caller's thread, then all completed
    // (bounded by dist.timeout); CUDA tensors staged through host memory. NCCL: ncclSend/ncclRecv
    // between ncclGroupStart/ncclGroupEnd on the communicator's stream, ordered with the caller's
    // stream like send/recv. Stats count each operation under "send"/"recv" (the batch's
    // seconds shared equally among its operations).
    virtual void exchange(const std::vector<P2POp>& ops) = 0;

    // Keys: "allreduce", "broadcast", "allgather", "reduce_scatter", "send", "recv" (only kinds
    // that were called).
    virtual std::map<std::string, CommStats> stats() const = 0;

    // Fault handling (issue: a dying rank never hangs the job). Thread-safe; called by the run's
    // watchdog thread while the training thread may be blocked. Returns "" while healthy, else
    // the reason the communicator can no longer complete collectives (NCCL: its asynchronous
    // error, after which the communicator is aborted). MPI reports its errors synchronously
    // (MPI_ERRORS_ARE_FATAL), so its default is always healthy.
    virtual std::string poll_async_error() { return ""; }
    // dist.timeout: seconds any host-side wait for the peers may take (0: no limit; the factory
    // sets it). A wait that exceeds it throws core::PeerTimeoutError naming the operation, and
    // the communicator cannot be used again (NCCL: it is aborted; MPI: the pending collective
    // cannot be cancelled); the error is meant to end the job with MPI_Abort. MPI: every
    // collective and point-to-point call and Work::wait/seconds (collectives then run on the
    // progress thread, see communicator.cpp; needs MPI_THREAD_SERIALIZED, at MPI_THREAD_SINGLE
    // waits stay unbounded). NCCL: communicator initialisation, host waits (barrier,
    // Work::seconds, synchronize) and allreduce_host.
    virtual void set_timeout(double /*seconds*/) {}
    // Blocks the host until the work queued so far on the caller's current CUDA stream has
    // finished, the collectives it waits for included; throws core::PeerTimeoutError naming
    // `what` after dist.timeout (NCCL: its asynchronous errors are polled meanwhile and the
    // communicator is aborted on expiry). Call it before a host read of device results (the
    // loss, the non-finite check, a checkpoint): the read's own synchronisation would block in
    // the CUDA driver forever when a peer stalls. MPI: returns at once (its collectives complete
    // on the host, with the timeout of set_timeout).
    virtual void synchronize(const char* /*what*/) {}

    // Seconds that `ops`, a batch of this communicator's operations issued back to back, took
    // where they ran (the comm benchmark's timed loop). Default (MPI, whose collectives complete
    // on the host): a steady clock around ops(). NCCL: one pair of CUDA events around the whole
    // batch on the communicator's stream, then a host wait for the end event (bounded by
    // dist.timeout, polling NCCL's errors); no event per operation is created for it.
    virtual double time_batch(const std::function<void()>& ops);

    // A second communicator over the same ranks whose collectives run beside this one's, for
    // FSDP's all-gathers (FSDP2 issues them on a stream apart from its reduce-scatters, so a
    // prefetched all-gather never queues behind the previous unit's reduce-scatter). NCCL: its
    // own NCCL communicator and high-priority stream; its operations count in this
    // communicator's stats(). Collective over the ranks. Null (the default) where the backend
    // cannot run two collectives at once: MPI runs at MPI_THREAD_SERIALIZED, where two progress
    // threads, each inside a different collective, would deadlock across ranks.
    virtual std::unique_ptr<Communicator> make_lane() { return nullptr; }
};

// backend "mpi" or "nccl". Collective over `comm` (duplicates it, so user traffic on `comm` never
// mixes with ours). "mpi" needs MPI_THREAD_SERIALIZED and accepts host tensors (CUDA tensors are
// staged through host memory); "nccl" needs a CUDA `device` and a build with NCCL. timeout_s:
// dist.timeout (see set_timeout; 0: no limit), which also bounds NCCL's initialisation. Errors
// are ConfigError (impossible choice) or DistributedError (MPI/NCCL failure, PeerTimeoutError).
// allreduce: dist.allreduce (MPI only; Hierarchical with "nccl" is a ConfigError, see
// kNcclHierarchical).
std::unique_ptr<Communicator> make_communicator(const std::string& backend, MPI_Comm comm,
                                                torch::Device device, double timeout_s = 0,
                                                const AllreduceOptions& allreduce = {});

} // namespace trainscope::dist
