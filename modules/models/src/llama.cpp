// Llama: configuration (HF config.json, presets), modules, activation checkpointing, HF weights.
#include "trainscope/models/llama.hpp"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trainscope/core/error.hpp"
#include "trainscope/models/safetensors.hpp"

namespace trainscope::models {

using json = nlohmann::json;
namespace F = torch::nn::functional;

// ---- configuration ------------------------------------------------------------------------------

LlamaConfig LlamaConfig::from_hf_json_text(const std::string& text, const std::string& origin) {
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception& e) {
        throw core::ConfigError("'" + origin + "' is not valid JSON: " + e.what());
    }
    if (!j.is_object()) throw core::ConfigError("'" + origin + "' is not a JSON object");
    auto need_int = [&](const char* key) -> std::int64_t {
        if (!j.contains(key))
            throw core::ConfigError("'" + origin + "' lacks \"" + key +
                                    "\": a Llama config.json needs hidden_size, "
                                    "intermediate_size, num_hidden_layers, num_attention_heads "
                                    "and vocab_size");
        if (!j[key].is_number_integer())
            throw core::ConfigError("'" + origin + "': \"" + key + "\" must be an integer");
        return j[key].get<std::int64_t>();
    };
    auto opt_num = [&](const char* key, double def) -> double {
        if (!j.contains(key) || j[key].is_null()) return def;
        if (!j[key].is_number())
            throw core::ConfigError("'" + origin + "': \"" + key + "\" must be a number");
        return j[key].get<double>();
    };
    LlamaConfig c;
    c.name = origin;
    c.hidden_size = need_int("hidden_size");
    c.intermediate_size = need_int("intermediate_size");
    c.num_hidden_layers = need_int("num_hidden_layers");
    c.num_attention_heads = need_int("num_attention_heads");
    c.vocab_size = need_int("vocab_size");
    c.num_key_value_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                                ? need_int("num_key_value_heads")
                                : c.num_attention_heads;
    c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null()
                     ? need_int("head_dim")
                     : (c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0);
    c.rms_norm_eps = opt_num("rms_norm_eps", 1e-6);
    c.rope_theta = opt_num("rope_theta", 10000.0);
    c.max_position_embeddings = static_cast<std::int64_t>(opt_num("max_position_embeddings", 2048));
    if (j.contains("tie_word_embeddings")) {
        if (!j["tie_word_embeddings"].is_boolean())
            throw core::ConfigError("'" + origin + "': \"tie_word_embeddings\" must be true/false");
        c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
    }
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
        const json& r = j["rope_scaling"];
        const std::string type = r.contains("rope_type") ? r["rope_type"].get<std::string>()
                                 : r.contains("type")    ? r["type"].get<std::string>()
                                                         : std::string("?");
        if (type != "llama3")
            throw core::ConfigError("'" + origin + "': rope_scaling type '" + type +
                                    "' is not supported (only Llama-3.1's \"llama3\"); remove "
                                    "rope_scaling or use a Llama-3 model");
        c.rope_scaling.enabled = true;
        c.rope_scaling.factor = r.value("factor", 8.0);
        c.rope_scaling.low_freq_factor = r.value("low_freq_factor", 1.0);
        c.rope_scaling.high_freq_factor = r.value("high_freq_factor", 4.0);
        c.rope_scaling.original_max_position_embeddings =
            r.value("original_max_position_embeddings", std::int64_t{8192});
    }
    try {
        c.validate();
    } catch (const core::ConfigError& e) {
        throw core::ConfigError("'" + origin + "': " + e.what());
    }
    return c;
}

LlamaConfig LlamaConfig::from_hf_json_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw core::ConfigError("cannot read the model configuration '" + path + "'");
    std::stringstream s;
    s << in.rdbuf();
    return from_hf_json_text(s.str(), path);
}

