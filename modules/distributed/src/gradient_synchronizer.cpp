// Bucketed, overlapped gradient averaging (what DDP's Reducer does with gradient_as_bucket_view,
// without its unused-parameter search and bucket rebuilding). Buckets are launched strictly in
// bucket order, whatever order the hooks fire in, so every rank issues the same collectives in the
// same sequence; .grad tensors are views into the bucket buffers, so the allreduce runs in place
// on what backward wrote and no per-step copy exists unless a .grad was replaced.
#include "trainscope/distributed/gradient_synchronizer.hpp"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <set>

#include "trainscope/core/error.hpp"
#include "trainscope/core/nvtx.hpp"
#include "trainscope/distributed/parallelism.hpp"
#include "trainscope/distributed/powersgd.hpp"

namespace trainscope::dist {

struct GradientSynchronizer::Impl {
    struct Bucket {
        std::vector<std::size_t> members;  // parameter indices, in packing order
        std::vector<std::int64_t> offsets; // element offset of each member in `grads`
        std::int64_t numel = 0;
        std::size_t bytes = 0; // payload: numel x the wire element size
        std::size_t cap = 0;   // packing cap in bytes (the first bucket of a dtype is smaller)
        torch::ScalarType dtype = torch::kFloat32;
        // [numel] flat, in `dtype`, on the parameters' device: the members' .grad are views of it.
        torch::Tensor grads;
        // [numel] what the allreduce runs on: `grads` itself, except on MPI for 16-bit dtypes
        // (widened to float32, copied in at launch and back in finish()). Undefined at world 1.
        torch::Tensor wire;
        // dist.compress=fp16/bf16: [numel] in the 16-bit dtype, what travels instead of `wire`.
        torch::Tensor low;
        std::size_t uncompressed = 0; // payload without compression (`wire`'s bytes)
        std::size_t sent = 0;         // payload of this iteration's collectives
        std::size_t pending = 0;      // members whose gradient has not arrived in this iteration
        bool launched = false;
        std::shared_ptr<Work> work;
        std::string label; // "allreduce bucket <k>", the NVTX range name
        nvtx::Range range; // launch → waited for, on the nsys timeline
    };

    Impl(Communicator& c, std::vector<torch::Tensor> p, const CompressionOptions& o)
        : comm(c), params(std::move(p)), compression(o) {}

    Communicator& comm;
    std::vector<torch::Tensor> params;
    std::vector<Bucket> buckets;
    std::vector<std::size_t> bucket_of; // parameter index -> bucket index
    // Parameter index -> its slice of the bucket's `grads`: with the parameter's sizes and strides
    // when it is a view member (`as_view`), else contiguous (copy path).
    std::vector<torch::Tensor> slices;
    std::vector<char> as_view;
    bool communicate = false; // world size > 1
    CompressionOptions compression;
    std::unique_ptr<PowerSgd> powersgd; // dist.compress=powersgd at world size > 1
    std::int64_t iteration = 0;         // finish() calls so far (+ a checkpoint's count)
    bool compress_now = false;          // powersgd: this iteration is a compressed one

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
    torch::Tensor last_error; // powersgd: squared error-feedback norm (device), or undefined
    mutable bool last_resolved = false;
    mutable ParallelComm last;

    void on_gradient_ready(std::size_t index);
    void launch_ready_buckets(bool from_hook);
    void launch(std::size_t k, bool from_hook);
    void gather_gradient(std::size_t index);
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

