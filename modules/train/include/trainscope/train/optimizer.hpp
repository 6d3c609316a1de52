// The optimizer of a replicated model (single process, DDP): dist::FusedSGD / dist::FusedAdamW, or
// LibTorch's per-parameter torch::optim::SGD / AdamW with train.fused_optimizer=false. SGD takes
// train.momentum and train.nesterov only where `with_momentum` (the CV trainer; the LLM trainer's
// SGD is plain, as before). And the data parallelism of a set of trainable tensors that both
// trainers build from the configuration: DDP with such a local optimizer, or ZeRO-1/2.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/fused_optim.hpp"
#include "trainscope/distributed/options.hpp"
#include "trainscope/distributed/parallelism.hpp"
#include "trainscope/train/options.hpp"

namespace trainscope::train {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerConfig& opt,
                                                        const std::vector<torch::Tensor>& params,
                                                        bool with_momentum);

// The sharded optimizers' AdamW hyper-parameters (train.lr, train.weight_decay,
// train.fused_optimizer).
dist::ZeroAdamW zero_adamw(const OptimizerConfig& opt);

// The data parallelism of `trainable` over `comm` as dist.zero asks, for the kinds both workloads
// run: ZeroStage::None is DDP (buckets of bucket_bytes, the first of first_bucket_bytes, with
// dist.compress) around make_optimizer(opt, .., with_momentum); OptimizerState and Gradients are
// ZeRO-1/2 (AdamW, gradients reduced in compression's 16-bit dtype under fp16/bf16). The
// workloads refused other optimizers and loss scaling under ZeRO (InternalError here). FSDP
// (dist.zero=3) needs the model's units: parallelize_llm builds it.
std::unique_ptr<dist::DataParallelism>
make_data_parallelism(dist::ZeroStage zero, const OptimizerConfig& opt, bool with_momentum,
                      bool loss_scaling, dist::Communicator& comm, dist::TrainableSet trainable,
                      std::size_t bucket_bytes, std::size_t first_bucket_bytes,
                      const dist::CompressionOptions& compression);

} // namespace trainscope::train