LlamaConfig LlamaConfig::preset(const std::string& name) {
    LlamaConfig c; // Llama-3-8B
    c.name = name;
    if (name == "llama3-8b") return c;
    if (name == "llama3.1-8b") {
        c.rope_scaling.enabled = true;
        c.max_position_embeddings = 131072;
        return c;
    }
    if (name == "llama3.2-1b" || name == "llama3.2-3b") {
        const bool one = name == "llama3.2-1b";
        c.hidden_size = one ? 2048 : 3072;
        c.intermediate_size = 8192;
        c.num_hidden_layers = one ? 16 : 28;
        c.num_attention_heads = one ? 32 : 24;
        c.num_key_value_heads = 8;
        c.head_dim = one ? 64 : 128;
        c.tie_word_embeddings = true;
        c.rope_scaling.enabled = true;
        c.rope_scaling.factor = 32.0;
        c.max_position_embeddings = 131072;
        return c;
    }
    if (name == "tiny") {
        c.vocab_size = 1024;
        c.hidden_size = 256;
        c.intermediate_size = 512;
        c.num_hidden_layers = 2;
        c.num_attention_heads = 4;
        c.num_key_value_heads = 2;
        c.head_dim = 64;
        c.max_position_embeddings = 2048;
        return c;
    }
    throw core::ConfigError("llm.model = '" + name +
                            "' is not a preset: use llama3-8b, llama3.1-8b, llama3.2-1b, "
                            "llama3.2-3b or tiny, or a Hugging Face model directory");
}

void LlamaConfig::validate() const {
    auto positive = [](const char* key, std::int64_t v) {
        if (v <= 0)
            throw core::ConfigError(std::string(key) + " = " + std::to_string(v) +
                                    " must be positive");
    };
    positive("vocab_size", vocab_size);
    positive("hidden_size", hidden_size);
    positive("intermediate_size", intermediate_size);
    positive("num_hidden_layers", num_hidden_layers);
    positive("num_attention_heads", num_attention_heads);
    positive("num_key_value_heads", num_key_value_heads);
    positive("head_dim", head_dim);
    if (num_attention_heads % num_key_value_heads != 0)
        throw core::ConfigError(
            "num_attention_heads = " + std::to_string(num_attention_heads) +
            " is not a multiple of num_key_value_heads = " + std::to_string(num_key_value_heads) +
            " (grouped-query attention shares each KV head among a whole "
            "number of query heads)");
    if (head_dim % 2 != 0)
        throw core::ConfigError("head_dim = " + std::to_string(head_dim) +
                                " must be even (rotary embeddings rotate pairs)");
    if (!(rms_norm_eps > 0)) throw core::ConfigError("rms_norm_eps must be positive");
    if (!(rope_theta > 0)) throw core::ConfigError("rope_theta must be positive");
}

std::int64_t LlamaConfig::embedding_parameters() const {
    return vocab_size * hidden_size;
}
std::int64_t LlamaConfig::head_parameters() const {
    return tie_word_embeddings ? 0 : vocab_size * hidden_size;
}
std::int64_t LlamaConfig::layer_parameters() const {
    const std::int64_t q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim;
    return hidden_size * q + 2 * hidden_size * kv + q * hidden_size +
           3 * hidden_size * intermediate_size + 2 * hidden_size;
}
std::int64_t LlamaConfig::num_parameters() const {
    return embedding_parameters() + num_hidden_layers * layer_parameters() + hidden_size +
           head_parameters();
}

double LlamaConfig::forward_flops_per_token(std::int64_t seq_len) const {
    const double matmul = static_cast<double>(
        num_hidden_layers * (layer_parameters() - 2 * hidden_size) + vocab_size * hidden_size);
    const double attention = 2.0 * 2.0 * static_cast<double>(num_hidden_layers) *
                             static_cast<double>(seq_len) *
                             static_cast<double>(num_attention_heads * head_dim);
    return 2.0 * matmul + attention;
}

