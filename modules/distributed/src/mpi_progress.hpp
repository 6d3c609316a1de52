// The MPI backend's asynchronous machinery: the progress thread that runs collectives on a
// duplicated communicator, their Work handles, the process-wide serializer that keeps MPI at
// MPI_THREAD_SERIALIZED, and the per-kind accounting. Internal to dist (mpi_communicator.cpp);
// the rules are at the top of mpi_communicator.cpp.
#pragma once

#include <mpi.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "trainscope/core/error.hpp"
#include "trainscope/core/mpi_util.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/hierarchical_allreduce.hpp"

namespace trainscope::dist::detail {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
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
extern MpiSerializer g_mpi_serializer;
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
    // dist.allreduce=hierarchical over `comm` (null: flat); lives as long as the thread may use it.
    std::unique_ptr<HierarchicalAllreduce> hierarchical;

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

// The progress thread's body: runs the queued tasks, one at a time, until stopped.
void progress_loop(std::shared_ptr<ProgressState> s);

// The MPI backend (mpi_communicator.cpp), for make_communicator.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, torch::Device device,
                                                    double timeout_s,
                                                    const AllreduceOptions& allreduce);

} // namespace trainscope::dist::detail
