// Llama (Llama-3 / 3.1 / 3.2) decoder-only transformer as LibTorch modules, configured from a
// Hugging Face config.json or a named preset, with weights from Hugging Face safetensors. Module
// and parameter names follow Hugging Face's LlamaForCausalLM without the "model." prefix
// ("layers.0.self_attn.q_proj.weight", "embed_tokens.weight", "norm.weight", "lm_head.weight"), so
// checkpoints map one to one and LoRA targets use Hugging Face's projection names.
//
// Numerics as torchtune/HF: RMSNorm computed in fp32 and cast back; rotary embeddings in HF's
// rotate-half convention with the cos/sin cache computed in fp32 (Llama-3.1 frequency scaling when
// configured); grouped-query attention through scaled_dot_product_attention (causal, or limited to
// each packed sample); SwiGLU MLP down(silu(gate(x)) * up(x)); untied output head unless
// tie_word_embeddings.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainscope/core/unit_hooks.hpp"
#include "trainscope/models/projection.hpp"

namespace trainscope::models {

// Llama-3.1's rope_scaling {"rope_type": "llama3", factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings}.
struct RopeScaling {
    bool enabled = false;
    double factor = 8.0;
    double low_freq_factor = 1.0;
    double high_freq_factor = 4.0;
    std::int64_t original_max_position_embeddings = 8192;
};

// One projection of a decoder layer: its child name ("q_proj") and weight shape [out, in].
struct ProjectionShape {
    std::string name;
    std::int64_t out = 0, in = 0;
    std::int64_t numel() const { return out * in; }
};

struct LlamaConfig {
    std::int64_t vocab_size = 128256;
    std::int64_t hidden_size = 4096;
    std::int64_t intermediate_size = 14336;
    std::int64_t num_hidden_layers = 32;
    std::int64_t num_attention_heads = 32;
    std::int64_t num_key_value_heads = 8;
    std::int64_t head_dim = 128; // hidden_size / num_attention_heads unless config.json says
    std::int64_t max_position_embeddings = 8192;
    double rms_norm_eps = 1e-5;
    double rope_theta = 500000.0;
    RopeScaling rope_scaling;
    bool tie_word_embeddings = false;
    std::string name = "custom"; // preset name or the config.json path, for logs and the run file

    // Parses a Hugging Face config.json (text / file). Missing optional keys take HF's defaults,
    // except the rotary base: rope_theta is read from "rope_parameters" (transformers >= 5) or the
    // top level (older; with "rope_scaling"), and a file with neither is refused. Missing required
    // keys, wrong types, inconsistent values (heads not dividing, GQA groups not integral) and
    // what trainscope's Llama cannot express (attention_bias / mlp_bias true, another
    // model_type, hidden_act or rope type, attention dropout) throw core::ConfigError naming the
    // key, the file and the fix: a setting is never ignored.
    static LlamaConfig from_hf_json_text(const std::string& json_text, const std::string& origin);
    static LlamaConfig from_hf_json_file(const std::string& path);
    // llm.model presets: llama3-8b, llama3.1-8b (rope scaling), llama3.2-1b, llama3.2-3b (both
    // tied, scaled rope factor 32), tiny (2 layers, hidden 256, 4 heads of 64, 2 KV heads, FFN
    // 512, vocab 1024 by default: a model the CPU tests and *-tiny.ini runs build themselves; its
    // projections are large enough for NF4's blocks of 64 x 256).
    static LlamaConfig preset(const std::string& name);
    void validate() const; // throws core::ConfigError

