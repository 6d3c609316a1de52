// Optimizer steps through ATen's fused multi-tensor kernels (at::_fused_adamw_, at::_fused_sgd_;
// CPU and CUDA), as torch.optim's fused=True: one kernel launch per (device, dtype) group and step
// instead of ~10 per parameter (LibTorch's torch::optim::AdamW/SGD loop over parameters).
// FusedAdamW and FusedSGD are torch::optim::AdamW and SGD with only step() replaced: parameter
// groups, options, per-parameter state (AdamWParamState, SGDParamState), save() and load() are
// theirs, so checkpoints and the state byte counts do not change. Options the fused kernels do not
// cover (AdamW amsgrad) fall back to the parent's step.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace trainscope::dist {

class FusedAdamW : public torch::optim::AdamW {
  public:
    using torch::optim::AdamW::AdamW;
    torch::Tensor step(LossClosure closure = nullptr) override;

  private:
    // The fused kernel reads each parameter's step count from a float32 scalar tensor on the
    // parameter's device; kept here beside the state's int64 count (re-made after load()).
    struct Step {
        std::int64_t count = -1;
        torch::Tensor tensor;
    };
    std::unordered_map<const void*, Step> steps_;
};

class FusedSGD : public torch::optim::SGD {
  public:
    using torch::optim::SGD::SGD;
    torch::Tensor step(LossClosure closure = nullptr) override;
};

// AdamW of ZeRO and FSDP shards. fused = false: adamw_update's operations per tensor (zero.hpp),
// the arithmetic before the fused kernels (train.fused_optimizer=false).
struct ZeroAdamW {
    double lr = 3e-4, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
    bool fused = true;
};

// One AdamW update of every params[i] in place from grads[i] and its moments, all at step `step`
// (1, 2, ...): torch.optim.AdamW's arithmetic (decoupled decay, then the moments, bias
// corrections) in one fused kernel per (device, dtype) group. ZeRO and FSDP step their flat shards
// with it.
void fused_adamw_update(const std::vector<torch::Tensor>& params,
                        const std::vector<torch::Tensor>& grads,
                        const std::vector<torch::Tensor>& exp_avgs,
                        const std::vector<torch::Tensor>& exp_avg_sqs, std::int64_t step, double lr,
                        const ZeroAdamW& h);

// Multiplies every defined tensor by `factor` in one multi-tensor call per (device, dtype) group.
void foreach_scale(const std::vector<torch::Tensor>& tensors, double factor);

// A float64 0-d tensor on the tensors' device: NaN iff an element of any of them is NaN or Inf,
// else 0 (so that sums of such markers stay NaN iff one is), computed by
// at::_amp_foreach_non_finite_check_and_unscale_ (one multi-tensor kernel per group, scale 1: the
// values are unchanged) for fp32/fp64/fp16 groups, and for bf16 (no CUDA kernel of that op) by
// at::_foreach_norm's per-tensor sums of magnitudes; no host read. Undefined tensors are
// skipped; none: 0 on `fallback`.
torch::Tensor nonfinite_marker(const std::vector<torch::Tensor>& tensors,
                               const torch::Device& fallback);

} // namespace trainscope::dist
