// SyncBatchNorm2d: joint-batch statistics with one fused allreduce in forward and one in backward,
// plain tensor ops only (so CPU and CUDA share the code; LibTorch's batch_norm_gather_stats & co.
// are CUDA-only). The backward is an autograd Function because it must communicate too.
#include "trainscope/models/sync_batch_norm.hpp"

#include <ATen/core/ivalue.h>

#include <sstream>
#include <utility>

#include "trainscope/core/error.hpp"

namespace trainscope::models {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Holds the callback in the autograd context (saved_data holds IValues; a capsule is the IValue
// that carries an arbitrary C++ object) so that backward can still communicate after forward's
// module call returned.
struct AllreduceHandle : torch::CustomClassHolder {
    explicit AllreduceHandle(AllreduceSum f) : fn(std::move(f)) {}
    AllreduceSum fn;
};

// Per-channel [C] vector → [1, C, 1, 1], broadcastable against NCHW input in any memory format.
Tensor per_channel(const Tensor& v) {
    return v.view({1, -1, 1, 1});
}

// float64 for float64 inputs, else float32 (half/bfloat16 inputs under autocast reduce in float).
torch::Dtype accumulate_dtype(const Tensor& x) {
    return x.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

struct JointStats {
    Tensor mean, invstd; // [C], accumulate dtype
    Tensor var_unbiased; // [C], float64: for running_var
    Tensor count;        // [1], accumulate dtype: elements per channel over all ranks
};

// Mean and variance over the joint batch with one allreduce. Each rank reduces its own batch with
// a (numerically stable) Welford pass and sends n_r * mean_r and n_r * (var_r + mean_r^2); the
// buffer is float64 even for float32 inputs, so that E[x^2] - E[x]^2 over ranks does not cancel
// catastrophically for channels whose mean is large compared with their spread.
JointStats joint_stats(const Tensor& x, double eps, const AllreduceSum& allreduce_sum) {
    torch::NoGradGuard no_grad;
    const std::int64_t channels = x.size(1);
    const std::int64_t local_count = x.numel() / channels; // N * H * W
    Tensor buffer = torch::zeros({2 * channels + 1}, x.options().dtype(torch::kFloat64));
    if (local_count > 0) {
        const Tensor xs = x.is_floating_point() && x.element_size() < 4 ? x.to(torch::kFloat32) : x;
        auto [var, mean] = torch::var_mean(xs, {0, 2, 3}, /*unbiased=*/false, /*keepdim=*/false);
        const Tensor mean64 = mean.to(torch::kFloat64);
        buffer.narrow(0, 0, channels).copy_(mean64 * static_cast<double>(local_count));
        buffer.narrow(0, channels, channels)
            .copy_((var.to(torch::kFloat64) + mean64 * mean64) * static_cast<double>(local_count));
        buffer.narrow(0, 2 * channels, 1).fill_(static_cast<double>(local_count));
    }
    if (allreduce_sum) allreduce_sum(buffer);

    const Tensor count = buffer.narrow(0, 2 * channels, 1); // [1]
    if (x.device().is_cpu()) {
        // Checked where it costs nothing; on a GPU this would synchronise the device per layer.
        const double n = count.item<double>();
        if (n <= 1)
            throw core::InputError(
                "SyncBatchNorm2d: training needs more than one value per channel over all ranks, "
                "got " +
                std::to_string(static_cast<std::int64_t>(n)) + " (local input " +
                c10::str(x.sizes()) +
                "); use a larger per-rank batch (train.batch_size) or larger images");
    }
    const Tensor mean = buffer.narrow(0, 0, channels) / count;
    // Biased variance; clamped because rounding can leave a tiny negative for constant channels.
    const Tensor var = (buffer.narrow(0, channels, channels) / count - mean * mean).clamp_min(0.0);
    const auto acc = accumulate_dtype(x);
    return {mean.to(acc), torch::rsqrt(var + eps).to(acc), var * count / (count - 1),
            count.to(acc)};
}

// y = (x - mean) * invstd * weight + bias with the joint statistics; backward communicates.
class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
  public:
    static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& weight,
                          const Tensor& bias, const Tensor& mean, const Tensor& invstd,
                          const Tensor& count, const c10::intrusive_ptr<AllreduceHandle>& handle) {
        // Folded into one multiply-add per element: scale = invstd * weight, shift = bias - mean *
        // scale ([C] each).
        Tensor scale = weight.defined() ? invstd * weight.to(invstd.scalar_type()) : invstd;
        Tensor shift = -mean * scale;
        if (bias.defined()) shift = shift + bias.to(shift.scalar_type());
        ctx->save_for_backward({x, weight, mean, invstd, count});
        ctx->saved_data["allreduce"] = c10::IValue::make_capsule(handle);
        return torch::addcmul(per_channel(shift.to(x.scalar_type())), x,
                              per_channel(scale.to(x.scalar_type())));
    }

    static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
        const Tensor& dy = grad_outputs[0];
        const auto saved = ctx->get_saved_variables();
        const Tensor &x = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3],
                     &count = saved[4];
        const std::int64_t channels = x.size(1);
        const auto acc = invstd.scalar_type();
        const Tensor xmu = x - per_channel(mean.to(x.scalar_type())); // [N, C, H, W]
        Tensor sums = torch::cat(
            {dy.sum({0, 2, 3}, false, acc), (dy * xmu).sum({0, 2, 3}, false, acc)}); // [2C]
        const Tensor sum_dy = sums.narrow(0, 0, channels);
        const Tensor sum_dy_xmu = sums.narrow(0, channels, channels);

