// Llama: modules, attention kernels, activation checkpointing, units built on the meta device, HF
// weights (the configuration: llama_config.cpp).
#include "trainscope/models/llama.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "trainscope/core/error.hpp"
#include "trainscope/core/text.hpp"
#include "trainscope/models/recompute.hpp"
#include "trainscope/models/safetensors.hpp"

namespace trainscope::models {

using json = nlohmann::json;
namespace F = torch::nn::functional;

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

namespace {

// at::_fused_sdp_choice's numbering (sdp::SDPBackend).
std::string sdpa_backend_name(std::int64_t choice) {
    switch (choice) {
    case 0:
        return "math";
    case 1:
        return "flash";
    case 2:
        return "efficient";
    case 3:
        return "cudnn";
    case 4:
        return "overrideable";
    default:
        return "none";
    }
}
constexpr std::int64_t kSdpaMath = 0;

bool expand_kv(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
               const torch::Tensor& mask) {
    const std::optional<torch::Tensor> m =
        mask.defined() ? std::optional<torch::Tensor>(mask) : std::nullopt;
    const bool causal = !mask.defined();
    if (at::_fused_sdp_choice(q, k, v, m, 0.0, causal, std::nullopt, true) != kSdpaMath)
        return false;
    // q stands in for the expanded k and v (same shape).
    return at::_fused_sdp_choice(q, q, q, m, 0.0, causal, std::nullopt, false) != kSdpaMath;
}

} // namespace

torch::Tensor attention_kernel(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& mask, GqaKv kv) {
    const std::int64_t group = q.size(1) / k.size(1);
    bool gqa = group > 1;
    torch::Tensor key = k, value = v;
    if (gqa && (kv == GqaKv::Expand || (kv == GqaKv::Auto && expand_kv(q, k, v, mask)))) {
        key = k.repeat_interleave(group, 1);
        value = v.repeat_interleave(group, 1);
        gqa = false;
    }
    return mask.defined()
               ? at::scaled_dot_product_attention(q, key, value, mask, 0.0, false, std::nullopt,
                                                  gqa)
               : at::scaled_dot_product_attention(q, key, value, {}, 0.0, true, std::nullopt, gqa);
}

SdpaChoice sdpa_choice(const LlamaConfig& c, std::int64_t seq_len, bool packed,
                       const torch::Device& device, torch::ScalarType dtype) {
    torch::NoGradGuard no_grad;
    const std::int64_t T = std::max<std::int64_t>(1, std::min<std::int64_t>(seq_len, 256));
    const auto o = torch::TensorOptions().dtype(dtype).device(device);
    const torch::Tensor q = torch::zeros({1, c.num_attention_heads, T, c.head_dim}, o);
    const torch::Tensor k = torch::zeros({1, c.num_key_value_heads, T, c.head_dim}, o);
    torch::Tensor mask;
    if (packed)
        mask = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(device))
                   .tril()
                   .view({1, 1, T, T});
    const std::optional<torch::Tensor> m =
        mask.defined() ? std::optional<torch::Tensor>(mask) : std::nullopt;
    const bool gqa = c.num_attention_heads != c.num_key_value_heads;
    SdpaChoice r;
    r.kv_expanded = gqa && expand_kv(q, k, k, mask);
    const torch::Tensor& kk = r.kv_expanded ? q : k;
    r.backend = sdpa_backend_name(
        at::_fused_sdp_choice(q, kk, kk, m, 0.0, !packed, std::nullopt, gqa && !r.kv_expanded));
    return r;
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
    torch::Tensor out = attention_kernel(q, k, v, in.mask);
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

// torch.utils.checkpoint (reentrant, preserve_rng_state=True): forward without a graph, keeping
// only the layer's input and the recompute state (recompute.hpp); backward recomputes the layer
// under that state and back-propagates through the recomputation. Parameter gradients accumulate
// as usual (their hooks fire during the inner backward).
struct CheckpointedLayer : torch::autograd::Function<CheckpointedLayer> {
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                                 LlamaDecoderLayerImpl* layer, const AttentionInputs* in) {
        ctx->save_for_backward({x});
        ctx->saved_data["layer"] = reinterpret_cast<std::int64_t>(layer);
        ctx->saved_data["cos"] = in->cos;
        ctx->saved_data["sin"] = in->sin;
        if (in->mask.defined()) ctx->saved_data["mask"] = in->mask;
        save_recompute_state(ctx, x.device());
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
            RecomputeScope recompute(ctx, x.device());
            out = layer->forward(x, in);
        }
        torch::autograd::backward({out}, {grads[0]});
        return {x.grad(), torch::Tensor(), torch::Tensor()};
    }
};

