#include "trainscope/distributed/zero.hpp"

#include <chrono>
#include <cmath>

#include "trainscope/core/error.hpp"

namespace trainscope::dist {

namespace {
double since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
} // namespace

void adamw_update(torch::Tensor& param, const torch::Tensor& grad, torch::Tensor& exp_avg,
                  torch::Tensor& exp_avg_sq, std::int64_t step, double lr, const ZeroAdamW& h) {
    torch::NoGradGuard no_grad;
    // torch.optim.AdamW, operation for operation (decoupled decay, then the moments).
    param.mul_(1.0 - lr * h.weight_decay);
    exp_avg.mul_(h.beta1).add_(grad, 1.0 - h.beta1);
    exp_avg_sq.mul_(h.beta2).addcmul_(grad, grad, 1.0 - h.beta2);
    const double bias1 = 1.0 - std::pow(h.beta1, static_cast<double>(step));
    const double bias2 = 1.0 - std::pow(h.beta2, static_cast<double>(step));
    torch::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias2)).add_(h.eps);
    param.addcdiv_(exp_avg, denom, -lr / bias1);
}

torch::Tensor narrow_in_place(const torch::Tensor& values, torch::ScalarType dtype) {
    if (values.scalar_type() == dtype) return values;
    const auto wide = static_cast<std::int64_t>(values.element_size());
    const auto narrow = static_cast<std::int64_t>(c10::elementSize(dtype));
    if (values.dim() != 1 || !values.is_contiguous() || wide < 2 * narrow)
        return values.to(dtype, /*non_blocking=*/false, /*copy=*/true);
    // Elements [s, 2s) are written to bytes [narrow s, 2 narrow s), which held only elements
    // below s (wide >= 2 narrow), already converted: each copy reads and writes disjoint bytes.
    // The first elements, whose output overlaps their own input, go through a small temporary.
    const std::int64_t n = values.numel();
    torch::Tensor out = values.view(dtype).narrow(0, 0, n);
    const std::int64_t first = std::min(n, kNarrowInPlaceFirst);
    out.narrow(0, 0, first).copy_(values.narrow(0, 0, first).to(dtype));
    for (std::int64_t s = first; s < n; s *= 2) {
        const std::int64_t e = std::min(n, 2 * s);
        out.narrow(0, s, e - s).copy_(values.narrow(0, s, e - s));
    }
    return out;
}

ZeroOptimizer::ZeroOptimizer(Communicator& comm, std::vector<torch::Tensor> parameters, int stage,
                             ZeroAdamW hyper, std::optional<torch::ScalarType> reduce_dtype)
    : comm_(comm), params_(std::move(parameters)), stage_(stage), hyper_(hyper),
      reduce_dtype_(reduce_dtype) {
    if (stage_ != 1 && stage_ != 2)
        throw core::ConfigError("dist.zero=" + std::to_string(stage_) + ": use 1 or 2");
    if (params_.empty()) throw core::InternalError("ZeroOptimizer: no parameters");
    world_ = comm_.size();
    rank_ = comm_.rank();
    if (world_ == 1) reduce_dtype_.reset(); // nothing travels, nothing to compress
    const auto options = params_.front().options();
    for (const auto& p : params_) {
        if (p.scalar_type() != params_.front().scalar_type() ||
            p.device() != params_.front().device())
            throw core::InternalError("ZeroOptimizer: parameters of mixed dtype or device");
        numel_ += p.numel();
    }
    shard_ = (numel_ + world_ - 1) / world_;
    padded_ = shard_ * world_;
    torch::NoGradGuard no_grad;
    flat_param_ = torch::zeros({padded_}, options);
    std::int64_t off = 0;
    for (auto& p : params_) {
        const std::int64_t n = p.numel();
        torch::Tensor view = flat_param_.narrow(0, off, n).view(p.sizes());
        view.copy_(p);
        p.set_data(view); // the parameter now lives in the flat buffer
        off += n;
    }
    comm_.broadcast(flat_param_, 0);
    shard_grad_ = torch::zeros({shard_}, options);
    exp_avg_ = torch::zeros({shard_}, options);
    exp_avg_sq_ = torch::zeros({shard_}, options);
    if (reduce_dtype_) shard_low_ = torch::zeros({shard_}, options.dtype(*reduce_dtype_));
}

void ZeroOptimizer::zero_grad() {
    torch::NoGradGuard no_grad;
    if (!flat_grad_.defined())
        flat_grad_ = torch::zeros({padded_}, flat_param_.options());
    else
        flat_grad_.zero_();
    std::int64_t off = 0;
    for (auto& p : params_) {
        const std::int64_t n = p.numel();
        p.mutable_grad() = flat_grad_.narrow(0, off, n).view(p.sizes());
        off += n;
    }
}

