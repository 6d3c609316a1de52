// The NCCL communicator (compiled only in builds with NCCL): GPU collectives on a dedicated CUDA
// stream that first waits for the caller's compute stream; Work::wait() makes the compute stream
// wait for the collective in turn, so nothing synchronises the host in the training loop.
// Ordering and timing use CUDA events from two pools (timing / ordering only), so no event is
// created per operation once the pools are warm; asynchronous collectives carry timing events
// (Work::seconds: device time on our stream; Work::exposed_seconds: how long the waiting stream
// stalled), blocking calls only an ordering event.
//
// dist.timeout: the communicator is created nonblocking (ncclConfig_t::blocking = 0), so neither
// the initialisation (ncclCommInitRankScalable with ceil(sqrt(N)) roots where NCCL >= 2.23 has it,
// else ncclCommInitRankConfig) nor an enqueue can block the host forever in NCCL: both return
// ncclInProgress and we poll ncclCommGetAsyncError until the communicator is ready, with the
// deadline. Every host wait on the device (barrier, Work::seconds, synchronize, time_batch) polls
// a CUDA event and NCCL's asynchronous error with the deadline too, and the MPI traffic on the
// side (the unique ids' exchange, allreduce_host) is nonblocking and bounded
// (core::wait_for_peers). On expiry the communicator is aborted (ncclCommAbort ends kernels
// waiting for an absent peer) and the wait throws core::PeerTimeoutError. After an abort (by any
// thread, once) or the destruction nothing touches the handle or its events again: see
// NcclHealth. Needs a GPU: compiled and linked everywhere, exercised only on GPU machines
// (docs/faults.md and docs/gpu.md say what holds where).
#include "nccl_communicator.hpp"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mpi_check.hpp"
#include "nccl_health.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/core/mpi_util.hpp"
#include "trainscope/core/nvtx.hpp"

namespace trainscope::dist::detail {
namespace {

class NcclCommunicator;

class NcclWork final : public Work {
  public:
    // A no-op until launch() gives it events: `done`, the collective's end on the communicator's
    // stream, and for a timed launch `start` (then `done` is a timing event too).
    NcclWork(c10::DeviceIndex device, std::shared_ptr<NcclHealth> health, const char* what)
        : device_(device), health_(std::move(health)), what_(what) {}
    ~NcclWork() override {
        // Back to their pools, which drop them untouched after an abort: no CUDA call here.
        if (start_) health_->timing_events->release(start_);
        if (reached_) health_->timing_events->release(reached_);
        if (done_) (start_ ? health_->timing_events : health_->plain_events)->release(done_);
    }
    void wait() override {
        if (!done_) return;
        health_->call(std::string("waiting for an NCCL ") + what_, [&] {
            c10::cuda::CUDAGuard guard(device_);
            cudaStream_t s = c10::cuda::getCurrentCUDAStream(device_).stream();
            if (start_ && !reached_) { // where the waiting stream reached its first wait
                reached_ = health_->timing_events->acquire();
                CUDA_CHECK(cudaEventRecord(reached_, s));
            }
            CUDA_CHECK(cudaStreamWaitEvent(s, done_, 0));
        });
        health_->check(std::string("an NCCL ") + what_);
    }
    bool completed() override {
        if (!done_) return true;
        bool done = false;
        health_->call(std::string("querying an NCCL ") + what_, [&] {
            c10::cuda::CUDAGuard guard(device_);
            const cudaError_t q = cudaEventQuery(done_);
            if (q == cudaSuccess)
                done = true;
            else if (q != cudaErrorNotReady)
                CUDA_CHECK(q);
        });
        if (!done) health_->check(std::string("an NCCL ") + what_);
        return done;
    }
    // Host-side wait (barrier()): bounded by dist.timeout, see the free host_wait().
    void host_wait() {
        if (done_) detail::host_wait(*health_, device_, done_, what_on_gpu());
    }
    double seconds() override {
        if (!start_) return 0; // a no-op (an untimed launch's handle never leaves this file)
        host_wait();
        return elapsed_seconds(*health_, device_, start_, done_, what_on_gpu());
    }
    double exposed_seconds() override {
        if (!reached_) return 0; // not waited for yet, a no-op or untimed
        host_wait();
        detail::host_wait(*health_, device_, reached_, what_on_gpu());
        return exposed_wait_seconds(
            elapsed_seconds(*health_, device_, reached_, done_, what_on_gpu()));
    }