// Identity in forward; in backward calls the hooks' before_backward(unit) (pre = true, placed on a
// unit's output) or after_backward(unit) (placed on its input), then passes the gradient on.
struct UnitBoundary : torch::autograd::Function<UnitBoundary> {
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                                 UnitHooks* hooks, std::int64_t unit, bool pre) {
        ctx->saved_data["hooks"] = reinterpret_cast<std::int64_t>(hooks);
        ctx->saved_data["unit"] = unit;
        ctx->saved_data["pre"] = pre;
        return x.view_as(x);
    }
    static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::tensor_list grads) {
        auto* hooks = reinterpret_cast<UnitHooks*>(ctx->saved_data["hooks"].toInt());
        const int unit = static_cast<int>(ctx->saved_data["unit"].toInt());
        if (ctx->saved_data["pre"].toBool())
            hooks->before_backward(unit);
        else
            hooks->after_backward(unit);
        return {grads[0], torch::Tensor(), torch::Tensor(), torch::Tensor()};
    }
};

} // namespace

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& config,
                                           const torch::TensorOptions& options, Materialize when)
    : config_(config), device_(options.device()) {
    config_.validate();
    const bool now = when == Materialize::Now;
    // PerUnit: shapes and dtypes only; materialize_unit() gives each unit memory and values.
    const torch::TensorOptions p = now ? options : options.device(torch::kMeta);
    if (now) {
        embed_tokens = register_module("embed_tokens",
                                       torch::nn::Embedding(config.vocab_size, config.hidden_size));
        embed_tokens->to(options.device(), options.dtype().toScalarType());
        torch::NoGradGuard no_grad;
        embed_tokens->weight.normal_(0.0, 0.02);
    } else {
        embed_tokens = register_module(
            "embed_tokens",
            torch::nn::Embedding(torch::nn::EmbeddingOptions(config.vocab_size, config.hidden_size)
                                     ._weight(torch::empty({config.vocab_size, config.hidden_size},
                                                           p.requires_grad(false)))));
    }
    layers = register_module("layers", torch::nn::ModuleList());
    for (std::int64_t i = 0; i < config.num_hidden_layers; ++i) {
        LlamaDecoderLayer layer(config, p);
        if (now)
            for (torch::nn::Module* block :
                 {static_cast<torch::nn::Module*>(layer->self_attn.get()),
                  static_cast<torch::nn::Module*>(layer->mlp.get())})
                for (const auto& child : block->named_children())
                    init_normal(std::dynamic_pointer_cast<ProjectionImpl>(child.value()));
        layers->push_back(layer);
    }
    norm = register_module("norm", RMSNorm(config.hidden_size, config.rms_norm_eps, p));
    if (!config.tie_word_embeddings) {
        auto lm_head = register_module("lm_head", std::make_shared<LinearProjectionImpl>(
                                                      config.hidden_size, config.vocab_size, p));
        if (now) init_normal(lm_head);
    }
    inv_freq_ = rope_inverse_frequencies(config).to(options.device());
}

std::vector<std::pair<std::string, torch::nn::Module*>>
LlamaForCausalLMImpl::unit_modules(int unit) {
    if (unit < 0 || unit >= num_units())
        throw core::InternalError("unit_modules: no unit " + std::to_string(unit));
    if (unit == 0) return {{"embed_tokens.", embed_tokens.get()}};
    if (unit <= config_.num_hidden_layers) {
        const std::string name = "layers." + std::to_string(unit - 1);
        return {{name + ".", layers[static_cast<std::size_t>(unit - 1)].get()}};
    }
    std::vector<std::pair<std::string, torch::nn::Module*>> head = {{"norm.", norm.get()}};
    auto children = named_children();
    if (children.contains("lm_head")) head.push_back({"lm_head.", children["lm_head"].get()});
    return head;
}

