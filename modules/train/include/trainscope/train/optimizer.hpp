// The optimizer of a replicated model (single process, DDP): dist::FusedSGD / dist::FusedAdamW, or
// LibTorch's per-parameter torch::optim::SGD / AdamW with train.fused_optimizer=false. SGD takes
// train.momentum and train.nesterov only where `with_momentum` (the CV trainer; the LLM trainer's
// SGD is plain, as before).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "trainscope/train/options.hpp"

namespace trainscope::train {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& opt,
                                                        const std::vector<torch::Tensor>& params,
                                                        bool with_momentum);

} // namespace trainscope::train