torch::Tensor rope_inverse_frequencies(const LlamaConfig& c) {
    // As Hugging Face: in fp32, base^(-2i/d).
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    torch::Tensor inv =
        1.0 / torch::pow(torch::full({}, c.rope_theta, f32),
                         torch::arange(0, c.head_dim, 2, torch::kInt64).to(torch::kFloat32) /
                             static_cast<double>(c.head_dim));
    if (!c.rope_scaling.enabled) return inv;
    // Llama-3.1: long wavelengths divided by `factor`, short ones kept, a smooth blend between.
    const RopeScaling& s = c.rope_scaling;
    const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
    const double low_wavelen = old_ctx / s.low_freq_factor;
    const double high_wavelen = old_ctx / s.high_freq_factor;
    torch::Tensor wavelen = 2.0 * M_PI / inv;
    torch::Tensor scaled = torch::where(wavelen > low_wavelen, inv / s.factor, inv);
    torch::Tensor smooth =
        (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    torch::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
    torch::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    return torch::where(medium, smoothed, scaled);
}

// ---- modules ------------------------------------------------------------------------------------

RMSNormImpl::RMSNormImpl(std::int64_t dim, double eps_, const torch::TensorOptions& options)
    : eps(eps_) {
    weight = register_parameter("weight", torch::ones({dim}, options));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
    torch::Tensor h = x.to(torch::kFloat32);
    h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
    return weight * h.to(x.scalar_type());
}

namespace {

torch::Tensor rotate_half(const torch::Tensor& x) {
    const auto half = x.size(-1) / 2;
    return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// Rotary embedding in fp32 (cos/sin [B, T, D] broadcast over heads), cast back.
torch::Tensor apply_rope(const torch::Tensor& x, const AttentionInputs& in) {
    const torch::Tensor xf = x.to(torch::kFloat32);
    const torch::Tensor cos = in.cos.unsqueeze(1), sin = in.sin.unsqueeze(1);
    return (xf * cos + rotate_half(xf) * sin).to(x.scalar_type());
}

void init_normal(const std::shared_ptr<ProjectionImpl>& p) {
    if (auto lin = std::dynamic_pointer_cast<LinearProjectionImpl>(p)) {
        torch::NoGradGuard no_grad;
        lin->weight.normal_(0.0, 0.02);
    }
}

} // namespace

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c, const torch::TensorOptions& options)
    : heads_(c.num_attention_heads), kv_heads_(c.num_key_value_heads), head_dim_(c.head_dim) {
    const std::int64_t q = heads_ * head_dim_, kv = kv_heads_ * head_dim_;
    register_module("q_proj", std::make_shared<LinearProjectionImpl>(c.hidden_size, q, options));
    register_module("k_proj", std::make_shared<LinearProjectionImpl>(c.hidden_size, kv, options));
    register_module("v_proj", std::make_shared<LinearProjectionImpl>(c.hidden_size, kv, options));
    register_module("o_proj", std::make_shared<LinearProjectionImpl>(q, c.hidden_size, options));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const AttentionInputs& in) {
    const auto B = x.size(0), T = x.size(1);
    // Children may have been replaced (LoRA, NF4, QAT): look them up by name.
    auto proj = [&](const char* name) {
        return std::dynamic_pointer_cast<ProjectionImpl>(named_children()[name]);
    };
    torch::Tensor q = proj("q_proj")->forward(x).view({B, T, heads_, head_dim_}).transpose(1, 2);
    torch::Tensor k = proj("k_proj")->forward(x).view({B, T, kv_heads_, head_dim_}).transpose(1, 2);
    torch::Tensor v = proj("v_proj")->forward(x).view({B, T, kv_heads_, head_dim_}).transpose(1, 2);
    q = apply_rope(q, in);
    k = apply_rope(k, in);
    const bool gqa = heads_ != kv_heads_;
    torch::Tensor out =
        in.mask.defined()
            ? at::scaled_dot_product_attention(q, k, v, in.mask, 0.0, false, std::nullopt, gqa)
            : at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, std::nullopt, gqa);
    out = out.transpose(1, 2).reshape({B, T, heads_ * head_dim_});
    return proj("o_proj")->forward(out);
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c, const torch::TensorOptions& options) {
    register_module("gate_proj", std::make_shared<LinearProjectionImpl>(
                                     c.hidden_size, c.intermediate_size, options));
    register_module("up_proj", std::make_shared<LinearProjectionImpl>(
                                   c.hidden_size, c.intermediate_size, options));
    register_module("down_proj", std::make_shared<LinearProjectionImpl>(c.intermediate_size,
                                                                        c.hidden_size, options));
}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x) {
    auto proj = [&](const char* name) {
        return std::dynamic_pointer_cast<ProjectionImpl>(named_children()[name]);
    };
    return proj("down_proj")
        ->forward(F::silu(proj("gate_proj")->forward(x)) * proj("up_proj")->forward(x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c,
                                             const torch::TensorOptions& options) {
    input_layernorm =
        register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, options));
    self_attn = register_module("self_attn", LlamaAttention(c, options));
    post_attention_layernorm = register_module("post_attention_layernorm",
                                               RMSNorm(c.hidden_size, c.rms_norm_eps, options));
    mlp = register_module("mlp", LlamaMLP(c, options));
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const AttentionInputs& in) {
    torch::Tensor h = x + self_attn->forward(input_layernorm->forward(x), in);
    return h + mlp->forward(post_attention_layernorm->forward(h));
}