bool LlamaForCausalLMImpl::unit_materialized(int unit) {
    for (const auto& [prefix, module] : unit_modules(unit)) {
        for (const auto& t : module->parameters(/*recurse=*/true))
            if (t.is_meta()) return false;
        for (const auto& t : module->buffers(/*recurse=*/true))
            if (t.is_meta()) return false;
    }
    return true;
}

namespace {

// The registered parameters of any module (torch::nn::Module keeps them protected and refuses to
// register a name twice): a pointer to the protected member, formed inside a derived class.
struct ModuleAccess : torch::nn::Module {
    static torch::OrderedDict<std::string, torch::Tensor>& parameters_of(torch::nn::Module& m) {
        return m.*(&ModuleAccess::parameters_);
    }
};

} // namespace

void LlamaForCausalLMImpl::materialize_unit(int unit, at::Generator generator) {
    torch::NoGradGuard no_grad;
    // A meta parameter cannot take real memory in place (set_data refuses the device change), so
    // the module's registered "weight" and its member are both replaced by a new tensor with the
    // same requires_grad. Drawn on the host with the given generator, then moved: the same
    // values on every device.
    auto fill = [&](torch::nn::Module& owner, torch::Tensor& weight, bool ones) {
        if (!weight.defined() || !weight.is_meta()) return;
        const auto host = torch::TensorOptions().dtype(weight.scalar_type());
        // Half-precision weights are drawn in fp32 and rounded: LibTorch's CPU normal_ has a
        // vectorised kernel for fp32 only (bf16 draws 4.3x slower here: 1.12 s vs 0.26 s per 5e7
        // values on one core, minutes for an 8B model).
        const bool half =
            weight.scalar_type() == torch::kBFloat16 || weight.scalar_type() == torch::kHalf;
        torch::Tensor v = ones   ? torch::ones(weight.sizes(), host)
                          : half ? torch::empty(weight.sizes(), host.dtype(torch::kFloat32))
                                       .normal_(0.0, 0.02, generator)
                                       .to(weight.scalar_type())
                                 : torch::empty(weight.sizes(), host).normal_(0.0, 0.02, generator);
        v = v.to(device_);
        v.set_requires_grad(weight.requires_grad());
        ModuleAccess::parameters_of(owner)["weight"] = v;
        weight = v;
    };
    for (const auto& [prefix, module] : unit_modules(unit)) {
        // Registration order (the order a checkpoint or the Now path visits them in).
        for (const auto& m : module->modules(/*include_self=*/true)) {
            if (auto* n = dynamic_cast<RMSNormImpl*>(m.get())) fill(*n, n->weight, true);
            if (auto* e = dynamic_cast<torch::nn::EmbeddingImpl*>(m.get()))
                fill(*e, e->weight, false);
            if (auto* l = dynamic_cast<LinearProjectionImpl*>(m.get())) fill(*l, l->weight, false);
        }
        for (const auto& t : module->named_parameters(/*recurse=*/true))
            if (t.value().is_meta())
                throw core::InternalError("materialize_unit: " + prefix + t.key() +
                                          " has no initialiser");
    }
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
    UnitHooks* hooks = hooks_;
    const bool grad = torch::GradMode::is_enabled();
    // FSDP boundaries (see UnitHooks): only where a gradient will flow.
    auto enter = [&](torch::Tensor x, std::int64_t unit) {
        hooks->before_forward(static_cast<int>(unit));
        return grad && x.requires_grad() ? UnitBoundary::apply(x, hooks, unit, false) : x;
    };
    auto leave = [&](torch::Tensor y, std::int64_t unit) {
        if (grad && y.requires_grad()) y = UnitBoundary::apply(y, hooks, unit, true);
        hooks->after_forward(static_cast<int>(unit));
        return y;
    };
    if (hooks) hooks->before_forward(0);
    torch::Tensor h = embed_tokens->forward(input_ids);
    if (hooks) hooks->after_forward(0);
    const bool checkpoint = checkpointing_ && grad;
    // A checkpointed layer is recorded in the graph only if its input requires grad; with a frozen
    // embedding (LoRA, QLoRA, DPO) it does not, and the adapters inside would get no gradient.
    // (The reentrant checkpoint of PyTorch has the same trap.) A detached copy that requires grad
    // fixes it without changing any value.
    if (checkpoint && !h.requires_grad()) h = h.detach().requires_grad_(true);
    std::int64_t unit = 1;
    for (const auto& m : *layers) {
        auto* layer = m->as<LlamaDecoderLayerImpl>();
        if (hooks) h = enter(h, unit);
        h = checkpoint ? CheckpointedLayer::apply(h, layer, &in) : layer->forward(h, in);
        if (hooks) h = leave(h, unit);
        ++unit;
    }
    // The head unit (norm and lm_head) begins here and ends in head().
    if (hooks) h = enter(h, unit);
    return norm->forward(h);
}

