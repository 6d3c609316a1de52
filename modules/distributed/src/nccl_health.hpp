// The NCCL communicator's error handling and device waits (internal to nccl_communicator.cpp,
// compiled only with NCCL): the CUDA_CHECK and NCCL_CHECK macros, dtype and reduction mapping,
// the event pools, and NcclHealth (the communicator's handle and fate shared with its Works)
// with the host waits bounded by dist.timeout.
#pragma once

#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/event_pool.hpp"

namespace trainscope::dist::detail {

[[noreturn]] inline void fail(const std::string& what, const char* file, int line) {
    throw core::DistributedError(what + " (" + file + ":" + std::to_string(line) + ")");
}

} // namespace trainscope::dist::detail

#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t trainscope_err_ = (call);                                                      \
        if (trainscope_err_ != cudaSuccess)                                                        \
            ::trainscope::dist::detail::fail(                                                      \
                std::string(#call) + " failed: " + cudaGetErrorString(trainscope_err_), __FILE__,  \
                __LINE__);                                                                         \
    } while (0)

#define NCCL_CHECK(call)                                                                           \
    do {                                                                                           \
        ncclResult_t trainscope_res_ = (call);                                                     \
        if (trainscope_res_ != ncclSuccess && trainscope_res_ != ncclInProgress)                   \
            ::trainscope::dist::detail::fail(                                                      \
                std::string(#call) + " failed: " + ncclGetErrorString(trainscope_res_) +           \
                    " (set NCCL_DEBUG=WARN for NCCL's reason)",                                    \
                __FILE__, __LINE__);                                                               \
    } while (0)

namespace trainscope::dist::detail {

using Clock = std::chrono::steady_clock;

inline ncclDataType_t nccl_type(torch::ScalarType t) {
    switch (t) {
    case torch::kFloat32:
        return ncclFloat32;
    case torch::kFloat64:
        return ncclFloat64;
    case torch::kFloat16:
        return ncclFloat16;
    case torch::kBFloat16:
        return ncclBfloat16;
    case torch::kInt32:
        return ncclInt32;
    case torch::kInt64:
        return ncclInt64;
    case torch::kUInt8:
        return ncclUint8;
    case torch::kInt8:
        return ncclInt8;
    default:
        break;
    }
    throw core::DistributedError(std::string("the NCCL backend cannot communicate ") +
                                 c10::toString(t) + " tensors");
}

inline ncclRedOp_t nccl_op(ReduceOp op, const torch::Tensor& t) {
    switch (op) {
    case ReduceOp::Sum:
        return ncclSum;
    case ReduceOp::Average:
        if (!t.is_floating_point())
            throw core::InternalError("ReduceOp::Average on an integer tensor: the mean would be "
                                      "truncated; reduce with Sum and divide");
        return ncclAvg;
    case ReduceOp::Max:
        return ncclMax;
    case ReduceOp::Min:
        return ncclMin;
    }
    return ncclSum;
}

inline Clock::time_point deadline_after(double seconds) {
    if (seconds <= 0) return Clock::time_point::max();
    return Clock::now() +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

using EventPoolPtr = std::shared_ptr<EventPool<cudaEvent_t>>;

// Events on `device`: with timing (Work::seconds, exposed_seconds, time_batch) or without
// (ordering only, cheaper to record and wait on).
inline EventPoolPtr make_event_pool(c10::DeviceIndex device, bool timing) {
    return std::make_shared<EventPool<cudaEvent_t>>(
        [device, timing] {
            c10::cuda::CUDAGuard guard(device);
            cudaEvent_t e = nullptr;
            CUDA_CHECK(
                cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
            return e;
        },
        [device](cudaEvent_t e) {
            c10::cuda::CUDAGuard guard(device);
            cudaEventDestroy(e);
        });
}

inline std::string async_error_message(ncclResult_t r) {
    return std::string("NCCL communicator failed asynchronously: ") + ncclGetErrorString(r) +
           " (a peer rank may have died; set NCCL_DEBUG=WARN)";
}

// The communicator's handle and fate, shared with its Works (issue 25, point 9).
// Invariant: every NCCL call on `comm` (an enqueue, ncclCommGetAsyncError, ncclCommFinalize,
// ncclCommDestroy, ncclCommAbort) and every CUDA event call of its collectives is made under `m`
// while `state` is Live (call(), check(), poll(), wait_ready()), and abort() and
// finalize_and_destroy() change the state under the same lock. Hence:
//   - NCCL never sees two threads on the communicator at once (its thread-safety rule), although
//     the watchdog's poll, autograd hooks' launches and the training thread's waits interleave;
//   - the abort happens once, whichever threads race to it (a wait timing out on the training
//     thread, the watchdog's poll, a destructor during unwinding): later callers find the state
//     Aborted and throw or report instead of touching the freed handle;
//   - after an abort no event of the communicator is queried, recorded, handed out or destroyed
//     again (the pools are abandoned: their events may belong to kernels that never ran);
//   - after the destruction nothing calls NCCL; Works that outlive the communicator throw.
// Nothing done under the lock blocks: the communicator is nonblocking, so every wait polls with
// the lock released between polls, and an abort from another thread gets its turn.
struct NcclHealth {
    enum class State { Live, Aborted, Destroyed };
    std::mutex m;
    ncclComm_t comm = nullptr; // set once ncclCommInitRankConfig returned it
    State state = State::Live;
    std::string why;                    // Aborted: what aborted it
    std::atomic<double> timeout_s{600}; // dist.timeout
    EventPoolPtr timing_events, plain_events;

    // fn() under the lock while live; otherwise DistributedError naming what ended it.
    template <class Fn> void call(const std::string& what, Fn&& fn) {
        std::lock_guard<std::mutex> lock(m);
        if (state != State::Live) throw gone(what);
        fn();
    }
    // Throws unless live and free of asynchronous errors (an error aborts it first).
    void check(const std::string& what) {
        std::lock_guard<std::mutex> lock(m);
        if (state != State::Live) throw gone(what);
        if (!comm) return;
        const ncclResult_t r = async_state_locked();
        if (r == ncclSuccess || r == ncclInProgress) return;
        const std::string reason = async_error_message(r);
        abort_locked(reason);
        throw core::DistributedError(reason);
    }
    // The watchdog's poll: "" while healthy (or in progress, or destroyed after a normal end),
    // else why the communicator cannot complete collectives, after aborting it.
    std::string poll() {
        std::lock_guard<std::mutex> lock(m);
        if (state == State::Aborted) return "the NCCL communicator was aborted (" + why + ")";
        if (state == State::Destroyed || !comm) return "";
        const ncclResult_t r = async_state_locked();
        if (r == ncclSuccess || r == ncclInProgress) return "";
        const std::string reason = async_error_message(r);
        abort_locked(reason);
        return reason;
    }
    // Polls until the communicator's last call (initialisation, an enqueue, finalize) completed
    // on the host; aborts it and throws PeerTimeoutError naming `what` after dist.timeout,
    // DistributedError on an NCCL error or when it is no longer live.
    void wait_ready(const std::string& what) {
        const auto deadline = deadline_after(timeout_s.load());
        for (;;) {
            {
                std::lock_guard<std::mutex> lock(m);
                if (state != State::Live) throw gone(what);
                const ncclResult_t r = async_state_locked();
                if (r == ncclSuccess) return;
                if (r != ncclInProgress) {
                    abort_locked(what + " failed");
                    throw core::DistributedError(what + " failed: " + ncclGetErrorString(r) +
                                                 " (set NCCL_DEBUG=WARN for NCCL's reason)");
                }
            }
            if (Clock::now() > deadline) throw timed_out(what);
            std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }
    // Aborts once (ncclCommAbort ends kernels waiting for a peer that will never come); a no-op
    // when no longer live.
    void abort(const std::string& reason) {
        std::lock_guard<std::mutex> lock(m);
        abort_locked(reason);
    }
    // The error of a wait for `what` that exceeded the timeout, after aborting the communicator.
    core::PeerTimeoutError timed_out(const std::string& what) {
        abort(what + " exceeded dist.timeout");
        return core::PeerTimeoutError(core::peer_timeout_message(what, timeout_s.load()) +
                                      " (the NCCL communicator was aborted)");
    }
    // A normal end: flushes the outstanding work (nonblocking finalize, polled with the
    // deadline), then frees the handle. A failure aborts instead (logged, not thrown: this runs
    // in a destructor).
    void finalize_and_destroy() {
        {
            std::lock_guard<std::mutex> lock(m);
            if (state != State::Live || !comm) return;
            const ncclResult_t r = ncclCommFinalize(comm);
            if (r != ncclSuccess && r != ncclInProgress) {
                abort_locked("ncclCommFinalize failed");
                core::log::warn() << "ncclCommFinalize failed: " << ncclGetErrorString(r)
                                  << "; the NCCL communicator was aborted";
                return;
            }
        }
        try {
            wait_ready("NCCL communicator finalize");
        } catch (const std::exception& e) {
            core::log::warn() << e.what();
            return; // aborted by wait_ready (or by another thread)
        }
        std::lock_guard<std::mutex> lock(m);
        if (state != State::Live) return;
        ncclCommDestroy(comm);
        comm = nullptr;
        state = State::Destroyed;
    }

  private:
    ncclResult_t async_state_locked() {
        ncclResult_t async = ncclSuccess;
        const ncclResult_t q = ncclCommGetAsyncError(comm, &async);
        return q != ncclSuccess ? q : async;
    }
    void abort_locked(const std::string& reason) {
        if (state != State::Live) return;
        state = State::Aborted;
        why = reason;
        if (timing_events) timing_events->abandon();
        if (plain_events) plain_events->abandon();
        if (comm) ncclCommAbort(comm);
    }
    core::DistributedError gone(const std::string& what) const {
        return core::DistributedError(
            what + ": the NCCL communicator " +
            (state == State::Aborted ? "was aborted (" + why + ")" : std::string("was destroyed")) +
            " and cannot be used any more");
    }
};

// Polls `event` (recorded on `device`) until it completed, checking NCCL's asynchronous errors
// meanwhile; aborts the communicator and throws PeerTimeoutError naming `what` after dist.timeout
// instead of blocking in the driver forever when a peer is gone.
inline void host_wait(NcclHealth& health, c10::DeviceIndex device, cudaEvent_t event,
                      const std::string& what) {
    const auto deadline = deadline_after(health.timeout_s.load());
    for (;;) {
        bool done = false;
        health.call(what, [&] {
            c10::cuda::CUDAGuard guard(device);
            const cudaError_t q = cudaEventQuery(event);
            if (q == cudaSuccess)
                done = true;
            else if (q != cudaErrorNotReady)
                CUDA_CHECK(q);
        });
        if (done) return;
        health.check(what);
        if (Clock::now() > deadline) throw health.timed_out(what);
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

// Seconds from `from` to `to` (both completed timing events); may be negative.
inline double elapsed_seconds(NcclHealth& health, c10::DeviceIndex device, cudaEvent_t from,
                              cudaEvent_t to, const std::string& what) {
    float ms = 0;
    health.call(what, [&] {
        c10::cuda::CUDAGuard guard(device);
        CUDA_CHECK(cudaEventElapsedTime(&ms, from, to));
    });
    return 1e-3 * static_cast<double>(ms);
}

} // namespace trainscope::dist::detail
