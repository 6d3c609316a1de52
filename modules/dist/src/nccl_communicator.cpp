// The NCCL communicator (compiled only in builds with NCCL): GPU collectives on a dedicated CUDA
// stream that first waits for the caller's compute stream; Work::wait() makes the compute stream
// wait for the collective in turn, so nothing synchronises the host in the training loop.
//
// dist.timeout: the communicator is created nonblocking (ncclConfig_t::blocking = 0), so neither
// ncclCommInitRankConfig nor an enqueue can block the host forever in NCCL: both return
// ncclInProgress and we poll ncclCommGetAsyncError until the communicator is ready, with the
// deadline. Every host wait on the device (barrier, Work::seconds, synchronize) polls a CUDA event
// and NCCL's asynchronous error with the deadline too, and the MPI traffic on the side (the
// unique id's broadcast, allreduce_host) is nonblocking and bounded (core::wait_for_peers). On
// expiry the communicator is aborted (ncclCommAbort ends kernels waiting for an absent peer) and
// the wait throws core::PeerTimeoutError. Needs a GPU: compiled and linked everywhere, exercised
// only on GPU machines (docs/faults.md says what holds where).
#include "nccl_communicator.hpp"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <torch/torch.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "mpi_check.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/core/mpi_util.hpp"
#include "trainscope/core/nvtx.hpp"