torch::Tensor LlamaForCausalLMImpl::project(const torch::Tensor& hidden) {
    if (config_.tie_word_embeddings) return F::linear(hidden, embed_tokens->weight);
    return std::dynamic_pointer_cast<ProjectionImpl>(named_children()["lm_head"])->forward(hidden);
}

std::vector<torch::Tensor> LlamaForCausalLMImpl::head_parameters() {
    if (config_.tie_word_embeddings) return {embed_tokens->weight};
    return named_children()["lm_head"]->parameters();
}

void LlamaForCausalLMImpl::end_head_forward() {
    if (hooks_) hooks_->after_forward(static_cast<int>(num_units() - 1));
}

void LlamaForCausalLMImpl::begin_head_backward() {
    if (hooks_) hooks_->before_backward(static_cast<int>(num_units() - 1));
}

torch::Tensor LlamaForCausalLMImpl::head(const torch::Tensor& hidden) {
    torch::Tensor logits = project(hidden);
    if (hooks_ && torch::GradMode::is_enabled() && logits.requires_grad())
        logits = UnitBoundary::apply(logits, hooks_, num_units() - 1, true);
    end_head_forward();
    return logits;
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& input_ids,
                                            const torch::Tensor& position_ids,
                                            const torch::Tensor& segment_ids) {
    return head(hidden_states(input_ids, position_ids, segment_ids));
}

// ---- Hugging Face weights -----------------------------------------------------------------------