    // Whether .grad still writes into the parameter's bucket slice: same address, same layout.
    bool grad_is_slice(const torch::Tensor& grad, std::size_t index) const {
        const torch::Tensor& s = slices[index];
        return grad.defined() && !grad.is_sparse() && grad.data_ptr() == s.data_ptr() &&
               grad.sizes() == s.sizes() && grad.strides() == s.strides() &&
               grad.scalar_type() == s.scalar_type();
    }
};

// Makes parameter `index`'s bucket slice hold its gradient of this iteration: from its hook, or
// when finish() launches the bucket of a parameter that got none. View members: nothing to do when
// .grad is still the view (the common case); a replaced .grad is copied in once and .grad is
// pointed back at the slice (DDP does the same), an undefined one counts as zeros. Copy-path
// members: their .grad is copied in, as before views existed.
void GradientSynchronizer::Impl::gather_gradient(std::size_t index) {
    torch::Tensor& param = params[index];
    const torch::Tensor& slice = slices[index];
    torch::Tensor& grad = param.mutable_grad();
    if (as_view[index] && grad_is_slice(grad, index)) return;
    if (grad.defined() && grad.is_sparse())
        throw core::InternalError("GradientSynchronizer: sparse gradients are not supported "
                                  "(parameter " +
                                  std::to_string(index) + ")");
    if (!as_view[index] && !communicate) return; // finish() creates a missing one
    torch::NoGradGuard no_grad;
    if (grad.defined())
        torch::Tensor(slice).copy_(grad);
    else
        torch::Tensor(slice).zero_(); // parameter got no gradient this iteration on this rank
    if (as_view[index]) grad = slice;
}

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
    // Its gradient is final for this iteration: into the bucket now (a no-op for an intact
    // view), so a replaced .grad is freed as early as DDP frees it.
    gather_gradient(index);
    Bucket& b = buckets[bucket_of[index]];
    if (--b.pending == 0) launch_ready_buckets(/*from_hook=*/true);
}

void GradientSynchronizer::Impl::launch_ready_buckets(bool from_hook) {
    // In bucket order only: hooks may fire in a different order on different ranks.
    while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0)
        launch(next_bucket++, from_hook);
}

void GradientSynchronizer::Impl::launch(std::size_t k, bool from_hook) {
    Bucket& b = buckets[k];
    for (std::size_t m : b.members)
        if (!ready[m]) gather_gradient(m); // no gradient this iteration (launched by finish())
    if (communicate && b.low.defined()) {
        // fp16/bf16_compress_hook: cast, divide by the world size before the sum (no overflow),
        // allreduce; finish() casts back.
        torch::NoGradGuard no_grad;
        b.low.copy_(b.grads);
        b.low.div_(comm.size());
        b.range = nvtx::Range(b.label.c_str());
        b.work = comm.allreduce_async(b.low, ReduceOp::Sum);
        b.sent = b.low.nbytes();
    } else if (communicate && compress_now) {
        b.range = nvtx::Range(b.label.c_str());
        b.work = powersgd->launch(k, iteration);
        b.sent = powersgd->compressed_bytes(k);
    } else if (communicate) {
        b.sent = b.uncompressed; // also powersgd's plain iterations before start_iter
        if (!b.wire.is_same(b.grads)) {
            torch::NoGradGuard no_grad;
            b.wire.copy_(b.grads); // MPI, 16-bit dtype: widen to float32
        }
        b.range = nvtx::Range(b.label.c_str());
        // ReduceOp::Average: the mean over ranks, in place, as DDP's division by world size.
        b.work = comm.allreduce_async(b.wire, ReduceOp::Average);
    }
    b.launched = true;
    (from_hook ? in_backward : in_finish) += 1;
}