  private:
    friend class NcclCommunicator; // launch() sets the events
    std::string what_on_gpu() const { return std::string("an NCCL ") + what_ + " (on the GPU)"; }

    cudaEvent_t start_ = nullptr;   // timed launches: the collective's start (timing event)
    cudaEvent_t done_ = nullptr;    // its end, on the communicator's stream
    cudaEvent_t reached_ = nullptr; // the waiting stream at the first wait() (timed launches)
    c10::DeviceIndex device_;
    std::shared_ptr<NcclHealth> health_;
    const char* what_; // the collective's kind, for messages
};

// An event of a pool for the span of a scope (released on every path).
class PooledEvent {
  public:
    explicit PooledEvent(EventPoolPtr pool) : pool_(std::move(pool)), event_(pool_->acquire()) {}
    ~PooledEvent() { pool_->release(event_); }
    PooledEvent(const PooledEvent&) = delete;
    PooledEvent& operator=(const PooledEvent&) = delete;
    cudaEvent_t get() const { return event_; }

  private:
    EventPoolPtr pool_;
    cudaEvent_t event_;
};

class NcclCommunicator final : public Communicator {
  public:
    NcclCommunicator(MPI_Comm comm, torch::Device device, double timeout_s)
        : device_(device),
          stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index())),
          health_(std::make_shared<NcclHealth>()) {
        health_->timeout_s = timeout_s;
        health_->timing_events = make_event_pool(device_.index(), /*timing=*/true);
        health_->plain_events = make_event_pool(device_.index(), /*timing=*/false);
        MPI_CHECK(MPI_Comm_rank(comm, &rank_));
        MPI_CHECK(MPI_Comm_size(comm, &size_));
        c10::cuda::CUDAGuard guard(device_.index());
        CUDA_CHECK(cudaSetDevice(device_.index())); // NCCL binds the communicator to this device
        // The roots' ids travel with their status, so a failure there does not leave the other
        // ranks waiting in NCCL's initialisation.
        // On the heap: a timed-out exchange may still write into it (core::wait_for_peers).
        struct Boot {
            int status = ncclSuccess;
            ncclUniqueId id{};
        };
        static_assert(sizeof(Boot) == sizeof(int) + sizeof(ncclUniqueId), "Boot has padding");
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 23, 0)
        // Issue 39: ncclCommInitRankScalable with ceil(sqrt(N)) unique ids, the i-th made by
        // rank floor(i * N / roots), the first rank of the i-th of `roots` equal groups: NCCL's
        // bootstrap spreads over the roots instead of every rank contacting rank 0 (4 roots at
        // 16 ranks, 128 at 16,384).
        const int roots =
            std::min(size_, static_cast<int>(std::ceil(std::sqrt(static_cast<double>(size_)))));
        const char* init_call = "ncclCommInitRankScalable";
#else
        const int roots = 1; // this NCCL has one root only (ncclCommInitRankConfig)
        const char* init_call = "ncclCommInitRankConfig";
#endif
        auto root_of = [&](int i) {
            return static_cast<int>(static_cast<std::int64_t>(i) * size_ / roots);
        };
        // Every byte zero (status 0, id{}; no padding in Boot): the exchange ORs bytes.
        auto boot_buffer = std::make_unique<std::vector<Boot>>(static_cast<std::size_t>(roots));
        std::vector<Boot>& boot = *boot_buffer;
        for (int i = 0; i < roots; ++i)
            if (root_of(i) == rank_)
                boot[static_cast<std::size_t>(i)].status =
                    ncclGetUniqueId(&boot[static_cast<std::size_t>(i)].id);
        // One collective for all the roots' ids: each slot is non-zero on its root only.
        MPI_Request request = MPI_REQUEST_NULL;
        MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, boot.data(), static_cast<int>(roots * sizeof(Boot)),
                                 MPI_BYTE, MPI_BOR, comm, &request));
        core::wait_for_peers(request, boot_buffer, timeout_s,
                             "the exchange of NCCL's unique ids (NCCL communicator set-up)");
        std::vector<ncclUniqueId> ids;
        for (int i = 0; i < roots; ++i) {
            const Boot& b = boot[static_cast<std::size_t>(i)];
            if (b.status != ncclSuccess)
                throw core::DistributedError(
                    "ncclGetUniqueId failed on rank " + std::to_string(root_of(i)) + ": " +
                    ncclGetErrorString(static_cast<ncclResult_t>(b.status)) +
                    " (set NCCL_DEBUG=WARN; check the network interfaces NCCL may use)");
            ids.push_back(b.id);
        }
        // Nonblocking: the initialisation returns at once (ncclInProgress) and the connection
        // to the peers is polled with the deadline, so a peer that never arrives costs
        // dist.timeout, not a hang.
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        {
            std::lock_guard<std::mutex> lock(health_->m);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 23, 0)
            NCCL_CHECK(
                ncclCommInitRankScalable(&health_->comm, size_, rank_, roots, ids.data(), &config));