namespace {

// Checkpoint tensors that are no weights of the model and may be skipped without changing it.
// Older transformers saved each layer's rotary cache "self_attn.rotary_emb.inv_freq" as a
// persistent buffer: it is a function of rope_theta and head_dim, which trainscope computes from
// config.json itself.
bool derived_from_config(const std::string& name) {
    const std::string suffix = ".self_attn.rotary_emb.inv_freq";
    return name.size() > suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

} // namespace

HfWeightLoader::HfWeightLoader(LlamaForCausalLMImpl& model, const std::string& checkpoint,
                               std::shared_ptr<SafetensorsShare> share)
    : ckpt_(std::make_unique<SafetensorsCheckpoint>(checkpoint, std::move(share))) {
    const SafetensorsCheckpoint& ckpt = *ckpt_;
    LoadReport& r = report_;
    // Checkpoint name of every parameter: "model.X" ("lm_head.weight" as is), or "X" for
    // checkpoints saved without the "model." prefix.
    std::set<std::string> used;
    for (auto& item : model.named_parameters(/*recurse=*/true)) {
        const std::string& name = item.key();
        std::string hf = name.rfind("lm_head.", 0) == 0 ? name : "model." + name;
        if (!ckpt.contains(hf) && ckpt.contains(name)) hf = name;
        if (!ckpt.contains(hf))
            throw core::InputError("checkpoint '" + checkpoint + "' has no tensor '" + hf +
                                   "' (model parameter " + name +
                                   "): use a complete Llama checkpoint in Hugging Face format "
                                   "(every shard of model.safetensors.index.json present)");
        const SafetensorsEntry& e = ckpt.entry(hf);
        if (c10::IntArrayRef(e.shape) != item.value().sizes()) {
            std::ostringstream msg;
            msg << "tensor '" << hf << "' in '" << ckpt.file_of(hf) << "' has shape "
                << c10::IntArrayRef(e.shape) << " but the model expects " << item.value().sizes()
                << ": the checkpoint does not match llm.model's configuration; use the "
                   "config.json that came with these weights";
            throw core::InputError(msg.str());
        }
        hf_name_[name] = hf;
        used.insert(hf);
    }
    // Every other tensor is accounted for before anything is copied: derivable ones are skipped
    // by name, a tied head must equal the embedding it is tied to, anything else is refused (a
    // dropped bias or extra weight would train a different model and still finish with exit 0).
    std::vector<std::string> unused;
    for (const auto& name : ckpt.names()) {
        if (used.count(name)) continue;
        if (derived_from_config(name)) {
            ++r.tensors_derived;
            continue;
        }
        if (name == "lm_head.weight" && model.config().tie_word_embeddings) {
            // Tied: the head is embed_tokens.weight. A checkpoint may still store the head (some
            // exporters write shared tensors twice); accepted only when it is that very tensor.
            const std::string emb = ckpt.contains("model.embed_tokens.weight")
                                        ? "model.embed_tokens.weight"
                                        : "embed_tokens.weight";
            const SafetensorsEntry& h = ckpt.entry(name);
            if (ckpt.contains(emb) && h.dtype == ckpt.entry(emb).dtype &&
                h.shape == ckpt.entry(emb).shape &&
                torch::equal(ckpt.tensor(name), ckpt.tensor(emb))) {
                ++r.tensors_derived;
                continue;
            }
            throw core::InputError("checkpoint '" + checkpoint +
                                   "': config.json says tie_word_embeddings=true but the stored "
                                   "'lm_head.weight' differs from '" +
                                   emb +
                                   "'; set tie_word_embeddings to false in config.json if the "
                                   "model has its own output head");
        }
        unused.push_back(name);
    }
    if (!unused.empty()) {
        std::string list;
        for (std::size_t i = 0; i < unused.size() && i < 5; ++i)
            list += (i ? ", '" : "'") + unused[i] + "'";
        if (unused.size() > 5) list += ", ...";
        const bool biases = std::any_of(unused.begin(), unused.end(), [](const std::string& n) {
            return n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0;
        });
        throw core::InputError(
            "checkpoint '" + checkpoint + "' holds " + std::to_string(unused.size()) +
            " tensor(s) trainscope's Llama does not use (" + list +
            "): training without them would be a different model" +
            (biases ? " (trainscope's Llama has no biases)" : "") +
            "; use a Llama-3 / 3.1 / 3.2 checkpoint, or remove tensors that are no weights");
    }
}

HfWeightLoader::~HfWeightLoader() = default;

void HfWeightLoader::load_unit(LlamaForCausalLMImpl& model, int unit) {
    torch::NoGradGuard no_grad;
    for (const auto& [prefix, module] : model.unit_modules(unit))
        for (auto& item : module->named_parameters(/*recurse=*/true)) {
            const auto it = hf_name_.find(prefix + item.key());
            if (it == hf_name_.end())
                throw core::InternalError("HfWeightLoader: parameter " + prefix + item.key() +
                                          " was not planned (load before applying LoRA/NF4/QAT)");
            if (item.value().is_meta())
                throw core::InternalError("HfWeightLoader: " + it->first + " is not materialised");
            item.value().copy_(ckpt_->tensor(it->second));
            const SafetensorsEntry& e = ckpt_->entry(it->second);
            report_.bytes_read += static_cast<std::int64_t>(e.end - e.begin);
            ++report_.tensors_loaded;
        }
}

LoadReport load_hf_weights(LlamaForCausalLMImpl& model, const std::string& checkpoint) {
    HfWeightLoader loader(model, checkpoint);
    for (int u = 0; u < model.num_units(); ++u)
        loader.load_unit(model, u);
    return loader.report();
}

} // namespace trainscope::models
