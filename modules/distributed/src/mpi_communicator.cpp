// The MPI communicator (host tensors; a progress thread, mpi_progress.cpp, runs asynchronous
// allreduces on a duplicated communicator so they overlap computation even though Open MPI only
// progresses nonblocking collectives inside MPI calls).
//
// MPI runs at MPI_THREAD_SERIALIZED (see mpi_runtime.hpp): at most one thread is inside MPI at a
// time. Every MPI communicator of the process (a run may have several: pipeline and data-parallel
// groups) shares one serializer: a progress thread holds its mutex while it runs a collective, and
// a blocking call on the caller's thread first waits until no asynchronous collective of ANY
// communicator is in flight. That wait cannot deadlock: progress threads never wait for a caller
// thread, and while a caller thread is inside a blocking call nothing new is enqueued (the caller's
// thread is the only one that enqueues). Outside the communicators, trainscope calls MPI only while
// no asynchronous collective is in flight (every Work is waited for before the iteration ends).
//
// dist.timeout (set_timeout): a peer that stops without dying (SIGSTOP, a hung file system) leaves
// its partners inside MPI forever, and MPI cannot cancel a collective. So with a timeout the
// caller's thread never blocks in MPI itself. Collectives run on the progress thread, blocking
// calls too (after the same wait for the serializer to be idle), as MPI's blocking collectives,
// which are Open MPI's fast "tuned" algorithms (its nonblocking ones measured 1.4-9x slower
// here), and the caller waits for their Work with the deadline. Small blocking allreduces (the
// per-iteration agreement, synchronised batch norm) and point-to-point messages are nonblocking
// on the caller's thread instead, completed by core::wait_for_peers: a hand-off would cost more
// than it saves. A wait that expires throws core::PeerTimeoutError naming the operation and
// breaks the communicator (its progress thread may be stuck in the pending collective): every
// later call fails at once, and the error ends the job with MPI_Abort (app/main.cpp). Without a
// timeout (tests, the comm benchmark at MPI_THREAD_SINGLE) blocking calls run on the caller's
// thread as plain MPI calls. dist.allreduce=hierarchical (HierarchicalAllreduce, built per
// duplicate): every allreduce below runs the two-level algorithm in place of MPI_Allreduce.
#include "trainscope/distributed/communicator.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "mpi_check.hpp"
#include "mpi_float16.hpp"
#include "mpi_progress.hpp"
#include "mpi_transfers.hpp"
#include "trainscope/core/build_config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/core/mpi_util.hpp"
#include "trainscope/core/nvtx.hpp"
#include "trainscope/distributed/mpi_runtime.hpp"

