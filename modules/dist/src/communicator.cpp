// The MPI communicator (host tensors; a progress thread runs asynchronous allreduces on a
// duplicated communicator so they overlap computation even though Open MPI only progresses
// nonblocking collectives inside MPI calls) and the backend factory (device binding: device.cpp).
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
// thread as plain MPI calls.
#include "trainscope/dist/communicator.hpp"

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
#include "nccl_communicator.hpp"
#include "trainscope/core/build_config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/core/mpi_util.hpp"
#include "trainscope/core/nvtx.hpp"
#include "trainscope/dist/mpi_runtime.hpp"

namespace trainscope::dist {

const char* to_string(ReduceOp op) {
    switch (op) {
    case ReduceOp::Sum:
        return "sum";
    case ReduceOp::Average:
        return "average";
    case ReduceOp::Max:
        return "max";
    case ReduceOp::Min:
        return "min";
    }
    return "?";
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The handle of a collective that completed on the caller's thread before it was returned: its
// duration is known, and the caller waited for all of it.
class CompletedWork final : public Work {
  public:
    explicit CompletedWork(double seconds) : seconds_(seconds) {}
    void wait() override {}
    bool completed() override { return true; }
    double seconds() override { return seconds_; }
    double exposed_seconds() override { return seconds_; }

  private:
    double seconds_;
};

} // namespace

void Communicator::allreduce(const torch::Tensor& tensor, ReduceOp op) {
    allreduce_async(tensor, op)->wait();
}

std::shared_ptr<Work> Communicator::reduce_scatter_timed(const torch::Tensor& in, torch::Tensor out,
                                                         ReduceOp op) {
    const auto t0 = Clock::now();
    reduce_scatter(in, std::move(out), op);
    return std::make_shared<CompletedWork>(seconds_since(t0));
}

double Communicator::time_batch(const std::function<void()>& ops) {
    const auto t0 = Clock::now();
    ops();
    return seconds_since(t0);
}

namespace {

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
    default:
        return MPI_DATATYPE_NULL;
    }
}

[[noreturn]] __attribute__((noinline, cold)) void throw_unreducible(c10::ScalarType t) {
    throw core::DistributedError(
        std::string("the MPI backend cannot reduce ") + c10::toString(t) +
        " tensors (supported: float32, float64, int32, int64, uint8); keep gradients in float32 "
        "(e.g. run.precision with fp32 master weights) or use dist.backend=nccl on GPUs");
}

// Element type of a reduction; bytewise operations (broadcast, allgather) accept any dtype.
inline MPI_Datatype mpi_reduce_type(const torch::Tensor& t) {
    const MPI_Datatype type = reduce_type_or_null(t.scalar_type());
    if (type == MPI_DATATYPE_NULL) throw_unreducible(t.scalar_type());
    return type;
}

MPI_Op mpi_op(ReduceOp op) {
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

// MPI counts are int: large buffers go in pieces of at most 2^30 elements.
constexpr std::int64_t kMaxChunk = std::int64_t{1} << 30;

// With a timeout, blocking allreduces up to this size run nonblocking on the caller's thread;
// larger ones on the progress thread (see MpiCommunicator::blocking_allreduce).
constexpr std::uint64_t kCallerThreadMaxBytes = 64 << 10;

void allreduce_chunked(void* data, std::int64_t count, std::size_t elem, MPI_Datatype type,
                       MPI_Op op, MPI_Comm comm) {
    nvtx::ScopedRange range("MPI_Allreduce");
    auto* p = static_cast<char*>(data);
    for (std::int64_t off = 0; off < count; off += kMaxChunk) {
        const int n = static_cast<int>(std::min(kMaxChunk, count - off));
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p + off * elem, n, type, op, comm));
    }
}

void bcast_bytes(void* data, std::int64_t bytes, int root, MPI_Comm comm) {
    nvtx::ScopedRange range("MPI_Bcast");
    auto* p = static_cast<char*>(data);
    for (std::int64_t off = 0; off < bytes; off += kMaxChunk)
        MPI_CHECK(MPI_Bcast(p + off, static_cast<int>(std::min(kMaxChunk, bytes - off)), MPI_BYTE,
                            root, comm));
}

// Point-to-point in pieces of at most 2^30 bytes; MPI keeps messages between two ranks on one
// communicator and tag in order, so the pieces arrive in sequence. Nonblocking, completed by
// core::wait_for_peers within timeout_s (0: no limit): point-to-point runs on the caller's thread
// (its nonblocking form is the same protocol as the blocking one, so nothing is lost).
void send_bytes(const void* data, std::int64_t bytes, int peer, MPI_Comm comm, double timeout_s) {
    nvtx::ScopedRange range("MPI_Send");
    const auto* p = static_cast<const char*>(data);
    for (std::int64_t off = 0; off < bytes; off += kMaxChunk) {
        MPI_Request request = MPI_REQUEST_NULL;
        MPI_CHECK(MPI_Isend(p + off, static_cast<int>(std::min(kMaxChunk, bytes - off)), MPI_BYTE,
                            peer, /*tag=*/0, comm, &request));
        core::wait_for_peers(request, timeout_s, "an MPI send (pipeline stages)");
    }
}