    // Parameter counts by arithmetic (no allocation): all weights, and per part.
    std::int64_t num_parameters() const;
    std::int64_t embedding_parameters() const; // vocab * hidden
    std::int64_t head_parameters() const;      // 0 when tied
    std::int64_t layer_parameters() const;     // one decoder layer incl. its two norms
    // A decoder layer's seven projections in registration order (q, k, v, o, gate, up, down):
    // the one statement of their shapes that parameter counts and memory plans derive from.
    std::vector<ProjectionShape> projection_shapes() const;
    std::int64_t projection_parameters() const; // one decoder layer's projection weights
    // Forward FLOPs per token for a sequence of `seq_len` (2 * matmul MACs incl. attention scores
    // and values, causal halving not applied; the head included), for MFU.
    double forward_flops_per_token(std::int64_t seq_len) const;
};

// Inverse frequencies [head_dim / 2] in fp32, with Llama-3.1 scaling applied when enabled.
torch::Tensor rope_inverse_frequencies(const LlamaConfig& config);

// RMSNorm with a learnt scale "weight" [dim]: x * rsqrt(mean(x^2) + eps) computed in fp32, cast
// back to the input dtype, then times weight (as HF: weight * normed.to(input_dtype)).
class RMSNormImpl : public torch::nn::Module {
  public:
    RMSNormImpl(std::int64_t dim, double eps, const torch::TensorOptions& options);
    torch::Tensor forward(const torch::Tensor& x);
    torch::Tensor weight;
    double eps;
};
TORCH_MODULE(RMSNorm);

// Per-batch attention inputs shared by all layers.
struct AttentionInputs {
    torch::Tensor cos, sin; // [B, T, head_dim] fp32 (rotate-half layout), from position_ids
    // Empty: plain causal attention. Else a bool mask [B, 1, T, T], true = may attend (causal and
    // within the same packed sample).
    torch::Tensor mask;
};

// The attention kernel: at::scaled_dot_product_attention of q [B, heads, T, d] over k, v
// [B, kv_heads, T, d], causal (mask undefined) or under a bool mask [B, 1, T, T]. With grouped
// queries (kv_heads < heads) SDPA's enable_gqa is accepted by the flash kernel, which takes no
// mask, but not by the memory-efficient one, so on a GPU a packed batch's GQA attention would fall
// back to the O(T^2)-memory math kernel. kv = Auto expands the KV heads to the query heads (a copy
// of k and v; SDPA then saves the expanded copies) exactly when at::_fused_sdp_choice picks the
// math kernel with enable_gqa and a fused kernel without it; Native never expands, Expand always
// (both for tests). Same outputs either way.
enum class GqaKv { Auto, Native, Expand };
torch::Tensor attention_kernel(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& mask,
                               GqaKv kv = GqaKv::Auto);

// The SDPA backend of a model's attention calls as at::_fused_sdp_choice reports it for these
// heads, a sequence of min(seq_len, 256) positions, causal (packed = false) or masked, on `device`
// in `dtype` (small probe tensors are made there): "flash", "efficient", "cudnn", "math", ...;
// kv_expanded says whether attention_kernel's Auto expands the KV heads for it.
struct SdpaChoice {
    std::string backend;
    bool kv_expanded = false;
};
SdpaChoice sdpa_choice(const LlamaConfig& config, std::int64_t seq_len, bool packed,
                       const torch::Device& device, torch::ScalarType dtype);

class LlamaAttentionImpl : public torch::nn::Module {
  public:
    LlamaAttentionImpl(const LlamaConfig& config, const torch::TensorOptions& options);
    torch::Tensor forward(const torch::Tensor& x, const AttentionInputs& in); // [B,T,H] -> [B,T,H]
    // Children "q_proj", "k_proj", "v_proj", "o_proj": looked up by name on every use, never held
    // in members, because LoRA/NF4/QAT replace them (a member would keep a replaced projection
    // and its dense weight alive).