namespace trainscope::dist::detail {
namespace {

[[noreturn]] void fail(const std::string& what, const char* file, int line) {
    throw core::DistributedError(what + " (" + file + ":" + std::to_string(line) + ")");
}

} // namespace
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
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(torch::ScalarType t) {
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

ncclRedOp_t nccl_op(ReduceOp op, const torch::Tensor& t) {
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

Clock::time_point deadline_after(double seconds) {
    if (seconds <= 0) return Clock::time_point::max();
    return Clock::now() +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// The communicator's fate, shared with its Works: a wait that times out (on any thread) aborts it
// once, and nothing may be finalized afterwards.
struct NcclHealth {
    std::mutex m;
    ncclComm_t comm = nullptr;
    bool aborted = false;
    double timeout_s = 600; // dist.timeout
    void abort() {
        std::lock_guard<std::mutex> lock(m);
        if (aborted || !comm) return;
        aborted = true;
        ncclCommAbort(comm); // unblocks kernels waiting for a peer that will never come
    }
    // The error of a wait for `what` that exceeded the timeout, after aborting the communicator.
    core::PeerTimeoutError timed_out(const std::string& what) {
        abort();
        return core::PeerTimeoutError(core::peer_timeout_message(what, timeout_s) +
                                      " (the NCCL communicator was aborted)");
    }
};

void check_async_error(ncclComm_t comm) {
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ncclCommGetAsyncError(comm, &async));
    if (async != ncclSuccess && async != ncclInProgress)
        throw core::DistributedError(std::string("NCCL communicator failed asynchronously: ") +
                                     ncclGetErrorString(async) +
                                     " (a peer rank may have died; set NCCL_DEBUG=WARN)");
}

class NcclWork final : public Work {
  public:
    // start/done: timing events around the collective on the communicator's stream (null for a
    // no-op). timeout_s: how long host_wait() may block before it aborts the communicator.
    NcclWork(cudaEvent_t start, cudaEvent_t done, c10::DeviceIndex device,
             std::shared_ptr<NcclHealth> health, const char* what)
        : start_(start), done_(done), device_(device), comm_(health->comm),
          timeout_s_(health->timeout_s), health_(std::move(health)), what_(what) {}
    ~NcclWork() override {
        // Safe while pending: the driver releases an event once its work completed.
        if (start_) cudaEventDestroy(start_);
        if (done_) cudaEventDestroy(done_);
    }
    void wait() override {
        if (!done_) return;
        c10::cuda::CUDAGuard guard(device_);
        CUDA_CHECK(
            cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(device_).stream(), done_, 0));
        check_async_error(comm_);
    }
    bool completed() override {
        if (!done_) return true;
        c10::cuda::CUDAGuard guard(device_);
        const cudaError_t q = cudaEventQuery(done_);
        if (q == cudaSuccess) return true;
        if (q != cudaErrorNotReady) CUDA_CHECK(q);
        check_async_error(comm_);
        return false;
    }
    // Host-side wait that keeps checking NCCL's asynchronous error state instead of blocking in
    // the driver forever when a peer is gone (used by barrier()).
    // A collective still pending after timeout_s (a peer stopped without an NCCL error, e.g. it
    // is stuck or its network is down) aborts the communicator, so the wait ends with an error.
    void host_wait() {
        const auto deadline = deadline_after(timeout_s_);
        while (!completed()) {
            if (Clock::now() > deadline)
                throw health_->timed_out(std::string("an NCCL ") + what_ + " (on the GPU)");
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }
    double seconds() override {
        if (!done_ || !start_) return 0;
        host_wait();
        c10::cuda::CUDAGuard guard(device_);
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start_, done_));
        return 1e-3 * ms;
    }

  private:
    cudaEvent_t start_ = nullptr;
    cudaEvent_t done_ = nullptr;
    c10::DeviceIndex device_;
    ncclComm_t comm_;
    double timeout_s_;
    std::shared_ptr<NcclHealth> health_;
    const char* what_; // the collective's kind, for a timeout's message
};

class NcclCommunicator final : public Communicator {
  public:
    NcclCommunicator(MPI_Comm comm, torch::Device device, double timeout_s)
        : device_(device),
          stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index())),
          health_(std::make_shared<NcclHealth>()) {
        health_->timeout_s = timeout_s;
        MPI_CHECK(MPI_Comm_rank(comm, &rank_));
        MPI_CHECK(MPI_Comm_size(comm, &size_));
        c10::cuda::CUDAGuard guard(device_.index());
        CUDA_CHECK(cudaSetDevice(device_.index())); // NCCL binds the communicator to this device
        // Rank 0's id travels with its status, so a failure there does not leave the other ranks
        // waiting in ncclCommInitRank.
        // On the heap: a timed-out broadcast may still write into it (core::wait_for_peers).
        struct Boot {
            int status = ncclSuccess;
            ncclUniqueId id{};
        };
        auto boot_buffer = std::make_unique<Boot>();
        Boot& boot = *boot_buffer;
        if (rank_ == 0) boot.status = ncclGetUniqueId(&boot.id);
        MPI_Request request = MPI_REQUEST_NULL;
        MPI_CHECK(MPI_Ibcast(&boot, sizeof(boot), MPI_BYTE, 0, comm, &request));
        core::wait_for_peers(request, boot_buffer, timeout_s,
                             "the broadcast of NCCL's unique id (NCCL communicator set-up)");
        if (boot.status != ncclSuccess)
            throw core::DistributedError(
                std::string("ncclGetUniqueId failed on rank 0: ") +
                ncclGetErrorString(static_cast<ncclResult_t>(boot.status)) +
                " (set NCCL_DEBUG=WARN; check the network interfaces NCCL may use)");
        // Nonblocking: ncclCommInitRankConfig returns at once (ncclInProgress) and the connection
        // to the peers is polled with the deadline, so a peer that never arrives costs
        // dist.timeout, not a hang.
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        NCCL_CHECK(ncclCommInitRankConfig(&comm_, size_, boot.id, rank_, &config));
        health_->comm = comm_;
        wait_ready("NCCL communicator initialisation (ncclCommInitRankConfig)");
        MPI_CHECK(MPI_Comm_dup(comm, &host_comm_)); // allreduce_host: control traffic
    }

    ~NcclCommunicator() override {
        if (host_comm_ != MPI_COMM_NULL && std::uncaught_exceptions() == 0 && !host_broken_)
            MPI_Comm_free(&host_comm_);
        if (!comm_ || is_aborted()) return;
        if (std::uncaught_exceptions() > 0) {
            health_->abort(); // a peer may be gone: do not wait for outstanding work
            return;
        }
        // Nonblocking finalize: flushes outstanding work, polled with the deadline.
        const ncclResult_t r = ncclCommFinalize(comm_);
        try {
            if (r == ncclSuccess || r == ncclInProgress) wait_ready("NCCL communicator finalize");
        } catch (const std::exception& e) {
            core::log::warn() << e.what();
            return; // aborted by wait_ready
        }
        if (!is_aborted()) ncclCommDestroy(comm_);
    }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string backend() const override { return "nccl"; }
    void set_timeout(double seconds) override { health_->timeout_s = seconds; }
    std::string poll_async_error() override {
        {
            std::lock_guard<std::mutex> lock(health_->m);
            if (!comm_) return "";
            if (health_->aborted) return "the NCCL communicator was aborted";
        }
        ncclResult_t async = ncclSuccess;
        const ncclResult_t q = ncclCommGetAsyncError(comm_, &async);
        if (q == ncclSuccess && (async == ncclSuccess || async == ncclInProgress)) return "";
        health_->abort();
        return std::string("NCCL communicator failed asynchronously: ") +
               ncclGetErrorString(q != ncclSuccess ? q : async) +
               " (a peer rank may have died; set NCCL_DEBUG=WARN)";
    }

    void synchronize(const char* what) override {
        c10::cuda::CUDAGuard guard(device_.index());
        cudaEvent_t reached = nullptr;
        CUDA_CHECK(cudaEventCreateWithFlags(&reached, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventRecord(reached, c10::cuda::getCurrentCUDAStream(device_.index())));
        const auto deadline = deadline_after(health_->timeout_s);
        for (;;) {
            const cudaError_t q = cudaEventQuery(reached);
            if (q == cudaSuccess) break;
            if (q != cudaErrorNotReady) {
                cudaEventDestroy(reached);
                CUDA_CHECK(q);
            }
            check_async_error(comm_);
            if (Clock::now() > deadline) {
                cudaEventDestroy(reached); // released by the driver once the work completes
                throw health_->timed_out(std::string("the GPU work ") + what +
                                         " waits for (NCCL collectives included)");
            }
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        CUDA_CHECK(cudaEventDestroy(reached));
    }
    torch::Device device() const override { return device_; }

    std::shared_ptr<Work> allreduce_async(torch::Tensor tensor, ReduceOp op) override {
        check(tensor, "allreduce");
        const ncclRedOp_t red = nccl_op(op, tensor);
        if (tensor.numel() == 0)
            return std::make_shared<NcclWork>(nullptr, nullptr, device_.index(), health_,
                                              "allreduce");
        return launch("allreduce", tensor.nbytes(), {tensor}, [&](cudaStream_t s) {
            NCCL_CHECK(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(),
                                     static_cast<size_t>(tensor.numel()),
                                     nccl_type(tensor.scalar_type()), red, comm_, s));
        });
    }

    void allreduce_host(std::vector<double>& values, ReduceOp op) override {
        if (values.empty()) return;
        const MPI_Op mop = op == ReduceOp::Max ? MPI_MAX : op == ReduceOp::Min ? MPI_MIN : MPI_SUM;
        if (host_broken_)
            throw core::PeerTimeoutError("the MPI communicator beside NCCL cannot be used any "
                                         "more: an earlier host-side allreduce timed out");
        // Nonblocking and bounded: a few numbers per call, so MPI's slower nonblocking algorithms
        // cost nothing that shows. On the heap: a timed-out allreduce may still write into it.
        auto buffer = std::make_unique<std::vector<double>>(values);
        MPI_Request request = MPI_REQUEST_NULL;
        MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buffer->data(), static_cast<int>(buffer->size()),
                                 MPI_DOUBLE, mop, host_comm_, &request));
        try {
            core::wait_for_peers(request, buffer, health_->timeout_s,
                                 "a host-side MPI allreduce (the ranks' per-iteration agreement, "
                                 "progress totals or evaluation sums)");
        } catch (const core::PeerTimeoutError&) {
            host_broken_ = true; // its collective stays pending
            throw;
        }
        values = *buffer;
        if (op == ReduceOp::Average)
            for (double& v : values)
                v /= size_;
    }

    void broadcast(torch::Tensor tensor, int root) override {
        check(tensor, "broadcast");
        if (root < 0 || root >= size_)
            throw core::InternalError("broadcast root " + std::to_string(root) + " outside [0, " +
                                      std::to_string(size_) + ")");
        if (tensor.numel() == 0) return;
        launch("broadcast", tensor.nbytes(), {tensor}, [&](cudaStream_t s) {
            NCCL_CHECK(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(),
                                     static_cast<size_t>(tensor.numel()),
                                     nccl_type(tensor.scalar_type()), root, comm_, s));
        })->wait();
    }

    void allgather(const torch::Tensor& in, torch::Tensor out) override {
        check(out, "allgather output");
        if (out.numel() != in.numel() * size_ || out.scalar_type() != in.scalar_type())
            throw core::InternalError("allgather: output must hold size() x input elements of the "
                                      "same dtype");
        if (in.numel() == 0) return;
        torch::Tensor src = in.contiguous(); // on the compute stream, before the launch event
        launch("allgather", src.nbytes(), {src, out}, [&](cudaStream_t s) {
            NCCL_CHECK(ncclAllGather(src.data_ptr(), out.data_ptr(),
                                     static_cast<size_t>(src.numel()), nccl_type(src.scalar_type()),
                                     comm_, s));
        })->wait();
    }

    void reduce_scatter(const torch::Tensor& in, torch::Tensor out, ReduceOp op) override {
        check(out, "reduce_scatter output");
        const ncclRedOp_t red = nccl_op(op, out);
        if (in.numel() != out.numel() * size_ || out.scalar_type() != in.scalar_type())
            throw core::InternalError("reduce_scatter: input must hold size() x output elements "
                                      "of the same dtype; pad to an exact split");
        if (out.numel() == 0) return;
        torch::Tensor src = in.contiguous();
        launch("reduce_scatter", out.nbytes(), {src, out}, [&](cudaStream_t s) {
            NCCL_CHECK(ncclReduceScatter(src.data_ptr(), out.data_ptr(),
                                         static_cast<size_t>(out.numel()),
                                         nccl_type(out.scalar_type()), red, comm_, s));
        })->wait();
    }

    std::shared_ptr<Work> allgather_async(const torch::Tensor& in, torch::Tensor out) override {
        check(out, "allgather output");
        if (out.numel() != in.numel() * size_ || out.scalar_type() != in.scalar_type())
            throw core::InternalError("allgather_async: output must hold size() x input elements "
                                      "of the same dtype");
        if (in.numel() == 0)
            return std::make_shared<NcclWork>(nullptr, nullptr, device_.index(), health_,
                                              "allgather");
        torch::Tensor src = in.contiguous();
        return launch("allgather", src.nbytes(), {src, out}, [&](cudaStream_t s) {
            NCCL_CHECK(ncclAllGather(src.data_ptr(), out.data_ptr(),
                                     static_cast<size_t>(src.numel()), nccl_type(src.scalar_type()),
                                     comm_, s));
        });
    }

    std::shared_ptr<Work> reduce_scatter_async(const torch::Tensor& in, torch::Tensor out,
                                               ReduceOp op) override {
        check(out, "reduce_scatter output");
        const ncclRedOp_t red = nccl_op(op, out);
        if (in.numel() != out.numel() * size_ || out.scalar_type() != in.scalar_type())
            throw core::InternalError("reduce_scatter_async: input must hold size() x output "
                                      "elements of the same dtype; pad to an exact split");
        if (out.numel() == 0)
            return std::make_shared<NcclWork>(nullptr, nullptr, device_.index(), health_,
                                              "reduce_scatter");
        torch::Tensor src = in.contiguous();
        return launch("reduce_scatter", out.nbytes(), {src, out}, [&](cudaStream_t s) {
            NCCL_CHECK(ncclReduceScatter(src.data_ptr(), out.data_ptr(),
                                         static_cast<size_t>(out.numel()),
                                         nccl_type(out.scalar_type()), red, comm_, s));
        });
    }

    void barrier() override {
        // A one-element allreduce, waited for on the host (so it is a real barrier).
        auto token = torch::zeros({1}, torch::TensorOptions().dtype(torch::kInt32).device(device_));
        auto work = launch("barrier", 0, {token}, [&](cudaStream_t s) {
            NCCL_CHECK(
                ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclInt32, ncclSum, comm_, s));
        });
        work->host_wait();
    }

    void send(const torch::Tensor& t, int peer) override {
        check(t, "send");
        check_peer(peer, "send");
        if (t.numel() == 0) return;
        launch("send", t.nbytes(), {t}, [&](cudaStream_t s) {
            NCCL_CHECK(ncclSend(t.data_ptr(), static_cast<size_t>(t.numel()),
                                nccl_type(t.scalar_type()), peer, comm_, s));
        })->wait();
    }

    void recv(torch::Tensor t, int peer) override {
        check(t, "recv");
        check_peer(peer, "recv");
        if (t.numel() == 0) return;
        launch("recv", t.nbytes(), {t}, [&](cudaStream_t s) {
            NCCL_CHECK(ncclRecv(t.data_ptr(), static_cast<size_t>(t.numel()),
                                nccl_type(t.scalar_type()), peer, comm_, s));
        })->wait();
    }

    std::map<std::string, CommStats> stats() const override {
        std::lock_guard<std::mutex> lock(mutex_);
        return stats_;
    }

  private:
    MPI_Comm host_comm_ = MPI_COMM_NULL;
    void check(const torch::Tensor& t, const char* what) const {
        if (!t.defined() || !t.is_contiguous())
            throw core::InternalError(std::string(what) +
                                      ": tensor must be defined and contiguous");
        if (t.device() != device_)
            throw core::InternalError(std::string(what) + ": tensor on " + t.device().str() +
                                      " but the NCCL communicator works on " + device_.str());
        nccl_type(t.scalar_type());
    }

    void check_peer(int peer, const char* what) const {
        if (peer < 0 || peer >= size_ || peer == rank_)
            throw core::InternalError(std::string(what) + " peer " + std::to_string(peer) +
                                      " is not another rank of [0, " + std::to_string(size_) +
                                      ") (this is rank " + std::to_string(rank_) + ")");
    }

    // Orders the collective after the work already queued on the caller's current stream, runs
    // it on our stream, and returns a handle whose wait() orders later compute work after it.
    template <class Fn>
    std::shared_ptr<NcclWork> launch(const char* kind, std::uint64_t bytes,
                                     std::initializer_list<torch::Tensor> tensors, Fn&& enqueue) {
        // Hooks may call from autograd's device thread while the main thread is blocked in
        // backward; NCCL calls on one communicator must not run concurrently.
        std::lock_guard<std::mutex> lock(mutex_);
        nvtx::ScopedRange range(kind); // the enqueue on the host; the kernel shows on the GPU row
        const auto t0 = Clock::now();
        c10::cuda::CUDAGuard guard(device_.index());
        cudaStream_t compute = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
        cudaEvent_t ready = nullptr, start = nullptr, done = nullptr;
        CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventRecord(ready, compute));
        CUDA_CHECK(cudaStreamWaitEvent(stream_.stream(), ready, 0));
        CUDA_CHECK(cudaEventDestroy(ready));
        // Timing events bracket only the collective: `start` completes once the stream has
        // passed the wait for the compute stream, so Work::seconds() excludes that wait.
        CUDA_CHECK(cudaEventCreateWithFlags(&start, cudaEventDefault));
        CUDA_CHECK(cudaEventRecord(start, stream_.stream()));
        // The caching allocator must not hand these blocks out again until our stream is done.
        for (const torch::Tensor& t : tensors)
            c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
        enqueue(stream_.stream());
        // Nonblocking communicator: the enqueue may still be in progress; the events recorded
        // next must follow the collective's kernel on the stream.
        wait_ready(kind);
        CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDefault));
        CUDA_CHECK(cudaEventRecord(done, stream_.stream()));
        if (bytes > 0) {
            CommStats& s = stats_[kind];
            s.calls += 1;
            s.bytes += bytes;
            s.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
        }
        return std::make_shared<NcclWork>(start, done, device_.index(), health_, kind);
    }

    bool is_aborted() {
        std::lock_guard<std::mutex> lock(health_->m);
        return health_->aborted;
    }

    // Polls the nonblocking communicator until its last call (initialisation, an enqueue,
    // finalize) has completed on the host; aborts it and throws PeerTimeoutError naming `what`
    // after dist.timeout, DistributedError on an NCCL error.
    void wait_ready(const char* what) {
        const auto deadline = deadline_after(health_->timeout_s);
        for (;;) {
            ncclResult_t state = ncclSuccess;
            NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
            if (state == ncclSuccess) return;
            if (state != ncclInProgress) {
                health_->abort();
                throw core::DistributedError(std::string(what) +
                                             " failed: " + ncclGetErrorString(state) +
                                             " (set NCCL_DEBUG=WARN for NCCL's reason)");
            }
            if (Clock::now() > deadline) throw health_->timed_out(what);
            std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }

    torch::Device device_;
    c10::cuda::CUDAStream stream_; // where our collectives run
    int rank_ = 0, size_ = 1;
    ncclComm_t comm_ = nullptr;
    // dist.timeout and whether the communicator was aborted (poll_async_error runs on the
    // watchdog thread; a timed-out wait aborts it): nothing may be finalized afterwards.
    std::shared_ptr<NcclHealth> health_;
    bool host_broken_ = false; // an allreduce_host timed out: its collective stays pending
    mutable std::mutex mutex_;
    std::map<std::string, CommStats> stats_;
};

} // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, torch::Device device,
                                                     double timeout_s) {
    if (!device.has_index()) device = torch::Device(torch::kCUDA, c10::cuda::current_device());
    return std::make_unique<NcclCommunicator>(comm, device, timeout_s);
}

} // namespace trainscope::dist::detail