void recv_bytes(void* data, std::int64_t bytes, int peer, MPI_Comm comm, double timeout_s) {
    nvtx::ScopedRange range("MPI_Recv");
    auto* p = static_cast<char*>(data);
    for (std::int64_t off = 0; off < bytes; off += kMaxChunk) {
        MPI_Request request = MPI_REQUEST_NULL;
        MPI_CHECK(MPI_Irecv(p + off, static_cast<int>(std::min(kMaxChunk, bytes - off)), MPI_BYTE,
                            peer, /*tag=*/0, comm, &request));
        core::wait_for_peers(request, timeout_s, "an MPI receive (pipeline stages)");
    }
}

int checked_int(std::int64_t n, const char* what) {
    if (n > INT_MAX)
        throw core::DistributedError(std::string(what) + " of " + std::to_string(n) +
                                     " elements exceeds MPI's int count; split the tensor");
    return static_cast<int>(n);
}

struct ProgressState;

// Async handle of the MPI backend: completed by the progress thread. wait() and seconds() give up
// after the communicator's dist.timeout (PeerTimeoutError naming `what`, the communicator broken).
class MpiWork final : public Work {
  public:
    MpiWork(const char* what, double timeout_s, std::shared_ptr<ProgressState> state)
        : what_(what), timeout_s_(timeout_s), state_(std::move(state)) {}
    void finish(std::exception_ptr error, double seconds = 0) {
        {
            std::lock_guard<std::mutex> lock(m_);
            done_ = true;
            error_ = error;
            seconds_ = seconds;
        }
        cv_.notify_all();
    }
    void wait() override {
        const auto t0 = Clock::now();
        std::unique_lock<std::mutex> lock(m_);
        wait_done(lock);
        if (error_) std::rethrow_exception(error_);
        if (after_) {
            // CUDA tensors were staged through host memory: copy the result back on the waiter.
            auto after = std::move(after_);
            after_ = nullptr;
            lock.unlock();
            after();
            lock.lock();
        }
        if (!waited_) { // the first wait is the exposed one (a later one returns at once)
            waited_ = true;
            exposed_s_ = seconds_since(t0);
        }
    }
    bool completed() override {
        std::lock_guard<std::mutex> lock(m_);
        return done_;
    }
    double seconds() override {
        std::unique_lock<std::mutex> lock(m_);
        wait_done(lock);
        return seconds_;
    }
    double exposed_seconds() override {
        std::lock_guard<std::mutex> lock(m_);
        return exposed_s_; // wait() measured it on the host; 0 before wait()
    }
    void set_after(std::function<void()> fn) { after_ = std::move(fn); }

  private:
    void wait_done(std::unique_lock<std::mutex>& lock); // defined after ProgressState

    std::mutex m_;
    std::condition_variable cv_;
    bool done_ = false;
    std::exception_ptr error_;
    std::function<void()> after_;
    double seconds_ = 0; // the collective's duration on the progress thread
    bool waited_ = false;
    double exposed_s_ = 0; // host seconds inside the first wait()
    const char* what_;     // names the operation in a timeout's message
    double timeout_s_;     // 0: no limit
    std::shared_ptr<ProgressState> state_;
};

// What the accounting counts; names are the keys of Communicator::stats().
enum class Kind { Allreduce, Broadcast, Allgather, ReduceScatter, Send, Recv };
constexpr std::size_t kNumKinds = 6;
constexpr std::array<const char*, kNumKinds> kKindNames{"allreduce",      "broadcast", "allgather",
                                                        "reduce_scatter", "send",      "recv"};

// The process-wide MPI serializer (see the top of this file).
struct MpiSerializer {
    std::mutex mpi; // held by a progress thread while it runs a collective
    // Asynchronous collectives enqueued (by any communicator) and not yet finished with MPI. Zero
    // means every progress thread is idle and stays idle while the caller's thread is in MPI, so
    // a blocking call may enter MPI without any lock: the common case costs one atomic load.
    std::atomic<std::int64_t> inflight{0};
    std::mutex m; // with `idle`: waiting for inflight to drop to zero
    std::condition_variable idle;