double ZeroOptimizer::reduce_gradients(double grad_scale) {
    if (!flat_grad_.defined())
        throw core::InternalError("ZeroOptimizer::reduce_gradients without zero_grad()");
    torch::NoGradGuard no_grad;
    const auto t0 = std::chrono::steady_clock::now();
    double seconds = 0;
    if (reduce_dtype_) {
        // The gradient in 16 bits, divided before the sum (no overflow), then the shard widened
        // again. The 16-bit values are written over the flat gradient's own storage, which
        // nothing reads again this iteration (the step and the finite check use the shard), so
        // no second buffer of the whole model is held while the reduce-scatter runs.
        torch::Tensor low = narrow_in_place(flat_grad_, *reduce_dtype_);
        low.div_(world_);
        reduce_work_ = comm_.reduce_scatter_timed(low, shard_low_, ReduceOp::Sum);
        seconds = since(t0);
        shard_grad_.copy_(shard_low_);
        if (grad_scale != 1.0) shard_grad_.mul_(grad_scale);
    } else {
        reduce_work_ = comm_.reduce_scatter_timed(flat_grad_, shard_grad_, ReduceOp::Sum);
        seconds = since(t0);
        shard_grad_.mul_(grad_scale / world_);
    }
    if (stage_ == 2) { // only the shard survives the iteration
        for (auto& p : params_)
            p.mutable_grad() = torch::Tensor();
        flat_grad_ = torch::Tensor();
    }
    return seconds;
}

void ZeroOptimizer::step(double lr) {
    torch::NoGradGuard no_grad;
    ++step_count_;
    torch::Tensor param = flat_param_.narrow(0, rank_ * shard_, shard_);
    if (hyper_.fused)
        fused_adamw_update({param}, {shard_grad_}, {exp_avg_}, {exp_avg_sq_}, step_count_, lr,
                           hyper_);
    else
        adamw_update(param, shard_grad_, exp_avg_, exp_avg_sq_, step_count_, lr, hyper_);
    // Every rank gets every updated shard; the parameters are views of flat_param_.
    const auto t0 = std::chrono::steady_clock::now();
    torch::Tensor mine = param.clone();
    // Through the asynchronous form for its handle (timed on the device with NCCL, where the
    // host time below is only the launch); waited for at once, as the blocking call would.
    gather_work_ = comm_.allgather_async(mine, flat_param_);
    if (gather_work_) gather_work_->wait();
    allgather_s_ = since(t0);
}

torch::Tensor ZeroOptimizer::shard_gradient_sum() const {
    return shard_grad_.numel() == 0 ? torch::Tensor()
                                    : nonfinite_marker({shard_grad_}, shard_grad_.device());
}

void ZeroOptimizer::save(torch::serialize::OutputArchive& out) const {
    out.write("exp_avg", exp_avg_, /*is_buffer=*/true);
    out.write("exp_avg_sq", exp_avg_sq_, /*is_buffer=*/true);
    out.write("step_count", c10::IValue(step_count_));
}

void ZeroOptimizer::load(torch::serialize::InputArchive& in) {
    torch::NoGradGuard no_grad;
    torch::Tensor a, b;
    in.read("exp_avg", a, /*is_buffer=*/true);
    in.read("exp_avg_sq", b, /*is_buffer=*/true);
    if (!a.sizes().equals(exp_avg_.sizes()) || !b.sizes().equals(exp_avg_sq_.sizes()))
        throw core::InputError("checkpoint: the ZeRO optimizer shard has " +
                               std::to_string(a.numel()) + " elements, this rank's has " +
                               std::to_string(exp_avg_.numel()) +
                               ": resume with the same model and rank count");
    exp_avg_.copy_(a);
    exp_avg_sq_.copy_(b);
    c10::IValue steps;
    in.read("step_count", steps);
    step_count_ = steps.toInt();
}

void ZeroOptimizer::load_resharded(ShardSource& saved) {
    torch::NoGradGuard no_grad;
    exp_avg_.copy_(saved.reshard("zero_shard", "exp_avg", numel_, rank_, world_));
    exp_avg_sq_.copy_(saved.reshard("zero_shard", "exp_avg_sq", numel_, rank_, world_));
    torch::serialize::InputArchive part;
    saved.rank(0).read("zero_shard", part);
    c10::IValue steps;
    part.read("step_count", steps);
    step_count_ = steps.toInt();
}

