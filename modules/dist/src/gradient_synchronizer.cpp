// Bucketed, overlapped gradient averaging (what DDP's Reducer does, without its unused-parameter
// search and bucket rebuilding). Buckets are launched strictly in bucket order, whatever order the
// hooks fire in, so every rank issues the same collectives in the same sequence.
#include "trainscope/dist/gradient_synchronizer.hpp"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <chrono>
#include <map>
#include <mutex>
#include <set>

#include "trainscope/core/error.hpp"
#include "trainscope/core/nvtx.hpp"

namespace trainscope::dist {

struct GradientSynchronizer::Impl {
    struct Bucket {
        std::vector<std::size_t> members;  // parameter indices, in packing order
        std::vector<std::int64_t> offsets; // element offset of each member in `buffer`
        std::int64_t numel = 0;
        std::size_t bytes = 0;
        torch::ScalarType dtype = torch::kFloat32;
        torch::Tensor buffer; // [numel] flat, on the parameters' device (only when communicating)
        std::size_t pending = 0; // members whose gradient has not arrived in this iteration
        bool launched = false;
        std::shared_ptr<Work> work;
        std::string label; // "allreduce bucket <k>", the NVTX range name
        nvtx::Range range; // launch → waited for, on the nsys timeline
    };

    Impl(Communicator& c, std::vector<torch::Tensor> p) : comm(c), params(std::move(p)) {}

    Communicator& comm;
    std::vector<torch::Tensor> params;
    std::vector<Bucket> buckets;
    std::vector<std::size_t> bucket_of; // parameter index -> bucket index
    bool communicate = false;           // world size > 1

    // Iteration state, guarded by `mutex` (hooks may run on autograd's device threads).
    std::mutex mutex;
    bool armed = false;
    std::vector<char> ready;
    std::size_t next_bucket = 0; // first bucket not launched yet
    std::size_t in_backward = 0, in_finish = 0;
    std::size_t last_in_backward = 0, last_in_finish = 0;

    // Accounting of the last finished iteration; its own mutex, because resolving NCCL timings may
    // block and must not stall gradient hooks.
    mutable std::mutex last_mutex;
    std::vector<std::shared_ptr<Work>> last_works; // per bucket; null when nothing ran
    double last_exposed = 0;
    mutable bool last_resolved = true;
    mutable IterationComm last;

    void on_gradient_ready(std::size_t index);
    void launch_ready_buckets(bool from_hook);
    void launch(Bucket& bucket, bool from_hook);
    // Runs after AccumulateGrad has written a parameter's .grad.
    class BucketReadyHook final : public torch::autograd::PostAccumulateGradHook {
      public:
        BucketReadyHook(Impl* owner, std::size_t index) : owner_(owner), index_(index) {}
        void operator()(const torch::autograd::Variable& /*param*/) override {
            owner_->on_gradient_ready(index_);
        }
        const Impl* owner() const { return owner_; }

      private:
        Impl* owner_;
        std::size_t index_;
    };

    torch::Tensor slice(const Bucket& b, std::size_t k) const {
        const torch::Tensor& p = params[b.members[k]];
        return b.buffer.narrow(0, b.offsets[k], p.numel()).view(p.sizes());
    }
};

void GradientSynchronizer::Impl::on_gradient_ready(std::size_t index) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!armed) return; // outside begin_iteration()/finish(): local accumulation only
    if (ready[index])
        throw core::InternalError(
            "GradientSynchronizer: parameter " + std::to_string(index) +
            " received a second gradient in one iteration (backward ran twice between "
            "begin_iteration() and finish()); its bucket may already be in flight. For gradient "
            "accumulation call begin_iteration() only before the last micro-batch's backward");
    ready[index] = 1;
    Bucket& b = buckets[bucket_of[index]];
    if (--b.pending == 0) launch_ready_buckets(/*from_hook=*/true);
}

void GradientSynchronizer::Impl::launch_ready_buckets(bool from_hook) {
    // In bucket order only: hooks may fire in a different order on different ranks.
    while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0)
        launch(buckets[next_bucket++], from_hook);
}

void GradientSynchronizer::Impl::launch(Bucket& b, bool from_hook) {
    if (communicate) {
        torch::NoGradGuard no_grad;
        for (std::size_t k = 0; k < b.members.size(); ++k) {
            const torch::Tensor& grad = params[b.members[k]].grad();
            torch::Tensor dst = slice(b, k);
            if (!grad.defined()) {
                dst.zero_(); // parameter got no gradient this iteration on this rank
            } else {
                if (grad.is_sparse())
                    throw core::InternalError("GradientSynchronizer: sparse gradients are not "
                                              "supported (parameter " +
                                              std::to_string(b.members[k]) + ")");
                dst.copy_(grad);
            }
        }
        b.range = nvtx::Range(b.label.c_str());
        b.work = comm.allreduce_async(b.buffer, ReduceOp::Average);
    }
    b.launched = true;
    (from_hook ? in_backward : in_finish) += 1;
}