    void enqueued() { inflight.fetch_add(1, std::memory_order_relaxed); }
    void finished() {
        {
            std::lock_guard<std::mutex> lock(m);
            inflight.fetch_sub(1, std::memory_order_release);
        }
        idle.notify_all();
    }
    // For a blocking call on the caller's thread: an empty lock on the fast path. With
    // timeout_s > 0 the wait for the collectives in flight gives up after it (PeerTimeoutError).
    std::unique_lock<std::mutex> serialize(double timeout_s = 0, const char* what = "") {
        if (inflight.load(std::memory_order_acquire) == 0) return {};
        return wait_idle_and_lock(timeout_s, what);
    }
    __attribute__((noinline)) std::unique_lock<std::mutex> wait_idle_and_lock(double timeout_s,
                                                                              const char* what) {
        wait_idle(timeout_s, what);
        return std::unique_lock<std::mutex>(mpi);
    }
    // Until no asynchronous collective is in flight (PeerTimeoutError after timeout_s > 0).
    void wait_idle(double timeout_s, const char* what) {
        if (inflight.load(std::memory_order_acquire) == 0) return;
        std::unique_lock<std::mutex> lock(m);
        const auto idle_now = [&] { return inflight.load(std::memory_order_acquire) == 0; };
        if (timeout_s <= 0)
            idle.wait(lock, idle_now);
        else if (!idle.wait_for(lock, std::chrono::duration<double>(timeout_s), idle_now))
            throw core::PeerTimeoutError(core::peer_timeout_message(
                std::string("the asynchronous collectives in flight before ") + what, timeout_s));
    }
};

// At namespace scope, not a function-local static: no initialisation guard on every blocking call.
// Only used after main() has started.
MpiSerializer g_mpi_serializer;
inline MpiSerializer& mpi_serializer() {
    return g_mpi_serializer;
}

struct Task {
    std::function<void()> run;
    std::shared_ptr<MpiWork> work;
};

// Shared by the communicator and its progress thread; the thread co-owns it, so a thread that has
// to be detached (see ~MpiCommunicator) never touches freed memory.
struct ProgressState {
    std::mutex m;
    std::condition_variable cv;
    std::deque<Task> queue;
    bool stop = false;
    bool running = false;
    MPI_Comm comm = MPI_COMM_NULL; // the progress thread's own duplicate

    // dist.timeout in seconds (0: no limit) and whether a wait has exceeded it. Once broken, a
    // collective stays pending forever (the progress thread may be stuck inside it), so every
    // later call fails at once with the first timeout's message instead of waiting again.
    std::atomic<double> timeout_s{0};
    std::atomic<bool> broken{false};
    std::string broken_reason; // under m
    void mark_broken(const std::string& why) {
        std::lock_guard<std::mutex> lock(m);
        if (!broken.load(std::memory_order_relaxed)) broken_reason = why;
        broken.store(true, std::memory_order_release);
    }
    bool usable() const { return !broken.load(std::memory_order_acquire); }
    core::PeerTimeoutError broken_error() {
        std::lock_guard<std::mutex> lock(m);
        return core::PeerTimeoutError("the MPI communicator cannot be used any more: " +
                                      broken_reason);
    }