        // Local contributions (the caller's gradient synchronisation sums them over ranks).
        Tensor grad_weight, grad_bias;
        if (weight.defined() && ctx->needs_input_grad(1))
            grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
        if (weight.defined() && ctx->needs_input_grad(2))
            grad_bias = sum_dy.to(weight.scalar_type()).clone();

        Tensor grad_x;
        // needs_input_grad(0) is the same on every rank (same model), so either all ranks
        // communicate here or none does.
        if (ctx->needs_input_grad(0)) {
            const auto handle = c10::static_intrusive_pointer_cast<AllreduceHandle>(
                ctx->saved_data["allreduce"].toCapsule());
            if (handle->fn) handle->fn(sums);
            const Tensor mean_dy = sums.narrow(0, 0, channels) / count;
            const Tensor mean_dy_xmu = sums.narrow(0, channels, channels) / count;
            const Tensor w_invstd = weight.defined() ? invstd * weight.to(acc) : invstd;
            // dx = w*invstd * (dy - mean(dy) - (x-mean) * invstd^2 * mean(dy*(x-mean))), joint
            // means
            const Tensor k_xmu = -w_invstd * invstd * invstd * mean_dy_xmu;
            const Tensor k_const = -w_invstd * mean_dy;
            const auto dt = x.scalar_type();
            grad_x = torch::addcmul(per_channel(k_const.to(dt)), dy, per_channel(w_invstd.to(dt)));
            grad_x.addcmul_(xmu, per_channel(k_xmu.to(dt)));
        }
        return {grad_x, grad_weight, grad_bias, Tensor(), Tensor(), Tensor(), Tensor()};
    }
};

} // namespace

SyncBatchNorm2dImpl::SyncBatchNorm2dImpl(const torch::nn::BatchNorm2dOptions& options_,
                                         AllreduceSum allreduce_sum)
    : options(options_), allreduce_sum_(std::move(allreduce_sum)) {
    reset();
}

void SyncBatchNorm2dImpl::reset() {
    // Same registration order, names, shapes and dtypes as torch::nn::BatchNorm2d.
    const std::int64_t c = options.num_features();
    if (options.affine()) {
        weight = register_parameter("weight", torch::empty({c}));
        bias = register_parameter("bias", torch::empty({c}));
    } else {
        weight = register_parameter("weight", Tensor(), /*requires_grad=*/false);
        bias = register_parameter("bias", Tensor(), /*requires_grad=*/false);
    }
    if (options.track_running_stats()) {
        running_mean = register_buffer("running_mean", torch::zeros({c}));
        running_var = register_buffer("running_var", torch::ones({c}));
        num_batches_tracked =
            register_buffer("num_batches_tracked", torch::tensor(0, torch::dtype(torch::kLong)));
    } else {
        running_mean = register_buffer("running_mean", Tensor());
        running_var = register_buffer("running_var", Tensor());
        num_batches_tracked = register_buffer("num_batches_tracked", Tensor());
    }
    reset_parameters();
}

void SyncBatchNorm2dImpl::reset_running_stats() {
    if (!options.track_running_stats()) return;
    running_mean.zero_();
    running_var.fill_(1);
    num_batches_tracked.zero_();
}

void SyncBatchNorm2dImpl::reset_parameters() {
    reset_running_stats();
    if (options.affine()) {
        torch::nn::init::ones_(weight);
        torch::nn::init::zeros_(bias);
    }
}

void SyncBatchNorm2dImpl::pretty_print(std::ostream& stream) const {
    stream << std::boolalpha << "trainscope::models::SyncBatchNorm2d(" << options.num_features()
           << ", eps=" << options.eps() << ", momentum=";
    if (options.momentum())
        stream << *options.momentum();
    else
        stream << "None";
    stream << ", affine=" << options.affine()
           << ", track_running_stats=" << options.track_running_stats() << ")";
}

Tensor SyncBatchNorm2dImpl::forward(const Tensor& x) {
    if (x.dim() != 4 || x.size(1) != options.num_features())
        throw core::InternalError(
            "SyncBatchNorm2d(" + std::to_string(options.num_features()) + "): expected input [N, " +
            std::to_string(options.num_features()) + ", H, W], got " + c10::str(x.sizes()));
    if (!is_training()) {
        // Eval: running statistics (BatchNorm2d's own path), or without them this rank's batch
        // statistics, as PyTorch's SyncBatchNorm (it synchronises only in training mode).
        return torch::batch_norm(x, weight, bias, running_mean, running_var,
                                 /*training=*/!options.track_running_stats(), /*momentum=*/0.0,
                                 options.eps(), at::globalContext().userEnabledCuDNN());
    }
    const JointStats stats = joint_stats(x, options.eps(), allreduce_sum_);
    if (options.track_running_stats()) {
        torch::NoGradGuard no_grad;
        num_batches_tracked += 1;
        const double factor =
            options.momentum() ? *options.momentum() : 1.0 / num_batches_tracked.item<double>();
        running_mean.mul_(1.0 - factor).add_(stats.mean.to(running_mean.scalar_type()), factor);
        running_var.mul_(1.0 - factor)
            .add_(stats.var_unbiased.to(running_var.scalar_type()), factor);
    }
    return SyncBatchNormFunction::apply(x, weight, bias, stats.mean, stats.invstd, stats.count,
                                        c10::make_intrusive<AllreduceHandle>(allreduce_sum_));
}

} // namespace trainscope::models
