// Quantisation-aware training as torchao's Int8DynActInt4WeightQATQuantizer ("8da4w") used by
// torchtune: activations fake-quantised to int8, asymmetric, per token, dynamic (scale and zero
// point from each token's min/max); weights fake-quantised to int4, symmetric, per group of 256
// along the input dimension, range [-8, 7]. Fake quant q(x) = (clamp(round(x / s + zp), lo, hi) -
// zp) * s with straight-through gradients (d q / d x = 1). Can start after N steps.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

#include "trainscope/models/projection.hpp"

namespace trainscope::models {

// Per-token int8 asymmetric fake quantisation of x [..., in] (straight-through gradient).
torch::Tensor fake_quantize_activations_int8(const torch::Tensor& x);
// Per-group int4 symmetric fake quantisation of w [out, in] (in % group_size == 0; else
// core::ConfigError naming the shape), straight-through gradient.
torch::Tensor fake_quantize_weights_int4(const torch::Tensor& w, std::int64_t group_size = 256);

// Wraps a plain projection (sharing its weight parameter "weight", trainable or not): while
// enabled, forward = linear(fq_act(x), fq_w(W)); while disabled, the plain projection.
class QatProjectionImpl : public ProjectionImpl {
  public:
    QatProjectionImpl(std::shared_ptr<LinearProjectionImpl> base, std::int64_t group_size);
    torch::Tensor forward(const torch::Tensor& x) override;
    torch::Tensor dense_weight() const override { return weight; }
    std::string kind() const override { return "qat"; }
    void set_enabled(bool on) { enabled_ = on; }
    bool enabled() const { return enabled_; }
    torch::Tensor weight;

  private:
    std::int64_t group_size_;
    bool enabled_ = true;
};

// Wraps every plain projection inside the decoder layers (attention and MLP) in a QatProjection;
// returns how many. Apply before LoRA for QAT + LoRA (LoRA then wraps the QAT projection).
// With a scope (projection.hpp), only the projections in it.
std::int64_t apply_qat(torch::nn::Module& model, std::int64_t group_size = 256,
                       const NameScope& scope = {});
// Turns fake quantisation on/off everywhere (llm.qat.start_step).
void set_qat_enabled(torch::nn::Module& model, bool on);

} // namespace trainscope::models
