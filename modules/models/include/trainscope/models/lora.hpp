// LoRA (Hu et al. 2021) as torchtune applies it: out = W0 x + (alpha / rank) * B(A(dropout(x))),
// A [rank, in] kaiming-uniform(a = sqrt(5)), B [out, rank] zeros, W0 frozen. Adapters can be
// switched off (DPO's reference model is the policy with adapters disabled) and merged into W0.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainscope/models/llama.hpp"
#include "trainscope/models/projection.hpp"

namespace trainscope::models {

struct LoraOptions {
    std::int64_t rank = 8;
    double alpha = 16.0;
    double dropout = 0.0;
    // Hugging Face projection names (the last component of the module path): any of q_proj,
    // k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head. Default as torchtune's
    // Llama-3-8B LoRA configs: attention q/v/o and the whole MLP.
    std::vector<std::string> targets{"q_proj",    "v_proj",  "o_proj",
                                     "gate_proj", "up_proj", "down_proj"};
};

// LoRA around any base projection (plain, NF4, fake-quantised). Children: "base" (the wrapped
// projection, frozen), parameters "lora_a" [rank, in] and "lora_b" [out, rank] in the base's
// compute dtype, trainable.
class LoraProjectionImpl : public ProjectionImpl {
  public:
    // lora_a's initial values come from `generator` when given (drawn on the host), else from
    // the default generator of the base's device.
    LoraProjectionImpl(std::shared_ptr<ProjectionImpl> base, const LoraOptions& options,
                       std::optional<at::Generator> generator = std::nullopt);
    torch::Tensor forward(const torch::Tensor& x) override;
    torch::Tensor dense_weight() const override { return base->dense_weight(); }
    std::string kind() const override;

    // W0 + (alpha / rank) B A, dense in the compute dtype.
    torch::Tensor merged_weight() const;
    void set_adapters_enabled(bool on) { adapters_enabled_ = on; }
    bool adapters_enabled() const { return adapters_enabled_; }

    std::shared_ptr<ProjectionImpl> base;
    torch::Tensor lora_a, lora_b;
    const double scaling; // alpha / rank

  private:
    double dropout_;
    bool adapters_enabled_ = true;
};

// Throws core::ConfigError naming llm.lora.targets, the unknown name and the valid ones.
void validate_lora_targets(const std::vector<std::string>& targets);

// Wraps every projection of `model` whose name is in options.targets (validated: an unknown target
// throws core::ConfigError listing the valid ones), freezes every other parameter of the model,
// and returns the full names of the wrapped projections. With a scope, only the projections and
// parameters in it (projection.hpp), lora_a drawn from `generator` when given.
std::vector<std::string> apply_lora(torch::nn::Module& model, const LoraOptions& options,
                                    const NameScope& scope = {},
                                    std::optional<at::Generator> generator = std::nullopt);

// All LoRA parameters ("<projection>.lora_a", "<projection>.lora_b") in model order.
std::vector<std::pair<std::string, torch::Tensor>> lora_parameters(torch::nn::Module& model);

// Adapters on/off for every LoraProjection below `model`.
void set_adapters_enabled(torch::nn::Module& model, bool on);

// Replaces every LoraProjection over a plain LinearProjection by a LinearProjection with the merged
// weight (for export and the merged-vs-unmerged test).
void merge_lora(torch::nn::Module& model);

// Writes the LoRA adapters of `model` as a PEFT adapter directory, the layout
// peft.PeftModel.from_pretrained(base_model, dir) loads:
//   adapter_model.safetensors  PEFT's names: base_model.model.model.layers.N.<path>.lora_A.weight
//                              [rank, in] and .lora_B.weight [out, rank] (lm_head without the
//                              inner "model."), in the adapters' dtype
//   adapter_config.json        peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout,
//                              target_modules (the projections actually wrapped), bias "none",
//                              base_model_name_or_path (`base_model`; empty = null)
// `dir` is created (its parent must exist); each file is replaced atomically, the config last, so
// a directory with a config always has its weights. Returns the number of tensors written (0 = the
// model has no adapters: nothing is written). Throws core::OutputError naming the path.
std::int64_t save_peft_adapter(const std::string& dir, torch::nn::Module& model,
                               const LoraOptions& options, const std::string& base_model);

// Trainable LoRA parameters by arithmetic for a Llama config (no allocation): for each target
// projection rank * (in + out), times the number of layers (lm_head once). Llama-3-8B with the
// defaults: 19,660,800.
std::int64_t lora_parameter_count(const LlamaConfig& config, const LoraOptions& options);

} // namespace trainscope::models