GradientSynchronizer::GradientSynchronizer(Communicator& comm,
                                           std::vector<torch::Tensor> parameters,
                                           std::size_t bucket_cap_bytes,
                                           std::size_t first_bucket_cap_bytes,
                                           const CompressionOptions& compression)
    : impl_(std::make_unique<Impl>(comm, std::move(parameters), compression)) {
    Impl& s = *impl_;
    if (bucket_cap_bytes == 0) throw core::InternalError("GradientSynchronizer: bucket cap is 0");
    if (first_bucket_cap_bytes == 0)
        throw core::InternalError("GradientSynchronizer: first bucket cap is 0");
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
        if (p.grad().defined() && p.grad().is_sparse())
            throw core::InternalError(which + " has a sparse gradient (not supported)");
    }

    // Bucketing: reverse registration order (gradients arrive roughly so), one open bucket per
    // dtype; a bucket is closed when the next parameter would overflow its cap, so no bucket
    // exceeds its cap unless it holds a single larger parameter. As in DDP, the first bucket of
    // each dtype gets the small cap (DDP keeps one size-limit sequence per dtype and device), and
    // it is never larger than the others.
    const std::size_t first_cap = std::min(first_bucket_cap_bytes, bucket_cap_bytes);
    s.bucket_of.assign(s.params.size(), 0);
    std::map<torch::ScalarType, std::size_t> open;
    std::set<torch::ScalarType> started; // dtypes that have a bucket already
    for (std::size_t n = s.params.size(); n-- > 0;) {
        const torch::Tensor& p = s.params[n];
        const std::size_t bytes = p.numel() * p.element_size();
        auto it = open.find(p.scalar_type());
        if (it != open.end() && s.buckets[it->second].bytes + bytes > s.buckets[it->second].cap) {
            open.erase(it);
            it = open.end();
        }
        if (it == open.end()) {
            s.buckets.emplace_back();
            s.buckets.back().dtype = p.scalar_type();
            s.buckets.back().cap =
                started.insert(p.scalar_type()).second ? first_cap : bucket_cap_bytes;
            it = open.emplace(p.scalar_type(), s.buckets.size() - 1).first;
        }
        Impl::Bucket& b = s.buckets[it->second];
        b.members.push_back(n);
        b.offsets.push_back(b.numel);
        b.numel += p.numel();
        b.bytes += bytes;
        s.bucket_of[n] = it->second;
        if (b.bytes >= b.cap) open.erase(it);
    }

    for (std::size_t k = 0; k < s.buckets.size(); ++k)
        s.buckets[k].label = "allreduce bucket " + std::to_string(k);
    s.communicate = comm.size() > 1;
    // On MPI, half and bfloat16 gradients travel as float32 (exact for the values, summed in
    // float32 and rounded once; twice the bytes, which the accounting shows): MPI's 16-bit sums
    // (mpi_float16) round at every step, which dist.compress=fp16/bf16 asks for, none does not.
    const bool widen = comm.backend() == "mpi";
    const std::optional<torch::ScalarType> sixteen = compressed_dtype(compression.kind);
    if (s.communicate && compression.kind == CompressionKind::PowerSgd)
        s.powersgd = std::make_unique<PowerSgd>(comm, compression);
    s.slices.resize(s.params.size());
    s.as_view.assign(s.params.size(), 0);
    torch::NoGradGuard no_grad;
    for (auto& b : s.buckets) {
        // Allocated at every world size: the buffers replace the gradients autograd would
        // allocate, so behaviour (and memory) does not depend on the number of ranks.
        b.grads =
            torch::zeros({b.numel}, torch::TensorOptions().dtype(b.dtype).device(comm.device()));
        for (std::size_t k = 0; k < b.members.size(); ++k) {
            const std::size_t i = b.members[k];
            torch::Tensor& p = s.params[i];
            // A non-overlapping, dense tensor of numel n spans exactly n consecutive elements
            // whatever its dimension order, so a view with the parameter's own strides fits the
            // slice [offset, offset + n); channels_last weights stay channels_last.
            s.as_view[i] = p.is_non_overlapping_and_dense();
            if (!s.as_view[i]) {
                s.slices[i] = b.grads.narrow(0, b.offsets[k], p.numel()).view(p.sizes());
                continue;
            }
            // Not an autograd view (as_strided would make one) but a plain tensor on the bucket's
            // storage: LibTorch's Optimizer::zero_grad calls .grad.detach_(), which throws for
            // views ("Can't detach views in-place").
            s.slices[i] = torch::empty({0}, b.grads.options())
                              .set_(b.grads.storage(), b.offsets[k], p.sizes(), p.strides());
            torch::Tensor& grad = p.mutable_grad();
            if (grad.defined()) s.slices[i].copy_(grad); // keep an accumulated gradient
            grad = s.slices[i];
        }
        if (!s.communicate) continue;
        const bool narrow = b.dtype == torch::kHalf || b.dtype == torch::kBFloat16;
        const torch::ScalarType wire = widen && narrow ? torch::kFloat32 : b.dtype;
        b.bytes = static_cast<std::size_t>(b.numel) * c10::elementSize(wire);
        b.uncompressed = b.bytes;
        b.wire =
            wire == b.dtype
                ? b.grads
                : torch::zeros({b.numel}, torch::TensorOptions().dtype(wire).device(comm.device()));
        if (sixteen) {
            b.low = torch::zeros({b.numel}, b.grads.options().dtype(*sixteen));
            b.bytes = b.low.nbytes();
        }
        if (s.powersgd) {
            std::vector<PowerSgd::Member> members;
            for (std::size_t k = 0; k < b.members.size(); ++k)
                members.push_back({b.offsets[k], s.params[b.members[k]].sizes().vec()});
            s.powersgd->add_bucket(b.grads, members);
            b.bytes = s.powersgd->compressed_bytes(&b - s.buckets.data());
        }
    }
    s.ready.assign(s.params.size(), 0);
    for (std::size_t i = 0; i < s.params.size(); ++i)
        torch::autograd::impl::set_post_acc_grad_hooks(
            s.params[i], std::make_unique<Impl::BucketReadyHook>(impl_.get(), i));
}