GradientSynchronizer::GradientSynchronizer(Communicator& comm,
                                           std::vector<torch::Tensor> parameters,
                                           std::size_t bucket_cap_bytes)
    : impl_(std::make_unique<Impl>(comm, std::move(parameters))) {
    Impl& s = *impl_;
    if (bucket_cap_bytes == 0) throw core::InternalError("GradientSynchronizer: bucket cap is 0");
    std::set<const void*> seen;
    for (std::size_t i = 0; i < s.params.size(); ++i) {
        const torch::Tensor& p = s.params[i];
        const std::string which = "GradientSynchronizer: parameter " + std::to_string(i);
        if (!p.defined() || !p.requires_grad() || !p.is_leaf())
            throw core::InternalError(which + " must be a leaf tensor that requires grad");
        if (p.device() != comm.device())
            throw core::InternalError(which + " is on " + p.device().str() +
                                      " but the communicator works on " + comm.device().str());
        if (!seen.insert(p.unsafeGetTensorImpl()).second)
            throw core::InternalError(which + " is listed twice (shared parameters must appear "
                                              "once)");
        if (torch::autograd::impl::post_acc_grad_hooks(p))
            throw core::InternalError(which + " already has a post-accumulate-grad hook (two "
                                              "GradientSynchronizers on one model?)");
    }

    // Bucketing: reverse registration order (gradients arrive roughly so), one open bucket per
    // dtype; a bucket is closed when the next parameter would overflow the cap, so no bucket
    // exceeds the cap unless it holds a single larger parameter.
    s.bucket_of.assign(s.params.size(), 0);
    std::map<torch::ScalarType, std::size_t> open;
    for (std::size_t n = s.params.size(); n-- > 0;) {
        const torch::Tensor& p = s.params[n];
        const std::size_t bytes = p.numel() * p.element_size();
        auto it = open.find(p.scalar_type());
        if (it != open.end() && s.buckets[it->second].bytes + bytes > bucket_cap_bytes) {
            open.erase(it);
            it = open.end();
        }
        if (it == open.end()) {
            s.buckets.emplace_back();
            s.buckets.back().dtype = p.scalar_type();
            it = open.emplace(p.scalar_type(), s.buckets.size() - 1).first;
        }
        Impl::Bucket& b = s.buckets[it->second];
        b.members.push_back(n);
        b.offsets.push_back(b.numel);
        b.numel += p.numel();
        b.bytes += bytes;
        s.bucket_of[n] = it->second;
        if (b.bytes >= bucket_cap_bytes) open.erase(it);
    }

    for (std::size_t k = 0; k < s.buckets.size(); ++k)
        s.buckets[k].label = "allreduce bucket " + std::to_string(k);
    s.communicate = comm.size() > 1;
    // MPI has no 16-bit floating-point types: half and bfloat16 gradients travel as float32
    // (exact for the values, summed in float32; twice the bytes, which the accounting shows).
    const bool widen = comm.backend() == "mpi";
    if (s.communicate)
        for (auto& b : s.buckets) {
            const bool narrow = b.dtype == torch::kHalf || b.dtype == torch::kBFloat16;
            const torch::ScalarType wire = widen && narrow ? torch::kFloat32 : b.dtype;
            b.bytes = static_cast<std::size_t>(b.numel) * c10::elementSize(wire);
            b.buffer =
                torch::zeros({b.numel}, torch::TensorOptions().dtype(wire).device(comm.device()));
        }
    s.ready.assign(s.params.size(), 0);
    for (std::size_t i = 0; i < s.params.size(); ++i)
        torch::autograd::impl::set_post_acc_grad_hooks(
            s.params[i], std::make_unique<Impl::BucketReadyHook>(impl_.get(), i));
}

GradientSynchronizer::~GradientSynchronizer() {
    // Unfinished collectives (if any, e.g. during error unwinding) keep their buffers alive.
    for (auto& p : impl_->params) {
        auto& slot = torch::autograd::impl::post_acc_grad_hooks(p);
        auto* hook = dynamic_cast<Impl::BucketReadyHook*>(slot.get());
        if (hook && hook->owner() == impl_.get()) slot.reset();
    }
}