namespace trainscope::dist {
namespace {

using namespace detail;
using namespace transfers;

// Element type of a reduction, or MPI_DATATYPE_NULL when MPI cannot reduce the dtype. Inline and
// branch-only: it sits on the path of every small blocking allreduce.
inline MPI_Datatype reduce_type_or_null(c10::ScalarType t) noexcept {
    if (C10_LIKELY(t == torch::kFloat32)) return MPI_FLOAT; // gradients, statistics, benchmark
    switch (t) {
    case torch::kFloat32:
        return MPI_FLOAT;
    case torch::kFloat64:
        return MPI_DOUBLE;
    case torch::kInt32:
        return MPI_INT32_T;
    case torch::kInt64:
        return MPI_INT64_T;
    case torch::kUInt8:
        return MPI_UINT8_T;
    case torch::kHalf:
    case torch::kBFloat16:
        return MPI_UINT16_T; // summed by mpi_float16's operations (mpi_op)
    default:
        return MPI_DATATYPE_NULL;
    }
}

[[noreturn]] __attribute__((noinline, cold)) void throw_unreducible(c10::ScalarType t) {
    throw core::DistributedError(
        std::string("the MPI backend cannot reduce ") + c10::toString(t) +
        " tensors (supported: float32, float64, int32, int64, uint8, and sums of float16 and "
        "bfloat16); keep gradients in float32 (e.g. run.precision with fp32 master weights) or "
        "use dist.backend=nccl on GPUs");
}

// Element type of a reduction; bytewise operations (broadcast, allgather) accept any dtype.
inline MPI_Datatype mpi_reduce_type(const torch::Tensor& t) {
    const MPI_Datatype type = reduce_type_or_null(t.scalar_type());
    if (type == MPI_DATATYPE_NULL) throw_unreducible(t.scalar_type());
    return type;
}

[[noreturn]] __attribute__((noinline, cold)) void throw_float16_extremum(c10::ScalarType t) {
    throw core::DistributedError(
        std::string("the MPI backend sums ") + c10::toString(t) +
        " tensors but takes no maximum or minimum of them: reduce float32");
}

// The operation for `op` on elements of `t` (16-bit floats: mpi_float16's sums).
inline MPI_Op mpi_op(ReduceOp op, c10::ScalarType t) {
    if (C10_UNLIKELY(is_float16(t))) {
        if (op != ReduceOp::Sum && op != ReduceOp::Average) throw_float16_extremum(t);
        return float16_sum(t);
    }
    switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Average:
        return MPI_SUM;
    case ReduceOp::Max:
        return MPI_MAX;
    case ReduceOp::Min:
        return MPI_MIN;
    }
    return MPI_SUM;
}

[[noreturn]] __attribute__((noinline, cold)) void throw_integer_average(c10::ScalarType t) {
    throw core::InternalError(std::string("ReduceOp::Average on an integer tensor (") +
                              c10::toString(t) +
                              "): the mean would be truncated; reduce with Sum and divide");
}

// Checks that MPI can reduce `t` with `op`; returns the element type.
inline MPI_Datatype check_reduction(const torch::Tensor& t, ReduceOp op) {
    const MPI_Datatype type = mpi_reduce_type(t);
    if (op == ReduceOp::Average && !t.is_floating_point()) throw_integer_average(t.scalar_type());
    return type;
}

[[noreturn]] __attribute__((noinline, cold)) void throw_not_contiguous(const char* what) {
    throw core::InternalError(std::string(what) + ": tensor must be defined and contiguous");
}

__attribute__((always_inline)) inline void require_contiguous(const torch::Tensor& t,
                                                              const char* what) {
    if (!t.defined() || !t.is_contiguous()) throw_not_contiguous(what);
}

// With a timeout, blocking allreduces up to this size run nonblocking on the caller's thread;
// larger ones on the progress thread (see MpiCommunicator::blocking_allreduce).
constexpr std::uint64_t kCallerThreadMaxBytes = 64 << 10;

class MpiCommunicator final : public Communicator {
  public:
    MpiCommunicator(MPI_Comm comm, torch::Device device, double timeout_s,
                    const AllreduceOptions& allreduce)
        : device_(device) {
        int level = MPI_THREAD_SINGLE;
        MPI_CHECK(MPI_Query_thread(&level));
        // Below MPI_THREAD_SERIALIZED no other thread may call MPI: asynchronous allreduces then
        // run at once on the caller's thread (no overlap). trainscope asks for that level only for
        // run.workload=comm, where nothing overlaps and Open MPI's per-call cost of the higher
        // levels would show in small-message latency (see mpi_runtime.hpp).
        threaded_ = level >= MPI_THREAD_SERIALIZED;
        MPI_CHECK(MPI_Comm_rank(comm, &rank_));
        MPI_CHECK(MPI_Comm_size(comm, &size_));
        create_float16_ops();
        // Two private duplicates: blocking collectives on the caller's thread and asynchronous
        // ones on the progress thread never share a communicator, so they cannot mismatch.
        MPI_CHECK(MPI_Comm_dup(comm, &comm_));
        state_ = std::make_shared<ProgressState>();
        state_->timeout_s.store(timeout_s);
        MPI_CHECK(MPI_Comm_dup(comm, &state_->comm));
        MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(state_->comm, MPI_ERRORS_RETURN);
        choose_allreduce(allreduce);
        if (threaded_) thread_ = std::thread(progress_loop, state_);
    }