double ZeroOptimizer::parameter_bytes() const {
    return static_cast<double>(flat_param_.nbytes());
}
double ZeroOptimizer::gradient_bytes() const {
    return static_cast<double>(shard_grad_.nbytes()) +
           (flat_grad_.defined() ? static_cast<double>(flat_grad_.nbytes()) : 0.0);
}
double ZeroOptimizer::optimizer_state_bytes() const {
    return static_cast<double>(exp_avg_.nbytes() + exp_avg_sq_.nbytes());
}
double ZeroOptimizer::bytes_per_iteration() const {
    if (!reduce_dtype_) return uncompressed_bytes_per_iteration();
    return static_cast<double>(flat_param_.nbytes()) +
           static_cast<double>(padded_) * static_cast<double>(c10::elementSize(*reduce_dtype_));
}
double ZeroOptimizer::uncompressed_bytes_per_iteration() const {
    return static_cast<double>(flat_param_.nbytes()) * 2.0; // reduce-scatter in + all-gather out
}

namespace {

class ZeroParallelism final : public DataParallelism {
  public:
    ZeroParallelism(Communicator& comm, TrainableSet trainable, int stage, ZeroAdamW hyper,
                    std::optional<torch::ScalarType> reduce_dtype)
        : t_(std::move(trainable)), zero_(comm, t_.tensors, stage, hyper, reduce_dtype) {}

    std::string name() const override { return "zero" + std::to_string(zero_.stage()); }
    void begin_iteration() override { zero_.zero_grad(); }
    void finish_gradients(double grad_scale) override {
        host_s_ = zero_.reduce_gradients(grad_scale);
    }
    std::vector<torch::Tensor> gradient_shard_sums() const override {
        return {zero_.shard_gradient_sum()};
    }
    void set_lr(double lr) override { lr_ = lr; }
    bool step(const OptimizerStep&) override {
        zero_.step(lr_);
        return true;
    }
    PendingParallelComm take_iteration_comm() override {
        // The gradient reduce-scatter and the parameter all-gather, each flat buffer once: their
        // bytes with both collectives' durations (counting the reduce-scatter's alone made the
        // bandwidth twice too high).
        PendingParallelComm p;
        p.known.bytes = zero_.bytes_per_iteration();
        p.known.uncompressed_bytes = zero_.uncompressed_bytes_per_iteration();
        p.known.allgather_bytes = p.known.uncompressed_bytes / 2;
        p.known.reduce_scatter_bytes = p.known.bytes - p.known.allgather_bytes;
        p.known.collective_s = host_s_ + zero_.allgather_seconds();
        std::shared_ptr<Work> rs = zero_.reduce_work(), ag = zero_.gather_work();
        if (rs && ag) {
            p.known.collective_s = ParallelComm::kNaN;
            p.resolve = [known = p.known, rs, ag] {
                ParallelComm c = known;
                c.reduce_scatter_s = rs->seconds();
                c.allgather_s = ag->seconds();
                c.collective_s = c.reduce_scatter_s + c.allgather_s;
                return c;
            };
        }
        return p;
    }
    HeldBytes held_bytes() const override {
        HeldBytes h;
        for (const auto& t : t_.tensors)
            h.trainable += static_cast<double>(t.nbytes());
        h.gradients = zero_.gradient_bytes();
        h.optimizer_state = zero_.optimizer_state_bytes();
        return h;
    }
    void save(torch::serialize::OutputArchive& out, int rank) const override {
        if (rank == 0) save_weights(out, t_);
        torch::serialize::OutputArchive shard;
        zero_.save(shard);
        out.write("zero_shard", shard);
    }
    void load(ShardSource& saved, int rank, bool elastic) override {
        load_weights(saved, t_);
        if (elastic) return zero_.load_resharded(saved);
        torch::serialize::InputArchive shard;
        saved.rank(rank).read("zero_shard", shard);
        zero_.load(shard);
    }
    std::vector<torch::Tensor> full_trainable() override { return cpu_clones(t_.tensors); }

  private:
    TrainableSet t_;
    ZeroOptimizer zero_;
    double lr_ = 0, host_s_ = 0;
};

} // namespace

std::unique_ptr<DataParallelism> make_zero(Communicator& comm, TrainableSet trainable, int stage,
                                           ZeroAdamW hyper,
                                           std::optional<torch::ScalarType> reduce_dtype) {
    return std::make_unique<ZeroParallelism>(comm, std::move(trainable), stage, hyper,
                                             reduce_dtype);
}

double zero_buffer_bytes(std::int64_t numel, int world, const CompressionOptions& compression) {
    const std::optional<torch::ScalarType> low = compressed_dtype(compression.kind);
    if (world <= 1 || !low) return 0.0; // as the constructor: nothing travels at one rank
    const std::int64_t shard = (numel + world - 1) / world;
    return static_cast<double>(shard) * static_cast<double>(c10::elementSize(*low));
}

} // namespace trainscope::dist