namespace {

// torch.utils.checkpoint (reentrant): forward without a graph, keeping only the layer's input;
// backward recomputes the layer with grad enabled and back-propagates through the recomputation.
// Parameter gradients accumulate as usual (their hooks fire during the inner backward).
struct CheckpointedLayer : torch::autograd::Function<CheckpointedLayer> {
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                                 LlamaDecoderLayerImpl* layer, const AttentionInputs* in) {
        ctx->save_for_backward({x});
        ctx->saved_data["layer"] = reinterpret_cast<std::int64_t>(layer);
        ctx->saved_data["cos"] = in->cos;
        ctx->saved_data["sin"] = in->sin;
        if (in->mask.defined()) ctx->saved_data["mask"] = in->mask;
        torch::NoGradGuard no_grad;
        return layer->forward(x, *in);
    }
    static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::tensor_list grads) {
        auto* layer = reinterpret_cast<LlamaDecoderLayerImpl*>(ctx->saved_data["layer"].toInt());
        AttentionInputs in;
        in.cos = ctx->saved_data["cos"].toTensor();
        in.sin = ctx->saved_data["sin"].toTensor();
        if (ctx->saved_data.count("mask")) in.mask = ctx->saved_data["mask"].toTensor();
        torch::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
        torch::Tensor out;
        {
            torch::AutoGradMode enable(true);
            out = layer->forward(x, in);
        }
        torch::autograd::backward({out}, {grads[0]});
        return {x.grad(), torch::Tensor(), torch::Tensor()};
    }
};

} // namespace

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& config,
                                           const torch::TensorOptions& options)
    : config_(config) {
    config_.validate();
    embed_tokens = register_module("embed_tokens",
                                   torch::nn::Embedding(config.vocab_size, config.hidden_size));
    embed_tokens->to(options.device(), options.dtype().toScalarType());
    {
        torch::NoGradGuard no_grad;
        embed_tokens->weight.normal_(0.0, 0.02);
    }
    layers = register_module("layers", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < config.num_hidden_layers; ++i) {
        LlamaDecoderLayer layer(config, options);
        for (torch::nn::Module* block : {static_cast<torch::nn::Module*>(layer->self_attn.get()),
                                         static_cast<torch::nn::Module*>(layer->mlp.get())})
            for (const auto& child : block->named_children())
                init_normal(std::dynamic_pointer_cast<ProjectionImpl>(child.value()));
        layers->push_back(layer);
    }
    norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps, options));
    if (!config.tie_word_embeddings) {
        auto lm_head = register_module(
            "lm_head",
            std::make_shared<LinearProjectionImpl>(config.hidden_size, config.vocab_size, options));
        init_normal(lm_head);
    }
    inv_freq_ = rope_inverse_frequencies(config).to(options.device());
}