    ~MpiCommunicator() override {
        std::deque<Task> dropped;
        {
            std::lock_guard<std::mutex> lock(state_->m);
            state_->stop = true;
            // Collectives not yet started are cancelled. In a normal run there are none (every
            // Work was waited for); during error unwinding, starting them could hang on peers.
            dropped.swap(state_->queue);
        }
        state_->cv.notify_all();
        for (auto& t : dropped) {
            mpi_serializer().finished(); // never started: no longer in flight
            t.work->finish(std::make_exception_ptr(core::DistributedError(
                "collective cancelled: the communicator was destroyed before it started")));
        }
        if (!state_->usable()) {
            // A wait timed out: the progress thread may be inside a collective that never
            // completes, and the communicators have a pending operation. Leave both behind.
            if (thread_.joinable()) thread_.detach();
            leak_hierarchical();
            return;
        }
        if (std::uncaught_exceptions() > 0) {
            // Unwinding: a collective in flight may never complete if a peer failed. Give it a
            // moment, then leave the thread (and its communicator) behind instead of hanging.
            std::unique_lock<std::mutex> lock(state_->m);
            if (!state_->cv.wait_for(lock, std::chrono::seconds(5),
                                     [&] { return !state_->running; })) {
                lock.unlock();
                core::log::warn() << "MPI communicator destroyed while a collective is in flight; "
                                     "leaving its progress thread behind";
                thread_.detach();
                leak_hierarchical();
                return;
            }
        }
        if (thread_.joinable()) thread_.join();
        state_->hierarchical.reset();
        hierarchical_.reset();
        MPI_Comm_free(&state_->comm);
        MPI_Comm_free(&comm_);
    }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string backend() const override { return "mpi"; }
    std::string allreduce_algorithm() const override {
        return hierarchical_ ? "hierarchical" : "flat";
    }
    torch::Device device() const override { return device_; }
    void set_timeout(double seconds) override { state_->timeout_s.store(seconds); }

    std::shared_ptr<Work> allreduce_async(torch::Tensor tensor, ReduceOp op) override {
        return allreduce_work(tensor, op, "an asynchronous MPI allreduce (gradient buckets)",
                              /*blocking=*/false);
    }

    void allreduce(const torch::Tensor& tensor, ReduceOp op) override {
        blocking_allreduce(tensor, op, "a blocking MPI allreduce (e.g. synchronised batch norm)");
    }

    void allreduce_host(std::vector<double>& values, ReduceOp op) override {
        if (values.empty()) return;
        constexpr const char* kWhat = "a host-side MPI allreduce (the ranks' per-iteration "
                                      "agreement, progress totals or evaluation sums)";
        if (bounded()) {
            // A tensor of its own, not a view of `values`: after a timeout the collective may
            // still write into its buffer when a late peer arrives (its handle is kept then).
            torch::Tensor owned = torch::tensor(values, torch::kFloat64);
            blocking_allreduce(owned, op, kWhat);
            std::copy_n(owned.data_ptr<double>(), values.size(), values.begin());
            return;
        }
        blocking_allreduce(torch::from_blob(values.data(),
                                            {static_cast<std::int64_t>(values.size())},
                                            torch::kFloat64),
                           op, kWhat);
    }

  private:
    std::shared_ptr<MpiWork> allreduce_work(torch::Tensor tensor, ReduceOp op, const char* what,
                                            bool blocking) {
        require_contiguous(tensor, "allreduce");
        check_reduction(tensor, op);
        if (tensor.numel() == 0) {
            auto work = std::make_shared<MpiWork>("", 0.0, nullptr);
            work->finish(nullptr);
            return work;
        }
        torch::Tensor host = tensor;
        std::function<void()> after;
        if (!tensor.is_cpu()) {
            host = tensor.to(torch::kCPU); // synchronous with the caller's stream
            after = [tensor, host]() mutable {
                torch::NoGradGuard no_grad;
                tensor.copy_(host);
            };
        }
        const MPI_Datatype type = mpi_reduce_type(host);
        const std::uint64_t bytes = host.nbytes();
        const int size = size_;
        ProgressState* state = state_.get(); // alive while the thread runs (it co-owns it)
        return submit(
            what,
            [host, op, type, bytes, size, state]() mutable {
                const auto t0 = Clock::now();
                allreduce_chunked(host.data_ptr(), host.numel(), host.element_size(), type,
                                  mpi_op(op, host.scalar_type()), state->comm,
                                  state->hierarchical.get());
                if (op == ReduceOp::Average) host.div_(size);
                state->account_async(Kind::Allreduce, bytes, seconds_since(t0));
            },
            std::move(after), blocking);
    }