  private:
    std::int64_t heads_, kv_heads_, head_dim_;
};
TORCH_MODULE(LlamaAttention);

class LlamaMLPImpl : public torch::nn::Module {
  public:
    LlamaMLPImpl(const LlamaConfig& config, const torch::TensorOptions& options);
    torch::Tensor forward(const torch::Tensor& x);
    // Children "gate_proj", "up_proj", "down_proj" (by name, as in LlamaAttentionImpl).
};
TORCH_MODULE(LlamaMLP);

class LlamaDecoderLayerImpl : public torch::nn::Module {
  public:
    LlamaDecoderLayerImpl(const LlamaConfig& config, const torch::TensorOptions& options);
    torch::Tensor forward(const torch::Tensor& x, const AttentionInputs& in);
    RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
    LlamaAttention self_attn{nullptr};
    LlamaMLP mlp{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

// Sharded data parallelism (FSDP, dist.zero=3) drives the model unit by unit through these calls.
// Units in forward order: 0 = embed_tokens, 1..L = the decoder layers, L + 1 = the head (norm and
// lm_head); the hooks' protocol is core::UnitHooks'.
using UnitHooks = core::UnitHooks;

// The causal LM: embed_tokens -> layers -> norm -> lm_head. Children: "embed_tokens"
// (torch::nn::Embedding), "layers" (ModuleList of LlamaDecoderLayer), "norm", "lm_head" (a
// LinearProjection, absent when tied: the head then reuses embed_tokens.weight).
class LlamaForCausalLMImpl : public torch::nn::Module {
  public:
    // Materialize::Now: parameters are created in options' dtype and device and initialised as HF
    // does for training from scratch (normal(0, 0.02) for projections and embeddings, ones for
    // norms), seeded by the caller's torch::manual_seed. Materialize::PerUnit: every parameter is
    // created on the meta device (shapes and dtypes, no memory) and materialize_unit() allocates
    // and initialises one unit at a time, so that sharded data parallelism never holds the whole
    // model (torchtune initialises on meta and materialises shards the same way).
    enum class Materialize { Now, PerUnit };
    LlamaForCausalLMImpl(const LlamaConfig& config, const torch::TensorOptions& options,
                         Materialize when = Materialize::Now);

    // input_ids [B, T] int64 -> logits [B, T, vocab] (in the parameters' dtype). position_ids
    // [B, T] (default 0..T-1 per row); segment_ids [B, T] int64 (packed samples: attention stays
    // inside equal ids, position_ids restart per sample); empty = one sample per row.
    torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& position_ids = {},
                          const torch::Tensor& segment_ids = {});
    // The final hidden states [B, T, hidden] (before lm_head), for losses that chunk the head.
    torch::Tensor hidden_states(const torch::Tensor& input_ids,
                                const torch::Tensor& position_ids = {},
                                const torch::Tensor& segment_ids = {});
    torch::Tensor head(const torch::Tensor& hidden); // hidden -> logits
    // The head's projection alone (hidden -> logits, no FSDP hooks), for losses that run it per
    // chunk of tokens: they call end_head_forward() once after the forward's last chunk and
    // begin_head_backward() before recomputing chunks in backward (FSDP gathers and reshards the
    // head unit there); head() does both itself.
    torch::Tensor project(const torch::Tensor& hidden);
    // The tensors project() uses as parameters: embed_tokens.weight when tied, else lm_head's
    // (LoRA's adapters included).
    std::vector<torch::Tensor> head_parameters();
    void end_head_forward();
    void begin_head_backward();

    // Activation checkpointing per decoder layer: the layer's activations are recomputed in
    // backward instead of kept (torch.utils.checkpoint's reentrant variant).
    void set_activation_checkpointing(bool on) { checkpointing_ = on; }
    bool activation_checkpointing() const { return checkpointing_; }

    const LlamaConfig& config() const { return config_; }
    // FSDP (see UnitHooks); null = none. Not owned. num_units() = layers + 2.
    void set_unit_hooks(UnitHooks* hooks) { hooks_ = hooks; }
    std::int64_t num_units() const { return config_.num_hidden_layers + 2; }
    // The modules of a unit with the prefix of their tensors' names ("layers.3."): the embedding;
    // one decoder layer; the head's norm and, when untied, lm_head (as registered now: LoRA may
    // have wrapped it).
    std::vector<std::pair<std::string, torch::nn::Module*>> unit_modules(int unit);
    // The unit's tensors still on the meta device get memory on the model's device and HF's
    // initial values, drawn from `generator` (a CPU generator: the values do not depend on the
    // device, the order units are materialised in, or the rank count). Tensors already
    // materialised are left alone.
    void materialize_unit(int unit, at::Generator generator);
    bool unit_materialized(int unit);

    torch::nn::Embedding embed_tokens{nullptr};
    torch::nn::ModuleList layers{nullptr};
    RMSNorm norm{nullptr};
    // "lm_head" is looked up by name too (LoRA may wrap it).

  private:
    LlamaConfig config_;
    torch::Device device_ = torch::kCPU; // where materialize_unit() puts tensors
    torch::Tensor inv_freq_;             // buffer-like, not a parameter, fp32
    bool checkpointing_ = false;
    UnitHooks* hooks_ = nullptr;
};
TORCH_MODULE(LlamaForCausalLM);

// Loads Hugging Face weights into `model`: `checkpoint` is a directory (model.safetensors, or
// model.safetensors.index.json and its shards) or one .safetensors file. Names map
// "model.X" -> "X" and "lm_head.weight" -> "lm_head.weight"; every model parameter must be present
// with the same shape (errors name the tensor, both shapes and the file); tensors are converted to
// the parameter's dtype on load. No checkpoint tensor is dropped silently: rotary caches
// ("*.self_attn.rotary_emb.inv_freq", computed from config.json) and, with tied embeddings, an
// "lm_head.weight" equal to the embedding are skipped and counted; any other tensor trainscope
// does not use (biases, extra weights) throws core::InputError naming the first few and their
// count, before anything is copied. Works on plain projections only: load before applying LoRA,
// NF4 or QAT.
struct LoadReport {
    std::int64_t tensors_loaded = 0;
    std::int64_t tensors_derived = 0; // skipped: rotary caches, a tied head equal to the embedding
    std::int64_t bytes_read = 0;
};
LoadReport load_hf_weights(LlamaForCausalLMImpl& model, const std::string& checkpoint);

// The same load one unit at a time (models built with Materialize::PerUnit): the constructor
// checks every name, shape and unused tensor against the model (its meta tensors have shapes),
// before anything is read; load_unit() copies one materialised unit's parameters.
// With a share (see safetensors.hpp), one rank per node opens the checkpoint and load_unit() is
// collective over the node's ranks.
class SafetensorsCheckpoint;
class SafetensorsShare;
class HfWeightLoader {
  public:
    HfWeightLoader(LlamaForCausalLMImpl& model, const std::string& checkpoint,
                   std::shared_ptr<SafetensorsShare> share = nullptr);
    ~HfWeightLoader();
    void load_unit(LlamaForCausalLMImpl& model, int unit);
    const LoadReport& report() const { return report_; }

  private:
    std::unique_ptr<SafetensorsCheckpoint> ckpt_;
    std::map<std::string, std::string> hf_name_; // model parameter -> checkpoint tensor
    LoadReport report_;
};

} // namespace trainscope::models