torch::Tensor LlamaForCausalLMImpl::hidden_states(const torch::Tensor& input_ids,
                                                  const torch::Tensor& position_ids,
                                                  const torch::Tensor& segment_ids) {
    const auto B = input_ids.size(0), T = input_ids.size(1);
    const auto device = input_ids.device();
    torch::Tensor pos =
        position_ids.defined()
            ? position_ids
            : torch::arange(T, torch::TensorOptions().dtype(torch::kInt64).device(device))
                  .unsqueeze(0)
                  .expand({B, T});
    if (inv_freq_.device() != device) inv_freq_ = inv_freq_.to(device);
    AttentionInputs in;
    {
        // The cos/sin cache in fp32 from the positions (Hugging Face's layout: [f, f]).
        torch::NoGradGuard no_grad;
        torch::Tensor freqs = pos.to(torch::kFloat32).unsqueeze(-1) * inv_freq_.view({1, 1, -1});
        torch::Tensor emb = torch::cat({freqs, freqs}, -1);
        in.cos = emb.cos();
        in.sin = emb.sin();
        if (segment_ids.defined()) {
            // Causal and within the same packed sample: [B, 1, T, T], true = may attend.
            torch::Tensor same = segment_ids.unsqueeze(2).eq(segment_ids.unsqueeze(1));
            torch::Tensor causal =
                torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(device))
                    .tril();
            in.mask = same.logical_and(causal).unsqueeze(1);
        }
    }
    torch::Tensor h = embed_tokens->forward(input_ids);
    const bool checkpoint = checkpointing_ && torch::GradMode::is_enabled();
    // A checkpointed layer is recorded in the graph only if its input requires grad; with a frozen
    // embedding (LoRA, QLoRA, DPO) it does not, and the adapters inside would get no gradient.
    // (The reentrant checkpoint of PyTorch has the same trap.) A detached copy that requires grad
    // fixes it without changing any value.
    if (checkpoint && !h.requires_grad()) h = h.detach().requires_grad_(true);
    for (const auto& m : *layers) {
        auto* layer = m->as<LlamaDecoderLayerImpl>();
        h = checkpoint ? CheckpointedLayer::apply(h, layer, &in) : layer->forward(h, in);
    }
    return norm->forward(h);
}

torch::Tensor LlamaForCausalLMImpl::head(const torch::Tensor& hidden) {
    if (config_.tie_word_embeddings) return F::linear(hidden, embed_tokens->weight);
    auto p = std::dynamic_pointer_cast<ProjectionImpl>(named_children()["lm_head"]);
    return p->forward(hidden);
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& input_ids,
                                            const torch::Tensor& position_ids,
                                            const torch::Tensor& segment_ids) {
    return head(hidden_states(input_ids, position_ids, segment_ids));
}

// ---- Hugging Face weights -----------------------------------------------------------------------

LoadReport load_hf_weights(LlamaForCausalLMImpl& model, const std::string& checkpoint) {
    const SafetensorsCheckpoint ckpt(checkpoint);
    LoadReport r;
    std::int64_t used = 0;
    torch::NoGradGuard no_grad;
    for (auto& item : model.named_parameters(/*recurse=*/true)) {
        const std::string& name = item.key();
        torch::Tensor& param = item.value();
        std::string hf = name.rfind("lm_head.", 0) == 0 ? name : "model." + name;
        if (!ckpt.contains(hf) && ckpt.contains(name)) hf = name; // checkpoints without "model."
        if (!ckpt.contains(hf))
            throw core::InputError("checkpoint '" + checkpoint + "' has no tensor '" + hf +
                                   "' (model parameter " + name +
                                   "): is it a Llama checkpoint in Hugging Face format?");
        const SafetensorsEntry& e = ckpt.entry(hf);
        if (c10::IntArrayRef(e.shape) != param.sizes()) {
            std::ostringstream msg;
            msg << "tensor '" << hf << "' in '" << ckpt.file_of(hf) << "' has shape "
                << c10::IntArrayRef(e.shape) << " but the model expects " << param.sizes()
                << ": the checkpoint does not match llm.model's configuration";
            throw core::InputError(msg.str());
        }
        param.copy_(ckpt.tensor(hf));
        r.bytes_read += static_cast<std::int64_t>(e.end - e.begin);
        ++r.tensors_loaded;
        ++used;
    }
    r.tensors_ignored = static_cast<std::int64_t>(ckpt.names().size()) - used;
    return r;
}

} // namespace trainscope::models