    void blocking_allreduce(const torch::Tensor& tensor, ReduceOp op, const char* what) {
        require_contiguous(tensor, "allreduce");
        const MPI_Datatype type = check_reduction(tensor, op);
        const std::int64_t count = tensor.numel();
        if (count == 0) return;
        if (bounded()) {
            const std::uint64_t bytes = tensor.nbytes();
            if (tensor.is_cpu() && bytes <= kCallerThreadMaxBytes) {
                // Small: nonblocking on this thread, polled with the deadline. Handing it to the
                // progress thread would cost a thread wake-up (measured: the per-iteration
                // agreement 4.6 -> 7.3 ms on a loaded 2-core machine), more than MPI's slower
                // nonblocking algorithm costs at this size (a few microseconds).
                const double timeout_s = checked_timeout();
                bounded_call(tensor, [&] {
                    std::unique_lock<std::mutex> mpi = serialize(timeout_s, what);
                    if (hierarchical_) {
                        hierarchical_->run_bounded(tensor.data_ptr(), static_cast<int>(count), type,
                                                   mpi_op(op, tensor.scalar_type()), timeout_s,
                                                   what);
                        return;
                    }
                    MPI_Request request = MPI_REQUEST_NULL;
                    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, tensor.data_ptr(),
                                             static_cast<int>(count), type,
                                             mpi_op(op, tensor.scalar_type()), comm_, &request));
                    core::wait_for_peers(request, timeout_s, what);
                });
                if (op == ReduceOp::Average) tensor.div_(size_);
                state_->account(Kind::Allreduce, bytes);
                return;
            }
            // Larger: on the progress thread, as MPI's blocking (fast) collective; this thread
            // waits with the deadline (see the top of this file).
            allreduce_work(tensor, op, what, /*blocking=*/true)->wait();
            return;
        }
        if (tensor.is_cpu() && count <= kMaxChunk) {
            // The hot path of small blocking allreduces (comm benchmark, sync BN, evaluation): one
            // dtype switch, no tensor copies, no clock reads, no NVTX range (nsys --trace=mpi shows
            // the call itself), relaxed counters only. Its cost over a bare MPI_Allreduce is what
            // scripts/bench_comm_mpi measures.
            std::unique_lock<std::mutex> mpi = serialize();
            if (C10_UNLIKELY(hierarchical_ != nullptr))
                hierarchical_->run(tensor.data_ptr(), count, type,
                                   mpi_op(op, tensor.scalar_type()));
            else
                MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, tensor.data_ptr(), static_cast<int>(count),
                                        type, mpi_op(op, tensor.scalar_type()), comm_));
            if (mpi.owns_lock()) mpi.unlock();
            if (op == ReduceOp::Average) tensor.div_(size_);
            state_->account(Kind::Allreduce,
                            static_cast<std::uint64_t>(count) * tensor.dtype().itemsize());
            return;
        }
        torch::Tensor host = tensor.is_cpu() ? tensor : tensor.to(torch::kCPU);
        std::unique_lock<std::mutex> mpi = serialize();
        const auto t0 = Clock::now();
        allreduce_chunked(host.data_ptr(), host.numel(), host.element_size(), mpi_reduce_type(host),
                          mpi_op(op, host.scalar_type()), comm_, hierarchical_.get());
        const double seconds = seconds_since(t0);
        if (mpi.owns_lock()) mpi.unlock();
        if (op == ReduceOp::Average) host.div_(size_);
        torch::Tensor out = tensor;
        copy_back(out, host);
        account(Kind::Allreduce, host.nbytes(), seconds);
    }

  public:
    void broadcast(torch::Tensor tensor, int root) override {
        require_contiguous(tensor, "broadcast");
        check_root(root);
        if (tensor.numel() == 0) return;
        torch::Tensor host = tensor.is_cpu() ? tensor : tensor.to(torch::kCPU);
        const auto bytes = static_cast<std::int64_t>(host.nbytes());
        if (bounded()) {
            ProgressState* state = state_.get();
            submit(
                "an MPI broadcast (initial parameters and buffers, or a pipeline's losses)",
                [host, bytes, root, state] {
                    const auto t0 = Clock::now();
                    bcast_bytes(host.data_ptr(), bytes, root, state->comm);
                    state->account_async(Kind::Broadcast, bytes, seconds_since(t0));
                },
                /*after=*/nullptr, /*blocking=*/true)
                ->wait();
        } else {
            std::unique_lock<std::mutex> mpi = serialize();
            const auto t0 = Clock::now();
            bcast_bytes(host.data_ptr(), bytes, root, comm_);
            const double seconds = seconds_since(t0);
            if (mpi.owns_lock()) mpi.unlock();
            account(Kind::Broadcast, host.nbytes(), seconds);
        }
        if (!tensor.is_cpu()) copy_back(tensor, host);
    }

    void allgather(const torch::Tensor& in, torch::Tensor out) override {
        require_contiguous(out, "allgather output");
        if (out.numel() != in.numel() * size_ || out.scalar_type() != in.scalar_type())
            throw core::InternalError("allgather: output must hold size() x input elements of the "
                                      "same dtype (input " +
                                      std::to_string(in.numel()) + ", output " +
                                      std::to_string(out.numel()) + ", size " +
                                      std::to_string(size_) + ")");
        if (in.numel() == 0) return;
        const auto t0 = Clock::now();
        torch::Tensor src = in.to(torch::kCPU).contiguous();
        torch::Tensor dst =
            out.is_cpu() ? out : torch::empty(out.sizes(), out.options().device(torch::kCPU));
        const int bytes = checked_int(static_cast<std::int64_t>(src.nbytes()), "allgather");
        auto run = [src, dst, bytes](MPI_Comm comm) {
            nvtx::ScopedRange range("MPI_Allgather");
            MPI_CHECK(MPI_Allgather(src.data_ptr(), bytes, MPI_BYTE, dst.data_ptr(), bytes,
                                    MPI_BYTE, comm));
        };
        run_blocking("an MPI allgather (ZeRO parameter shards)", run);
        if (!out.is_cpu()) copy_back(out, dst);
        account(Kind::Allgather, src.nbytes(), seconds_since(t0));
    }

    void reduce_scatter(const torch::Tensor& in, torch::Tensor out, ReduceOp op) override {
        require_contiguous(out, "reduce_scatter output");
        check_reduction(out, op);
        if (in.numel() != out.numel() * size_ || out.scalar_type() != in.scalar_type())
            throw core::InternalError("reduce_scatter: input must hold size() x output elements of "
                                      "the same dtype (input " +
                                      std::to_string(in.numel()) + ", output " +
                                      std::to_string(out.numel()) + ", size " +
                                      std::to_string(size_) + "); pad to an exact split");
        if (out.numel() == 0) return;
        const auto t0 = Clock::now();
        torch::Tensor src = in.to(torch::kCPU).contiguous();
        torch::Tensor dst =
            out.is_cpu() ? out : torch::empty(out.sizes(), out.options().device(torch::kCPU));
        const int count = checked_int(dst.numel(), "reduce_scatter");
        const MPI_Datatype type = mpi_reduce_type(dst);
        const MPI_Op mop = mpi_op(op, dst.scalar_type());
        auto run = [src, dst, count, type, mop](MPI_Comm comm) {
            nvtx::ScopedRange range("MPI_Reduce_scatter_block");
            MPI_CHECK(
                MPI_Reduce_scatter_block(src.data_ptr(), dst.data_ptr(), count, type, mop, comm));
        };
        run_blocking("an MPI reduce-scatter (ZeRO gradient shards)", run);
        if (op == ReduceOp::Average) dst.div_(size_);
        if (!out.is_cpu()) copy_back(out, dst);
        account(Kind::ReduceScatter, dst.nbytes(), seconds_since(t0));
    }

    std::shared_ptr<Work> allgather_async(const torch::Tensor& in, torch::Tensor out) override {
        require_contiguous(out, "allgather output");
        if (out.numel() != in.numel() * size_ || out.scalar_type() != in.scalar_type())
            throw core::InternalError("allgather_async: output must hold size() x input elements "
                                      "of the same dtype");
        if (in.numel() == 0) return finished_work();
        auto [src, dst, after] = stage(in, out);
        const int bytes = checked_int(static_cast<std::int64_t>(src.nbytes()), "allgather");
        ProgressState* state = state_.get();
        return submit(
            "an asynchronous MPI allgather (FSDP parameter units)",
            [src, dst, bytes, state] {
                nvtx::ScopedRange range("MPI_Allgather");
                const auto t0 = Clock::now();
                // Nonblocking and polled with naps (core::wait_for_peers): a prefetched all-gather
                // is often posted before the peers reach it, and a blocking MPI collective would
                // spin on a core the compute threads need meanwhile.
                MPI_Request request = MPI_REQUEST_NULL;
                MPI_CHECK(MPI_Iallgather(src.data_ptr(), bytes, MPI_BYTE, dst.data_ptr(), bytes,
                                         MPI_BYTE, state->comm, &request));
                core::wait_for_peers(request, 0, "an asynchronous MPI allgather");
                state->account_async(Kind::Allgather, static_cast<std::uint64_t>(bytes),
                                     seconds_since(t0));
            },
            std::move(after));
    }

    std::shared_ptr<Work> reduce_scatter_async(const torch::Tensor& in, torch::Tensor out,
                                               ReduceOp op) override {
        require_contiguous(out, "reduce_scatter output");
        check_reduction(out, op);
        if (in.numel() != out.numel() * size_ || out.scalar_type() != in.scalar_type())
            throw core::InternalError("reduce_scatter_async: input must hold size() x output "
                                      "elements of the same dtype; pad to an exact split");
        if (out.numel() == 0) return finished_work();
        auto [src, dst, after] = stage(in, out);
        const int count = checked_int(dst.numel(), "reduce_scatter");
        const MPI_Datatype type = mpi_reduce_type(dst);
        const MPI_Op mop = mpi_op(op, dst.scalar_type());
        const int size = size_;
        ProgressState* state = state_.get();
        return submit(
            "an asynchronous MPI reduce-scatter (FSDP gradient units)",
            [src, dst, count, type, mop, op, size, state]() mutable {
                nvtx::ScopedRange range("MPI_Reduce_scatter_block");
                const auto t0 = Clock::now();
                MPI_Request request = MPI_REQUEST_NULL; // polled with naps, as the all-gather
                MPI_CHECK(MPI_Ireduce_scatter_block(src.data_ptr(), dst.data_ptr(), count, type,
                                                    mop, state->comm, &request));
                core::wait_for_peers(request, 0, "an asynchronous MPI reduce-scatter");
                if (op == ReduceOp::Average) dst.div_(size);
                state->account_async(Kind::ReduceScatter, dst.nbytes(), seconds_since(t0));
            },
            std::move(after));
    }

    void barrier() override {
        if (bounded()) {
            ProgressState* state = state_.get();
            submit(
                "an MPI barrier", [state] { MPI_CHECK(MPI_Barrier(state->comm)); },
                /*after=*/nullptr, /*blocking=*/true)
                ->wait();
            return;
        }
        std::unique_lock<std::mutex> mpi = serialize();
        MPI_CHECK(MPI_Barrier(comm_));
    }

    void send(const torch::Tensor& t, int peer) override {
        require_contiguous(t, "send");
        check_peer(peer, "send");
        if (t.numel() == 0) return;
        torch::Tensor host = t.is_cpu() ? t : t.to(torch::kCPU);
        const double timeout_s = checked_timeout();
        const auto t0 = Clock::now();
        bounded_call(host, [&] {
            std::unique_lock<std::mutex> mpi = serialize(timeout_s, "an MPI send");
            send_bytes(host.data_ptr(), static_cast<std::int64_t>(host.nbytes()), peer, comm_,
                       timeout_s);
        });
        account(Kind::Send, host.nbytes(), seconds_since(t0));
    }

    void recv(torch::Tensor t, int peer) override {
        require_contiguous(t, "recv");
        check_peer(peer, "recv");
        if (t.numel() == 0) return;
        torch::Tensor host =
            t.is_cpu() ? t : torch::empty(t.sizes(), t.options().device(torch::kCPU));
        const double timeout_s = checked_timeout();
        const auto t0 = Clock::now();
        bounded_call(host, [&] {
            std::unique_lock<std::mutex> mpi = serialize(timeout_s, "an MPI receive");
            recv_bytes(host.data_ptr(), static_cast<std::int64_t>(host.nbytes()), peer, comm_,
                       timeout_s);
        });
        if (!t.is_cpu()) copy_back(t, host);
        account(Kind::Recv, host.nbytes(), seconds_since(t0));
    }

    void exchange(const std::vector<P2POp>& ops) override {
        // Host buffers: a send's tensor itself (or its host copy), a receive's buffer (copied back
        // into a CUDA tensor afterwards).
        struct Staged {
            P2POp::Kind kind;
            torch::Tensor host, target;
            int peer;
        };
        std::vector<Staged> staged;
        for (const P2POp& op : ops) {
            const bool send = op.kind == P2POp::Kind::Send;
            require_contiguous(op.tensor, send ? "exchange send" : "exchange recv");
            check_peer(op.peer, send ? "exchange send" : "exchange recv");
            if (op.tensor.numel() == 0) continue;
            torch::Tensor host =
                op.tensor.is_cpu() ? op.tensor
                : send             ? op.tensor.to(torch::kCPU)
                       : torch::empty(op.tensor.sizes(), op.tensor.options().device(torch::kCPU));
            staged.push_back({op.kind, host, op.tensor, op.peer});
        }
        if (staged.empty()) return;
        const double timeout_s = checked_timeout();
        constexpr const char* kWhat = "an MPI send/receive batch (pipeline stages)";
        const auto t0 = Clock::now();
        try {
            std::unique_lock<std::mutex> mpi = serialize(timeout_s, kWhat);
            nvtx::ScopedRange range("MPI_Isend/MPI_Irecv batch");
            // Every operation is posted before any is waited for: none waits for another to be
            // matched. Pieces of at most 2^30 bytes, in order (as send_bytes/recv_bytes).
            std::vector<MPI_Request> requests;
            for (const Staged& s : staged) {
                auto* p = static_cast<char*>(s.host.data_ptr());
                const auto bytes = static_cast<std::int64_t>(s.host.nbytes());
                for (std::int64_t off = 0; off < bytes; off += kMaxChunk) {
                    const int n = static_cast<int>(std::min(kMaxChunk, bytes - off));
                    MPI_Request request = MPI_REQUEST_NULL;
                    if (s.kind == P2POp::Kind::Send)
                        MPI_CHECK(
                            MPI_Isend(p + off, n, MPI_BYTE, s.peer, /*tag=*/0, comm_, &request));
                    else
                        MPI_CHECK(
                            MPI_Irecv(p + off, n, MPI_BYTE, s.peer, /*tag=*/0, comm_, &request));
                    requests.push_back(request);
                }
            }
            for (MPI_Request& request : requests)
                core::wait_for_peers(request, timeout_s, kWhat);
        } catch (const core::PeerTimeoutError& e) {
            state_->mark_broken(e.what());
            for (const Staged& s : staged) // a late peer may still read or write them
                (void)new torch::Tensor(s.host);
            throw;
        }
        const double share = seconds_since(t0) / static_cast<double>(staged.size());
        for (Staged& s : staged) {
            if (s.kind == P2POp::Kind::Recv && !s.target.is_cpu()) copy_back(s.target, s.host);
            account(s.kind == P2POp::Kind::Send ? Kind::Send : Kind::Recv, s.host.nbytes(), share);
        }
    }

    std::map<std::string, CommStats> stats() const override { return state_->stats(); }

  private:
    // dist.allreduce for this communicator's ranks: the two-level algorithm's sub-communicators,
    // one set per duplicate (caller's thread, progress thread), built once; none: flat.
    void choose_allreduce(AllreduceOptions o) {
        hierarchical_ = HierarchicalAllreduce::choose(comm_, o);
        o.algorithm = AllreduceAlgorithm::Hierarchical; // as decided for comm_ (same ranks)
        if (hierarchical_) state_->hierarchical = HierarchicalAllreduce::choose(state_->comm, o);
    }
    // A broken or abandoned communicator keeps its sub-communicators (see ~MpiCommunicator).
    void leak_hierarchical() {
        (void)hierarchical_.release();
        (void)state_->hierarchical.release();
    }
    // Whether waits have a deadline, so that blocking collectives go through the progress thread.
    bool bounded() const {
        return threaded_ && state_->timeout_s.load(std::memory_order_relaxed) > 0;
    }
    // The timeout for a wait on this thread; throws if an earlier wait already timed out.
    double checked_timeout() {
        if (!state_->usable()) throw state_->broken_error();
        return state_->timeout_s.load(std::memory_order_relaxed);
    }
    // Runs fn, a nonblocking operation on `buffer`; a PeerTimeoutError from it breaks the
    // communicator on its way out and keeps the buffer alive for good (a late peer may still
    // make MPI write into or read from it; see core::wait_for_peers).
    template <class Fn> void bounded_call(const torch::Tensor& buffer, Fn&& fn) {
        try {
            fn();
        } catch (const core::PeerTimeoutError& e) {
            state_->mark_broken(e.what());
            (void)new torch::Tensor(buffer); // leaked on purpose: the job is being aborted
            throw;
        }
    }

    // Runs `run` on the progress thread (at MPI_THREAD_SINGLE: here and now) and returns its
    // handle; `after` runs on the waiter once it completed. A broken communicator fails at once.
    // blocking: a blocking call's collective, which first waits (within the timeout) until no
    // asynchronous collective of any communicator is in flight, as blocking calls on the
    // caller's thread do (see serialize): so it never runs between another communicator's
    // asynchronous collectives, which could deadlock across ranks.
    std::shared_ptr<MpiWork> submit(const char* what, std::function<void()> run,
                                    std::function<void()> after = nullptr, bool blocking = false) {
        auto work = std::make_shared<MpiWork>(
            what, threaded_ ? state_->timeout_s.load(std::memory_order_relaxed) : 0.0, state_);
        if (after) work->set_after(std::move(after));
        if (!state_->usable()) {
            work->finish(std::make_exception_ptr(state_->broken_error()));
            return work;
        }
        if (blocking && threaded_) {
            try {
                mpi_serializer().wait_idle(state_->timeout_s.load(std::memory_order_relaxed), what);
            } catch (const core::PeerTimeoutError& e) {
                state_->mark_broken(e.what());
                throw;
            }
        }
        if (!threaded_) { // MPI_THREAD_SINGLE/FUNNELED: run it here and now
            const auto t0 = Clock::now();
            std::exception_ptr error;
            try {
                run();
            } catch (...) {
                error = std::current_exception();
            }
            work->finish(error, seconds_since(t0));
            return work;
        }
        mpi_serializer().enqueued();
        {
            std::lock_guard<std::mutex> lock(state_->m);
            state_->queue.push_back(Task{std::move(run), work});
        }
        state_->cv.notify_all();
        return work;
    }

    // Blocking collectives first let every asynchronous one issued before them finish: ranks issue
    // collectives in the same order, and at MPI_THREAD_SERIALIZED a blocking collective entered on
    // one rank while its peer's progress thread holds MPI for an earlier allreduce would deadlock.
    // The communicator is driven from one thread, so nothing is enqueued while we wait.
    std::unique_lock<std::mutex> serialize(double timeout_s = 0, const char* what = "") {
        return mpi_serializer().serialize(timeout_s, what);
    }

    void check_root(int root) const {
        if (root < 0 || root >= size_)
            throw core::InternalError("broadcast root " + std::to_string(root) + " outside [0, " +
                                      std::to_string(size_) + ")");
    }
    // A blocking send or recv to oneself would never be matched: that is a caller's bug.
    void check_peer(int peer, const char* what) const {
        if (peer < 0 || peer >= size_ || peer == rank_)
            throw core::InternalError(std::string(what) + " peer " + std::to_string(peer) +
                                      " is not another rank of [0, " + std::to_string(size_) +
                                      ") (this is rank " + std::to_string(rank_) + ")");
    }
    // A blocking collective `run(comm)`: with a deadline on the progress thread (this thread waits
    // within dist.timeout), else here on the caller's communicator.
    void run_blocking(const char* what, const std::function<void(MPI_Comm)>& run) {
        if (bounded()) {
            ProgressState* state = state_.get();
            submit(
                what, [run, state] { run(state->comm); }, /*after=*/nullptr, /*blocking=*/true)
                ->wait();
        } else {
            std::unique_lock<std::mutex> mpi = serialize();
            run(comm_);
        }
    }
    // Host buffers of an asynchronous collective from `in` into `out`: the input on the host (the
    // tensor itself when it is a contiguous host tensor), the output's host buffer and, for a
    // device output, the copy back that Work::wait runs.
    struct Staged {
        torch::Tensor src, dst;
        std::function<void()> after;
    };
    static Staged stage(const torch::Tensor& in, torch::Tensor out) {
        Staged s;
        s.src = in.to(torch::kCPU).contiguous();
        s.dst = out.is_cpu() ? out : torch::empty(out.sizes(), out.options().device(torch::kCPU));
        if (!out.is_cpu()) s.after = [out, dst = s.dst]() mutable { copy_back(out, dst); };
        return s;
    }
    std::shared_ptr<Work> finished_work() {
        auto work = std::make_shared<MpiWork>("", 0.0, nullptr);
        work->finish(nullptr);
        return work;
    }
    static void copy_back(torch::Tensor& device_tensor, const torch::Tensor& host) {
        torch::NoGradGuard no_grad;
        device_tensor.copy_(host);
    }
    void account(Kind kind, std::uint64_t bytes, double seconds) {
        state_->account(kind, bytes, seconds);
    }

    torch::Device device_;
    bool threaded_ = true; // a progress thread runs asynchronous allreduces
    int rank_ = 0, size_ = 1;
    MPI_Comm comm_ = MPI_COMM_NULL; // blocking collectives (caller's thread)
    // dist.allreduce=hierarchical (or auto across shared nodes) over comm_; null: flat.
    std::unique_ptr<HierarchicalAllreduce> hierarchical_;
    std::shared_ptr<ProgressState> state_;
    std::thread thread_;
};

} // namespace

namespace detail {

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, torch::Device device,
                                                    double timeout_s,
                                                    const AllreduceOptions& allreduce) {
    return std::make_unique<MpiCommunicator>(comm, device, timeout_s, allreduce);
}

} // namespace detail
} // namespace trainscope::dist