    // Accounting per kind, one set of counters per writing thread: the caller's thread (blocking
    // calls) and the thread that runs asynchronous collectives (the progress thread, or the
    // caller itself at MPI_THREAD_SINGLE, when there is no progress thread). With a single writer
    // an update is a relaxed load and store, no locked read-modify-write: small collectives would
    // otherwise pay a measurable share for their accounting. stats() may read from any thread.
    struct Counters {
        std::atomic<std::uint64_t> calls{0}, bytes{0};
        std::atomic<double> seconds{0};
        __attribute__((always_inline)) void add(std::uint64_t b, double s) {
            calls.store(calls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
            bytes.store(bytes.load(std::memory_order_relaxed) + b, std::memory_order_relaxed);
            if (s != 0)
                seconds.store(seconds.load(std::memory_order_relaxed) + s,
                              std::memory_order_relaxed);
        }
    };
    std::array<Counters, kNumKinds> caller, async;
    // Caller's thread.
    void account(Kind kind, std::uint64_t bytes, double seconds = 0) {
        caller[static_cast<std::size_t>(kind)].add(bytes, seconds);
    }
    // Whichever thread runs asynchronous collectives.
    void account_async(Kind kind, std::uint64_t bytes, double seconds) {
        async[static_cast<std::size_t>(kind)].add(bytes, seconds);
    }
    std::map<std::string, CommStats> stats() const {
        std::map<std::string, CommStats> out;
        for (std::size_t k = 0; k < kNumKinds; ++k) {
            CommStats s;
            for (const Counters* c : {&caller[k], &async[k]}) {
                s.calls += c->calls.load(std::memory_order_relaxed);
                s.bytes += c->bytes.load(std::memory_order_relaxed);
                s.seconds += c->seconds.load(std::memory_order_relaxed);
            }
            if (s.calls > 0) out[kKindNames[k]] = s;
        }
        return out;
    }
};

void MpiWork::wait_done(std::unique_lock<std::mutex>& lock) {
    const auto finished = [&] { return done_; };
    if (timeout_s_ <= 0) {
        cv_.wait(lock, finished);
        return;
    }
    if (cv_.wait_for(lock, std::chrono::duration<double>(timeout_s_), finished)) return;
    lock.unlock();
    const std::string why = core::peer_timeout_message(what_, timeout_s_);
    if (state_) state_->mark_broken(why);
    throw core::PeerTimeoutError(why);
}

void progress_loop(std::shared_ptr<ProgressState> s) {
    for (;;) {
        Task task;
        {
            std::unique_lock<std::mutex> lock(s->m);
            s->cv.wait(lock, [&] { return s->stop || !s->queue.empty(); });
            if (s->queue.empty()) return; // stop requested and nothing left
            task = std::move(s->queue.front());
            s->queue.pop_front();
            s->running = true;
        }
        std::exception_ptr error;
        const auto t0 = Clock::now();
        try {
            if (!s->usable()) throw s->broken_error(); // never start what no peer will match
            std::lock_guard<std::mutex> mpi(mpi_serializer().mpi);
            task.run();
        } catch (...) {
            error = std::current_exception();
        }
        mpi_serializer().finished(); // done with MPI
        const double seconds = seconds_since(t0);
        {
            std::lock_guard<std::mutex> lock(s->m);
            s->running = false;
        }
        s->cv.notify_all();
        task.work->finish(error, seconds);
    }
}

class MpiCommunicator final : public Communicator {
  public:
    MpiCommunicator(MPI_Comm comm, torch::Device device, double timeout_s) : device_(device) {
        int level = MPI_THREAD_SINGLE;
        MPI_CHECK(MPI_Query_thread(&level));
        // Below MPI_THREAD_SERIALIZED no other thread may call MPI: asynchronous allreduces then
        // run at once on the caller's thread (no overlap). trainscope asks for that level only for
        // run.workload=comm, where nothing overlaps and Open MPI's per-call cost of the higher
        // levels would show in small-message latency (see mpi_runtime.hpp).
        threaded_ = level >= MPI_THREAD_SERIALIZED;
        MPI_CHECK(MPI_Comm_rank(comm, &rank_));
        MPI_CHECK(MPI_Comm_size(comm, &size_));
        // Two private duplicates: blocking collectives on the caller's thread and asynchronous
        // ones on the progress thread never share a communicator, so they cannot mismatch.
        MPI_CHECK(MPI_Comm_dup(comm, &comm_));
        state_ = std::make_shared<ProgressState>();
        state_->timeout_s.store(timeout_s);
        MPI_CHECK(MPI_Comm_dup(comm, &state_->comm));
        MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(state_->comm, MPI_ERRORS_RETURN);
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
                return;
            }
        }
        if (thread_.joinable()) thread_.join();
        MPI_Comm_free(&state_->comm);
        MPI_Comm_free(&comm_);
    }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string backend() const override { return "mpi"; }
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
                                  mpi_op(op), state->comm);
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
                    MPI_Request request = MPI_REQUEST_NULL;
                    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, tensor.data_ptr(),
                                             static_cast<int>(count), type, mpi_op(op), comm_,
                                             &request));
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
            MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, tensor.data_ptr(), static_cast<int>(count), type,
                                    mpi_op(op), comm_));
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
                          mpi_op(op), comm_);
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
        const MPI_Op mop = mpi_op(op);
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
        const MPI_Op mop = mpi_op(op);
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
    std::shared_ptr<ProgressState> state_;
    std::thread thread_;
};

} // namespace

std::unique_ptr<Communicator> make_communicator(const std::string& backend, MPI_Comm comm,
                                                torch::Device device, double timeout_s) {
    if (backend == "mpi") return std::make_unique<MpiCommunicator>(comm, device, timeout_s);
    if (backend == "nccl") {
#if TRAINSCOPE_HAVE_NCCL
        if (!device.is_cuda())
            throw core::ConfigError("dist.backend=nccl needs a CUDA device but this rank computes "
                                    "on " +
                                    device.str() + ": use dist.backend=mpi for CPU runs");
        return detail::make_nccl_communicator(comm, device, timeout_s);
#else
        throw core::ConfigError("dist.backend=nccl but this trainscope was built without NCCL: "
                                "use dist.backend=mpi, or rebuild with CUDA and NCCL available");
#endif
    }
    throw core::ConfigError("dist.backend = '" + backend +
                            "' is not a communicator backend; use "
                            "mpi or nccl");
}

} // namespace trainscope::dist