GradientSynchronizer::~GradientSynchronizer() {
    // Unfinished collectives (if any, e.g. during error unwinding) keep their buffers alive; the
    // .grad views keep their bucket's storage alive after we are gone.
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
    // Parameters travel packed per gradient bucket: few, large messages. The staging buffer is a
    // temporary of the bucket's wire type, not the bucket itself, whose contents are .grad.
    for (auto& b : s.buckets) {
        torch::Tensor staging = torch::empty({b.numel}, b.wire.options());
        for (std::size_t k = 0; k < b.members.size(); ++k) {
            torch::Tensor& p = s.params[b.members[k]];
            staging.narrow(0, b.offsets[k], p.numel()).view(p.sizes()).copy_(p);
        }
        s.comm.broadcast(staging, root);
        for (std::size_t k = 0; k < b.members.size(); ++k) {
            torch::Tensor& p = s.params[b.members[k]];
            p.copy_(staging.narrow(0, b.offsets[k], p.numel()).view(p.sizes()));
        }
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
    s.compress_now = s.powersgd && s.iteration >= s.compression.start_iter;
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
    // PowerSGD's second round (P arrived -> Q = M^T P -> Q's allreduce), in bucket order on every
    // rank; its computation counts as exposed communication, as a DDP hook's does.
    if (s.compress_now)
        for (std::size_t k = 0; k < s.buckets.size(); ++k)
            s.powersgd->exchange_q(k);
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

    // The averages are in place in the buckets, so view members are done. Left to do: narrowing
    // the MPI float32 wire copy back to 16 bits, the compressed buckets' results, and the
    // copy-path members.
    for (std::size_t k = 0; k < s.buckets.size(); ++k) {
        Impl::Bucket& b = s.buckets[k];
        if (s.communicate && b.low.defined())
            b.grads.copy_(b.low);
        else if (s.compress_now)
            s.powersgd->finish(k);
        else if (s.communicate && !b.wire.is_same(b.grads))
            b.grads.copy_(b.wire);
        for (std::size_t m : b.members) {
            if (s.as_view[m]) continue;
            torch::Tensor& p = s.params[m];
            torch::Tensor& grad = p.mutable_grad();
            if (!s.communicate) {
                if (!grad.defined()) grad = torch::zeros_like(p);
            } else if (grad.defined()) {
                grad.copy_(s.slices[m]);
            } else {
                grad = s.slices[m].clone();
            }
        }
        b.work.reset();
    }
    if (s.powersgd) {
        std::lock_guard<std::mutex> last_lock(s.last_mutex);
        s.last_error = s.powersgd->error_norm_squared();
    }
    ++s.iteration;
    return waited;
}

namespace {
// The last finished iteration's handles; the caller holds `last_mutex`.
template <class Impl> PendingParallelComm pending_of(const Impl& s) {
    std::vector<std::shared_ptr<Work>> works = s.last_works;
    works.resize(s.buckets.size()); // before the first finish(): no work per bucket
    PendingParallelComm p;
    ParallelComm& k = p.known;
    k.exposed_s = s.last_exposed;
    for (std::size_t i = 0; i < s.buckets.size(); ++i) {
        const double sent = works[i] ? static_cast<double>(s.buckets[i].sent) : 0.0;
        k.bucket_bytes.push_back(sent);
        k.bytes += sent;
        if (works[i]) k.uncompressed_bytes += static_cast<double>(s.buckets[i].uncompressed);
    }
    k.bucket_s.assign(s.buckets.size(), ParallelComm::kNaN);
    const bool powersgd = s.powersgd != nullptr;
    torch::Tensor error_norm_squared = s.last_error; // float64 device scalar; undefined: 0
    p.resolve = [known = k, works = std::move(works), powersgd, error_norm_squared] {
        ParallelComm out = known;
        if (powersgd)
            out.error_norm = error_norm_squared.defined()
                                 ? std::sqrt(error_norm_squared.item<double>()) // synchronizes
                                 : 0.0;
        out.collective_s = 0;
        for (std::size_t i = 0; i < works.size(); ++i) {
            out.bucket_s[i] = works[i] ? works[i]->seconds() : 0.0;
            out.collective_s += out.bucket_s[i];
        }
        return out;
    };
    return p;
}
} // namespace

PendingParallelComm GradientSynchronizer::last_iteration_pending() const {
    std::lock_guard<std::mutex> lock(impl_->last_mutex);
    return pending_of(*impl_);
}

ParallelComm GradientSynchronizer::last_iteration() const {
    const Impl& s = *impl_;
    std::lock_guard<std::mutex> lock(s.last_mutex);
    if (!s.last_resolved) {
        s.last = pending_of(s).resolve();
        s.last_resolved = true;
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

const torch::Tensor& GradientSynchronizer::bucket_buffer(std::size_t k) const {
    if (k >= impl_->buckets.size())
        throw core::InternalError("GradientSynchronizer::bucket_buffer(" + std::to_string(k) +
                                  "): there are " + std::to_string(impl_->buckets.size()) +
                                  " buckets");
    return impl_->buckets[k].grads;
}

bool GradientSynchronizer::gradient_is_bucket_view(std::size_t i) const {
    if (i >= impl_->params.size())
        throw core::InternalError("GradientSynchronizer::gradient_is_bucket_view(" +
                                  std::to_string(i) + "): there are " +
                                  std::to_string(impl_->params.size()) + " parameters");
    return impl_->as_view[i] != 0;
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

const CompressionOptions& GradientSynchronizer::compression() const {
    return impl_->compression;
}

std::int64_t GradientSynchronizer::iterations() const {
    return impl_->iteration;
}

bool GradientSynchronizer::has_compression_state() const {
    return impl_->powersgd != nullptr;
}

void GradientSynchronizer::save_compression_state(torch::serialize::OutputArchive& out) const {
    const Impl& s = *impl_;
    if (!s.powersgd) return;
    torch::serialize::OutputArchive state;
    state.write("iteration", c10::IValue(s.iteration));
    s.powersgd->save(state);
    out.write("grad_compression", state);
}

void GradientSynchronizer::load_compression_state(torch::serialize::InputArchive& replicated,
                                                  torch::serialize::InputArchive* own,
                                                  const std::string& where) {
    Impl& s = *impl_;
    if (!s.powersgd) return;
    torch::serialize::InputArchive shared, mine;
    if (!replicated.try_read("grad_compression", shared)) return; // saved without powersgd
    const bool have_own = own && own->try_read("grad_compression", mine);
    c10::IValue count;
    shared.read("iteration", count);
    s.iteration = count.toInt();
    s.powersgd->load(shared, have_own ? &mine : nullptr, where);
}

double synchronizer_buffer_bytes(const std::vector<std::vector<std::int64_t>>& sizes,
                                 torch::ScalarType dtype, const std::string& backend, int world,
                                 const CompressionOptions& compression) {
    if (world <= 1) return 0.0; // as the constructor: nothing communicates, nothing is allocated
    const double e = static_cast<double>(c10::elementSize(dtype));
    double numel = 0, low_rank = 0; // gradient elements; PowerSGD's P and Q elements
    for (const auto& s : sizes) {
        double n = 1;
        for (std::int64_t d : s)
            n *= static_cast<double>(d);
        numel += n;
        std::int64_t r = 0;
        if (compression.kind == CompressionKind::PowerSgd && !s.empty() &&
            powersgd_compresses(s, compression.powersgd_rank, compression.min_compression_rate, &r))
            low_rank += static_cast<double>(s[0]) * static_cast<double>(r) +
                        n / static_cast<double>(s[0]) * static_cast<double>(r);
    }
    double bytes = 0;
    const bool narrow = dtype == torch::kHalf || dtype == torch::kBFloat16;
    if (backend == "mpi" && narrow) bytes += 4.0 * numel; // the float32 wire buffer
    if (const auto sixteen = compressed_dtype(compression.kind))
        bytes += static_cast<double>(c10::elementSize(*sixteen)) * numel;
    if (compression.kind == CompressionKind::PowerSgd) bytes += e * (numel + low_rank);
    return bytes;
}

} // namespace trainscope::dist