void GradientSynchronizer::broadcast_parameters(int root,
                                                const std::vector<torch::Tensor>& buffers) {
    Impl& s = *impl_;
    if (!s.communicate) return;
    torch::NoGradGuard no_grad;
    // Parameters travel packed in their gradient buckets' buffers: few, large messages.
    for (auto& b : s.buckets) {
        for (std::size_t k = 0; k < b.members.size(); ++k)
            s.slice(b, k).copy_(s.params[b.members[k]]);
        s.comm.broadcast(b.buffer, root);
        for (std::size_t k = 0; k < b.members.size(); ++k)
            s.params[b.members[k]].copy_(s.slice(b, k));
    }
    for (const torch::Tensor& buffer : buffers) {
        if (!buffer.defined() || buffer.numel() == 0) continue;
        torch::Tensor t = buffer.is_contiguous() ? buffer : buffer.contiguous();
        s.comm.broadcast(t, root);
        if (!t.is_same(buffer)) torch::Tensor(buffer).copy_(t);
    }
}

void GradientSynchronizer::begin_iteration() {
    Impl& s = *impl_;
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.armed)
        throw core::InternalError("GradientSynchronizer: begin_iteration() called twice without "
                                  "finish()");
    std::fill(s.ready.begin(), s.ready.end(), 0);
    for (auto& b : s.buckets) {
        b.pending = b.members.size();
        b.launched = false;
        b.work.reset();
    }
    s.next_bucket = 0;
    s.in_backward = s.in_finish = 0;
    s.armed = true;
}

double GradientSynchronizer::finish() {
    Impl& s = *impl_;
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.armed)
        throw core::InternalError("GradientSynchronizer: finish() without begin_iteration()");
    s.armed = false;
    // Buckets with parameters that got no gradient (or that wait behind such a bucket).
    for (auto& b : s.buckets)
        b.pending = 0;
    s.launch_ready_buckets(/*from_hook=*/false);
    s.last_in_backward = s.in_backward;
    s.last_in_finish = s.in_finish;

    torch::NoGradGuard no_grad;
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& b : s.buckets) {
        if (b.work) b.work->wait();
        b.range.end();
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
        std::lock_guard<std::mutex> last_lock(s.last_mutex);
        s.last_works.clear();
        for (auto& b : s.buckets)
            s.last_works.push_back(b.work); // keeps the handle (and its timing) until resolved
        s.last_exposed = waited;
        s.last_resolved = false;
    }

    for (auto& b : s.buckets) {
        for (std::size_t k = 0; k < b.members.size(); ++k) {
            torch::Tensor& p = s.params[b.members[k]];
            torch::Tensor& grad = p.mutable_grad();
            if (!s.communicate) {
                if (!grad.defined()) grad = torch::zeros_like(p);
                continue;
            }
            if (grad.defined())
                grad.copy_(s.slice(b, k));
            else
                grad = s.slice(b, k).clone();
        }
        b.work.reset();
    }
    return waited;
}

IterationComm GradientSynchronizer::last_iteration() const {
    const Impl& s = *impl_;
    std::lock_guard<std::mutex> lock(s.last_mutex);
    if (!s.last_resolved) {
        IterationComm out;
        out.exposed_s = s.last_exposed;
        for (std::size_t i = 0; i < s.buckets.size(); ++i) {
            const auto& work = s.last_works[i];
            const double bytes = work ? static_cast<double>(s.buckets[i].bytes) : 0.0;
            const double seconds = work ? work->seconds() : 0.0;
            out.bucket_bytes.push_back(bytes);
            out.bucket_s.push_back(seconds);
            out.bytes += bytes;
            out.collective_s += seconds;
        }
        s.last = std::move(out);
        s.last_resolved = true;
    }
    if (s.last.bucket_bytes.empty()) { // before the first finish(): zeros, one per bucket
        s.last.bucket_bytes.assign(s.buckets.size(), 0.0);
        s.last.bucket_s.assign(s.buckets.size(), 0.0);
    }
    return s.last;
}

std::size_t GradientSynchronizer::num_buckets() const {
    return impl_->buckets.size();
}

std::vector<std::size_t> GradientSynchronizer::bucket_bytes() const {
    std::vector<std::size_t> out;
    for (const auto& b : impl_->buckets)
        out.push_back(b.bytes);
    return out;
}

std::vector<std::vector<std::size_t>> GradientSynchronizer::bucket_parameters() const {
    std::vector<std::vector<std::size_t>> out;
    for (const auto& b : impl_->buckets)
        out.push_back(b.members);
    return out;
}

std::uint64_t GradientSynchronizer::bytes_per_iteration() const {
    if (!impl_->communicate) return 0;
    std::uint64_t total = 0;
    for (const auto& b : impl_->buckets)
        total += b.bytes;
    return total;
}

std::size_t GradientSynchronizer::buckets_launched_in_backward() const {
    return impl_->last_in_backward;
}
std::size_t GradientSynchronizer::buckets_launched_in_finish() const {
    return impl_->last_in_finish;
}

} // namespace trainscope::dist
