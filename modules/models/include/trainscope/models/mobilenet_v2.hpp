// MobileNetV2 (Sandler et al. 2018) as LibTorch modules: the studies' CV model. Same layer layout,
// channel rounding and initialisation as torchvision's mobilenet_v2, so parameter counts and
// behaviour compare one to one with PyTorch runs. Works for any input side >= 32 (stride 32 total).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "trainscope/models/sync_batch_norm.hpp"

namespace trainscope::core {
class Config;
class OptionRegistry;
} // namespace trainscope::core

namespace trainscope::models {

// cv.model, cv.width_mult, cv.dropout, cv.sync_bn
void declare_options(core::OptionRegistry& registry);

struct MobileNetV2Options {
    std::int64_t num_classes = 1000;
    double width_mult = 1.0;
    double dropout = 0.2;
    std::int64_t in_channels = 3;
    // Set (cv.sync_bn, by the trainer, to the communicator's allreduce): every batch-norm layer is
    // a SyncBatchNorm2d using it, under the same names. Empty: plain torch::nn::BatchNorm2d.
    AllreduceSum sync_bn_allreduce;
};

// Convolution → batch-norm → ReLU6, the network's basic unit (padding keeps "same" size at stride
// 1). The batch-norm child "bn" is a SyncBatchNorm2d when `sync_bn_allreduce` is set.
class ConvBNReLU6Impl : public torch::nn::Module {
  public:
    ConvBNReLU6Impl(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t stride,
                    std::int64_t groups, const AllreduceSum& sync_bn_allreduce = {});
    torch::Tensor forward(const torch::Tensor& x);

  private:
    torch::nn::Conv2d conv_{nullptr};
    torch::nn::BatchNorm2d bn_{nullptr}; // exactly one of these two is set
    SyncBatchNorm2d sync_bn_{nullptr};
};
TORCH_MODULE(ConvBNReLU6);

// One inverted-residual block: 1x1 expansion (skipped when t == 1) → 3x3 depthwise → 1x1 linear
// projection; a residual connection when stride is 1 and channels are unchanged.
class InvertedResidualImpl : public torch::nn::Module {
  public:
    InvertedResidualImpl(std::int64_t in, std::int64_t out, std::int64_t stride,
                         std::int64_t expand_ratio, const AllreduceSum& sync_bn_allreduce = {});
    torch::Tensor forward(const torch::Tensor& x); // [B, in, H, W] → [B, out, H/stride, W/stride]

  private:
    bool use_residual_;
    torch::nn::Sequential body_{nullptr};
};
TORCH_MODULE(InvertedResidual);

class MobileNetV2Impl : public torch::nn::Module {
  public:
    explicit MobileNetV2Impl(const MobileNetV2Options& options);
    torch::Tensor forward(const torch::Tensor& x); // [B, C, S, S] → logits [B, num_classes]

    // The layer sequence (stem, 17 blocks, last 1x1 conv), kept separate from the classifier so
    // that a later pipeline strategy can split it into stages.
    torch::nn::Sequential features{nullptr};
    torch::nn::Sequential classifier{nullptr};
};
TORCH_MODULE(MobileNetV2);

MobileNetV2Options mobilenet_options_from_config(const core::Config& cfg, std::int64_t num_classes,
                                                 std::int64_t in_channels);

// Number of trainable parameters (elements).
std::int64_t count_parameters(const torch::nn::Module& module);

// Per-sample cost of one forward pass for a square input of side `image_size`, walked layer by
// layer: multiply-accumulates of convolutions and the classifier (what model summaries call
// "MACs"), and the elements of the tensors autograd keeps for backward (conv outputs, batch-norm
// outputs and activations; the input not included): the activation memory of --dry-run's plan.
struct ForwardCost {
    std::int64_t macs = 0;
    std::int64_t activation_elements = 0;
};
ForwardCost mobilenet_v2_cost(const MobileNetV2Options& options, std::int64_t image_size);

} // namespace trainscope::models