#else
            NCCL_CHECK(ncclCommInitRankConfig(&health_->comm, size_, ids[0], rank_, &config));
#endif
            comm_ = health_->comm;
        }
        health_->wait_ready(std::string("NCCL communicator initialisation (") + init_call + ")");
        MPI_CHECK(MPI_Comm_dup(comm, &host_comm_)); // allreduce_host: control traffic
    }

    ~NcclCommunicator() override {
        if (host_comm_ != MPI_COMM_NULL && std::uncaught_exceptions() == 0 && !host_broken_)
            MPI_Comm_free(&host_comm_);
        if (std::uncaught_exceptions() > 0) {
            // A peer may be gone: do not wait for outstanding work.
            health_->abort("the communicator was destroyed while an error unwound");
            return;
        }
        health_->finalize_and_destroy();
    }

    int rank() const override {
        return rank_;
    }
    int size() const override {
        return size_;
    }
    std::string backend() const override {
        return "nccl";
    }
    void set_timeout(double seconds) override {
        health_->timeout_s = seconds;
    }
    std::string poll_async_error() override {
        std::string failure = health_->poll();
        if (!failure.empty()) return failure;
        // The lanes this communicator made (FSDP's all-gather lane): the run's watchdog polls only
        // the main communicator, and a lane's failure would otherwise surface as a timeout of
        // whatever waits for it (or never, without dist.timeout).
        std::lock_guard<std::mutex> lock(lanes_mutex_);
        for (const std::weak_ptr<NcclHealth>& weak : lanes_)
            if (std::shared_ptr<NcclHealth> lane = weak.lock())
                if (failure = lane->poll(); !failure.empty()) return "a lane: " + failure;
        return "";
    }

    void synchronize(const char* what) override {
        const std::string why =
            std::string("the GPU work ") + what + " waits for (NCCL collectives included)";
        PooledEvent reached(health_->plain_events);
        health_->call(why, [&] {
            c10::cuda::CUDAGuard guard(device_.index());
            CUDA_CHECK(
                cudaEventRecord(reached.get(), c10::cuda::getCurrentCUDAStream(device_.index())));
        });
        host_wait(*health_, device_.index(), reached.get(), why);
    }

    double time_batch(const std::function<void()>& ops) override {
        PooledEvent begin(health_->timing_events), end(health_->timing_events);
        const char* what = "a timed batch of NCCL operations";
        {
            std::lock_guard<std::mutex> lock(mutex_);
            health_->call(what, [&] {
                c10::cuda::CUDAGuard guard(device_.index());
                order_after_caller();
                CUDA_CHECK(cudaEventRecord(begin.get(), stream_.stream()));
            });
        }
        ops();
        {
            std::lock_guard<std::mutex> lock(mutex_);
            health_->call(what, [&] {
                c10::cuda::CUDAGuard guard(device_.index());
                CUDA_CHECK(cudaEventRecord(end.get(), stream_.stream()));
            });
        }
        host_wait(*health_, device_.index(), end.get(), what);
        return elapsed_seconds(*health_, device_.index(), begin.get(), end.get(), what);
    }
    torch::Device device() const override {
        return device_;
    }

    std::shared_ptr<Work> allreduce_async(torch::Tensor tensor, ReduceOp op) override {
        check(tensor, "allreduce");
        const ncclRedOp_t red = nccl_op(op, tensor);
        if (tensor.numel() == 0) return no_op("allreduce");
        return launch(
            "allreduce", tensor.nbytes(), {tensor},
            [&](cudaStream_t s) {
                NCCL_CHECK(ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(),
                                         static_cast<size_t>(tensor.numel()),
                                         nccl_type(tensor.scalar_type()), red, comm_, s));
            },
            /*timed=*/true);
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
            core::wait_for_peers(request, buffer, health_->timeout_s.load(),
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
        if (auto work = allgather_work(in, out, "allgather", /*timed=*/false)) work->wait();
    }

    void reduce_scatter(const torch::Tensor& in, torch::Tensor out, ReduceOp op) override {
        if (auto work = reduce_scatter_work(in, out, op, "reduce_scatter", /*timed=*/false))
            work->wait();
    }

    std::shared_ptr<Work> reduce_scatter_timed(const torch::Tensor& in, torch::Tensor out,
                                               ReduceOp op) override {
        auto work = reduce_scatter_work(in, out, op, "reduce_scatter", /*timed=*/true);
        if (!work) return no_op("reduce_scatter");
        work->wait(); // blocking for the caller's stream, as reduce_scatter
        return work;
    }

    std::shared_ptr<Work> allgather_async(const torch::Tensor& in, torch::Tensor out) override {
        auto work = allgather_work(in, out, "allgather_async", /*timed=*/true);
        return work ? work : no_op("allgather");
    }

    std::shared_ptr<Work> reduce_scatter_async(const torch::Tensor& in, torch::Tensor out,
                                               ReduceOp op) override {
        auto work = reduce_scatter_work(in, out, op, "reduce_scatter_async", /*timed=*/true);
        return work ? work : no_op("reduce_scatter");
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
        exchange({P2POp{P2POp::Kind::Send, t, peer}});
    }

    void recv(torch::Tensor t, int peer) override {
        exchange({P2POp{P2POp::Kind::Recv, std::move(t), peer}});
    }

    void exchange(const std::vector<P2POp>& ops) override {
        std::vector<const P2POp*> live;
        for (const P2POp& op : ops) {
            const bool send = op.kind == P2POp::Kind::Send;
            check(op.tensor, send ? "send" : "recv");
            check_peer(op.peer, send ? "send" : "recv");
            if (op.tensor.numel() > 0) live.push_back(&op);
        }
        if (live.empty()) return;
        std::vector<torch::Tensor> tensors;
        for (const P2POp* op : live)
            tensors.push_back(op->tensor);
        // One group: NCCL progresses its sends and receives together (none waits for another to
        // be matched first), as PyTorch's batch_isend_irecv.
        auto work = launch_group(
            live.size() == 1 ? (live[0]->kind == P2POp::Kind::Send ? "send" : "recv") : "send/recv",
            tensors, [&](cudaStream_t s) {
                NCCL_CHECK(ncclGroupStart());
                for (const P2POp* op : live) {
                    const torch::Tensor& t = op->tensor;
                    const auto n = static_cast<size_t>(t.numel());
                    if (op->kind == P2POp::Kind::Send)
                        NCCL_CHECK(ncclSend(t.data_ptr(), n, nccl_type(t.scalar_type()), op->peer,
                                            comm_, s));
                    else
                        NCCL_CHECK(ncclRecv(t.data_ptr(), n, nccl_type(t.scalar_type()), op->peer,
                                            comm_, s));
                }
                NCCL_CHECK(ncclGroupEnd());
            });
        {
            NcclCommunicator& owner = stats_owner_ ? *stats_owner_ : *this;
            std::lock_guard<std::mutex> lock(owner.stats_mutex_);
            for (const P2POp* op : live) {
                CommStats& st = owner.stats_[op->kind == P2POp::Kind::Send ? "send" : "recv"];
                st.calls += 1;
                st.bytes += op->tensor.nbytes();
                st.seconds += work.second / static_cast<double>(live.size());
            }
        }
        work.first->wait();
    }

    std::map<std::string, CommStats> stats() const override {
        std::lock_guard<std::mutex> lock(stats_mutex_);
        return stats_;
    }

    std::unique_ptr<Communicator> make_lane() override {
        // Its unique id travels over our host communicator (idle here: allreduce_host runs on
        // the caller's thread, which is constructing the lane).
        auto lane =
            std::make_unique<NcclCommunicator>(host_comm_, device_, health_->timeout_s.load());
        lane->stats_owner_ = this;
        std::lock_guard<std::mutex> lock(lanes_mutex_);
        lanes_.push_back(lane->health_);
        return lane;
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

    std::shared_ptr<NcclWork> no_op(const char* kind) {
        return std::make_shared<NcclWork>(device_.index(), health_, kind);
    }

    // Null for an empty input (a no-op on every rank).
    std::shared_ptr<NcclWork> allgather_work(const torch::Tensor& in, torch::Tensor out,
                                             const char* what, bool timed) {
        check(out, "allgather output");
        if (out.numel() != in.numel() * size_ || out.scalar_type() != in.scalar_type())
            throw core::InternalError(std::string(what) + ": output must hold size() x input "
                                                          "elements of the same dtype");
        if (in.numel() == 0) return nullptr;
        torch::Tensor src = in.contiguous(); // on the compute stream, before the launch
        check(src, "allgather input");       // on this GPU (a host tensor is no pointer NCCL reads)
        return launch(
            "allgather", src.nbytes(), {src, out},
            [&](cudaStream_t s) {
                NCCL_CHECK(ncclAllGather(src.data_ptr(), out.data_ptr(),
                                         static_cast<size_t>(src.numel()),
                                         nccl_type(src.scalar_type()), comm_, s));
            },
            timed);
    }

    std::shared_ptr<NcclWork> reduce_scatter_work(const torch::Tensor& in, torch::Tensor out,
                                                  ReduceOp op, const char* what, bool timed) {
        check(out, "reduce_scatter output");
        const ncclRedOp_t red = nccl_op(op, out);
        if (in.numel() != out.numel() * size_ || out.scalar_type() != in.scalar_type())
            throw core::InternalError(std::string(what) +
                                      ": input must hold size() x output elements of the same "
                                      "dtype; pad to an exact split");
        if (out.numel() == 0) return nullptr;
        torch::Tensor src = in.contiguous();
        check(src, "reduce_scatter input");
        return launch(
            "reduce_scatter", out.nbytes(), {src, out},
            [&](cudaStream_t s) {
                NCCL_CHECK(ncclReduceScatter(src.data_ptr(), out.data_ptr(),
                                             static_cast<size_t>(out.numel()),
                                             nccl_type(out.scalar_type()), red, comm_, s));
            },
            timed);
    }

    // Under health_: makes our stream wait for the work queued so far on the caller's current
    // stream (an ordering event from the pool, released at once: the wait captured its state).
    void order_after_caller() {
        cudaStream_t compute = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
        cudaEvent_t ready = health_->plain_events->acquire();
        const cudaError_t recorded = cudaEventRecord(ready, compute);
        const cudaError_t waited =
            recorded == cudaSuccess ? cudaStreamWaitEvent(stream_.stream(), ready, 0) : recorded;
        health_->plain_events->release(ready);
        CUDA_CHECK(waited);
    }

    // Orders the operation(s) `enqueue` issues after the work already queued on the caller's
    // current stream, runs them on our stream, and returns a handle whose wait() orders later
    // compute work after them, with the host seconds of the launch. timed: timing events around
    // them (Work::seconds, exposed_seconds); else one ordering event after them (blocking calls,
    // whose handle never leaves this file). Events come from the pools: none is created per
    // operation once the pools are warm.
    template <class Fn>
    std::pair<std::shared_ptr<NcclWork>, double>
    launch_group(const char* kind, const std::vector<torch::Tensor>& tensors, Fn&& enqueue,
                 bool timed = false) {
        // Hooks may call from autograd's device thread while the main thread is blocked in
        // backward; NCCL calls on one communicator must not run concurrently.
        std::lock_guard<std::mutex> lock(mutex_);
        nvtx::ScopedRange range(kind); // the enqueue on the host; the kernel shows on the GPU row
        const auto t0 = Clock::now();
        auto work = std::make_shared<NcclWork>(device_.index(), health_, kind);
        const std::string what = std::string("launching an NCCL ") + kind;
        health_->call(what, [&] {
            c10::cuda::CUDAGuard guard(device_.index());
            order_after_caller();
            // Timing events bracket only the operation: `start` completes once the stream has
            // passed the wait for the compute stream, so Work::seconds() excludes that wait.
            if (timed) {
                work->start_ = health_->timing_events->acquire();
                CUDA_CHECK(cudaEventRecord(work->start_, stream_.stream()));
            }
            // The caching allocator must not hand these blocks out again until our stream is
            // done.
            for (const torch::Tensor& t : tensors)
                c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
            enqueue(stream_.stream());
        });
        // Nonblocking communicator: the enqueue may still be in progress; the event recorded
        // next must follow the operation's kernel on the stream.
        health_->wait_ready(what);
        health_->call(what, [&] {
            c10::cuda::CUDAGuard guard(device_.index());
            cudaEvent_t done = (timed ? health_->timing_events : health_->plain_events)->acquire();
            work->done_ = done; // the Work releases it from now on
            CUDA_CHECK(cudaEventRecord(done, stream_.stream()));
        });
        return {work, std::chrono::duration<double>(Clock::now() - t0).count()};
    }

    // launch_group for one collective of `kind` with `bytes` of payload counted in stats()
    // (0: not counted).
    template <class Fn>
    std::shared_ptr<NcclWork> launch(const char* kind, std::uint64_t bytes,
                                     std::initializer_list<torch::Tensor> tensors, Fn&& enqueue,
                                     bool timed = false) {
        auto [work, seconds] =
            launch_group(kind, std::vector<torch::Tensor>(tensors), enqueue, timed);
        if (bytes > 0) {
            NcclCommunicator& owner = stats_owner_ ? *stats_owner_ : *this;
            std::lock_guard<std::mutex> lock(owner.stats_mutex_);
            CommStats& s = owner.stats_[kind];
            s.calls += 1;
            s.bytes += bytes;
            s.seconds += seconds;
        }
        return work;
    }

    torch::Device device_;
    c10::cuda::CUDAStream stream_; // where our collectives run
    int rank_ = 0, size_ = 1;
    ncclComm_t comm_ = nullptr; // == health_->comm; used only under health_->m, while live
    // The handle's fate and the event pools, shared with the Works (see NcclHealth).
    std::shared_ptr<NcclHealth> health_;
    bool host_broken_ = false;       // an allreduce_host timed out: its collective stays pending
    mutable std::mutex mutex_;       // launches one at a time
    mutable std::mutex stats_mutex_; // stats_ (a lane's launches count in its owner's)
    std::map<std::string, CommStats> stats_;
    NcclCommunicator* stats_owner_ = nullptr; // make_lane(): the communicator that made this one
    std::mutex lanes_mutex_;                  // lanes_ (the watchdog thread polls them)
    std::vector<std::weak_ptr<NcclHealth>> lanes_; // make_lane()'s, polled with this one
};

} // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, torch::Device device,
                                                     double timeout_s) {
    if (!device.has_index()) device = torch::Device(torch::kCUDA, c10::cuda::current_device());
    return std::make_unique<NcclCommunicator>(comm, device, timeout_s);
}

} // namespace trainscope::dist::detail
