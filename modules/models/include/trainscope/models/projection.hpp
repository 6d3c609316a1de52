// The linear projections of a transformer block (q/k/v/o, gate/up/down, the output head) behind one
// interface, so the fine-tuning methods swap them in place: a plain bias-free linear layer, LoRA
// over it, NF4-quantised base weights (QLoRA), fake-quantised weights and activations (QAT). Llama
// builds plain LinearProjection children; lora.hpp / nf4.hpp / fake_quant.hpp replace them.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace trainscope::models {

// y = x W^T for x [..., in_features] -> y [..., out_features]; no bias (Llama has none).
class ProjectionImpl : public torch::nn::Module {
  public:
    ProjectionImpl(std::int64_t in_features, std::int64_t out_features)
        : in_features(in_features), out_features(out_features) {}
    virtual torch::Tensor forward(const torch::Tensor& x) = 0;
    // The base weight [out, in] as a dense tensor in the compute dtype (dequantised for NF4),
    // without any adapter contribution. For merging, checkpoints and tests.
    virtual torch::Tensor dense_weight() const = 0;
    // Short name of the kind for logs and the run file: "linear", "lora", "nf4", "nf4+lora",
    // "qat", "qat+lora".
    virtual std::string kind() const = 0;

    const std::int64_t in_features, out_features;
};

// The plain projection: one parameter "weight" [out, in] (the Hugging Face name and layout).
class LinearProjectionImpl : public ProjectionImpl {
  public:
    LinearProjectionImpl(std::int64_t in_features, std::int64_t out_features,
                         const torch::TensorOptions& options);
    torch::Tensor forward(const torch::Tensor& x) override;
    torch::Tensor dense_weight() const override { return weight; }
    std::string kind() const override { return "linear"; }

    torch::Tensor weight;
};

// Calls fn for every ProjectionImpl below root (depth first, in registration order) with its
// parent module, its name inside the parent ("q_proj") and its full dotted name from root
// ("layers.0.self_attn.q_proj"). fn may replace the child: parent.replace_module(child_name, m).
using ProjectionVisitor =
    std::function<void(torch::nn::Module& parent, const std::string& child_name,
                       const std::string& full_name, std::shared_ptr<ProjectionImpl> projection)>;
void for_each_projection(torch::nn::Module& root, const ProjectionVisitor& fn);

// The part of a model a transform (LoRA, NF4, QAT) applies to, as prefixes of dotted names
// ("layers.3.", "lm_head."): empty = the whole model. A model materialised one unit at a time is
// transformed one unit at a time, each call touching only that unit's projections and parameters.
using NameScope = std::vector<std::string>;
// True when `name` ("layers.3.mlp.up_proj", or "lm_head" for the prefix "lm_head.") is in scope.
bool in_scope(const NameScope& scope, const std::string& name);

} // namespace trainscope::models
