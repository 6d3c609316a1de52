// LoRA projections (torchtune's LoRALinear semantics) and their application to a model.
#include "trainscope/models/lora.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "trainscope/core/error.hpp"
#include "trainscope/models/safetensors.hpp"

namespace trainscope::models {

namespace F = torch::nn::functional;

namespace {
const std::vector<std::string>& known_targets() {
    static const std::vector<std::string> k{"q_proj",    "k_proj",  "v_proj",    "o_proj",
                                            "gate_proj", "up_proj", "down_proj", "lm_head"};
    return k;
}
} // namespace

LoraProjectionImpl::LoraProjectionImpl(std::shared_ptr<ProjectionImpl> base_, const LoraOptions& o,
                                       std::optional<at::Generator> generator)
    : ProjectionImpl(base_->in_features, base_->out_features), base(std::move(base_)),
      scaling(o.alpha / static_cast<double>(o.rank)), dropout_(o.dropout) {
    if (o.rank <= 0) throw core::ConfigError("llm.lora.rank must be positive");
    register_module("base", base);
    const torch::Tensor w = base->dense_weight();
    const auto options = torch::TensorOptions().dtype(w.scalar_type()).device(w.device());
    // kaiming_uniform_(a = sqrt(5)) on [rank, in]: bound = sqrt(6 / ((1 + a^2) fan_in)) =
    // 1 / sqrt(in).
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    lora_a = register_parameter(
        "lora_a", generator ? torch::empty({o.rank, in_features}, torch::dtype(w.scalar_type()))
                                  .uniform_(-bound, bound, *generator)
                                  .to(w.device())
                            : torch::empty({o.rank, in_features}, options).uniform_(-bound, bound));
    lora_b = register_parameter("lora_b", torch::zeros({out_features, o.rank}, options));
}

std::string LoraProjectionImpl::kind() const {
    const std::string b = base->kind();
    return b == "linear" ? "lora" : b + "+lora";
}

torch::Tensor LoraProjectionImpl::forward(const torch::Tensor& x) {
    torch::Tensor out = base->forward(x);
    if (!adapters_enabled_) return out;
    torch::Tensor h =
        dropout_ > 0 ? F::dropout(x, F::DropoutFuncOptions().p(dropout_).training(is_training()))
                     : x;
    // alpha/rank scales the small B [out, rank] rather than the [.., out] activation: the same
    // value and gradients, one multiply of rank x out elements instead of tokens x out.
    return out + F::linear(F::linear(h, lora_a), lora_b * scaling);
}

torch::Tensor LoraProjectionImpl::merged_weight() const {
    torch::NoGradGuard no_grad;
    return base->dense_weight() + scaling * torch::matmul(lora_b, lora_a);
}

void validate_lora_targets(const std::vector<std::string>& targets) {
    for (const auto& t : targets)
        if (std::find(known_targets().begin(), known_targets().end(), t) == known_targets().end())
            throw core::ConfigError("llm.lora.targets: '" + t +
                                    "' is not a Llama projection; use any of q_proj, k_proj, "
                                    "v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head");
}

std::vector<std::string> apply_lora(torch::nn::Module& model, const LoraOptions& options,
                                    const NameScope& scope,
                                    std::optional<at::Generator> generator) {
    validate_lora_targets(options.targets);
    for (auto& p : model.named_parameters(/*recurse=*/true))
        if (in_scope(scope, p.key())) p.value().set_requires_grad(false);
    std::vector<std::string> wrapped;
    for_each_projection(model, [&](torch::nn::Module& parent, const std::string& child,
                                   const std::string& full, std::shared_ptr<ProjectionImpl> p) {
        if (std::find(options.targets.begin(), options.targets.end(), child) ==
            options.targets.end())
            return;
        if (std::dynamic_pointer_cast<LoraProjectionImpl>(p)) return; // already wrapped
        if (!in_scope(scope, full)) return;
        parent.replace_module(child, std::make_shared<LoraProjectionImpl>(p, options, generator));
        wrapped.push_back(full);
    });
    return wrapped;
}

std::vector<std::pair<std::string, torch::Tensor>> lora_parameters(torch::nn::Module& model) {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& item : model.named_parameters(/*recurse=*/true)) {
        const std::string& n = item.key();
        if ((n.size() > 7 && n.compare(n.size() - 7, 7, ".lora_a") == 0) ||
            (n.size() > 7 && n.compare(n.size() - 7, 7, ".lora_b") == 0))
            out.emplace_back(n, item.value());
    }
    return out;
}

void set_adapters_enabled(torch::nn::Module& model, bool on) {
    for (const auto& m : model.modules(/*include_self=*/true))
        if (auto* l = dynamic_cast<LoraProjectionImpl*>(m.get())) l->set_adapters_enabled(on);
}

void merge_lora(torch::nn::Module& model) {
    for_each_projection(model, [&](torch::nn::Module& parent, const std::string& child,
                                   const std::string&, std::shared_ptr<ProjectionImpl> p) {
        auto lora = std::dynamic_pointer_cast<LoraProjectionImpl>(p);
        if (!lora || !std::dynamic_pointer_cast<LinearProjectionImpl>(lora->base)) return;
        const torch::Tensor merged = lora->merged_weight();
        auto plain = std::make_shared<LinearProjectionImpl>(lora->in_features, lora->out_features,
                                                            merged.options());
        {
            torch::NoGradGuard no_grad;
            plain->weight.copy_(merged);
        }
        plain->weight.set_requires_grad(lora->base->dense_weight().requires_grad());
        parent.replace_module(child, plain);
    });
}

std::int64_t save_peft_adapter(const std::string& dir, torch::nn::Module& model,
                               const LoraOptions& options, const std::string& base_model) {
    namespace fs = std::filesystem;
    const auto params = lora_parameters(model);
    if (params.empty()) return 0;
    // trainscope's "<module path>.lora_a" -> PEFT's "base_model.model.<HF path>.lora_A.weight"
    // (PEFT wraps LlamaForCausalLM, whose decoder is "model." and head "lm_head.").
    std::vector<std::pair<std::string, torch::Tensor>> tensors;
    std::set<std::string> targets; // the projections actually wrapped (last path component)
    for (const auto& [name, t] : params) {
        const std::string module = name.substr(0, name.size() - 7); // without ".lora_a"
        const bool a = name.compare(name.size() - 7, 7, ".lora_a") == 0;
        const bool head = module.rfind("lm_head", 0) == 0;
        tensors.emplace_back("base_model.model." + std::string(head ? "" : "model.") + module +
                                 (a ? ".lora_A.weight" : ".lora_B.weight"),
                             t.detach().cpu());
        targets.insert(module.substr(module.find_last_of('.') + 1));
    }
    const fs::path d(dir);
    std::error_code ec;
    if (!fs::is_directory(d, ec) && !fs::create_directory(d, ec))
        throw core::OutputError("cannot create the LoRA adapter directory '" + dir +
                                "': " + (ec ? ec.message() : "exists and is not a directory") +
                                "; choose another llm.save_adapters or output.file");
    save_safetensors((d / "adapter_model.safetensors").string(), tensors,
                     {{"format", "pt"}, {"producer", "trainscope"}});
    // The LoraConfig fields PEFT reads; the rest keep PEFT's defaults. fan_in_fan_out false:
    // lora_A is [rank, in] and lora_B [out, rank], torch.nn.Linear's layout.
    nlohmann::json c = {
        {"peft_type", "LORA"},
        {"task_type", "CAUSAL_LM"},
        {"r", options.rank},
        {"lora_alpha", options.alpha},
        {"lora_dropout", options.dropout},
        {"target_modules", std::vector<std::string>(targets.begin(), targets.end())},
        {"bias", "none"},
        {"lora_bias", false},
        {"fan_in_fan_out", false},
        {"inference_mode", true},
        {"use_rslora", false},
        {"use_dora", false},
        {"init_lora_weights", true},
        {"modules_to_save", nullptr},
        {"layers_to_transform", nullptr},
        {"rank_pattern", nlohmann::json::object()},
        {"alpha_pattern", nlohmann::json::object()},
        {"base_model_name_or_path",
         base_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(base_model)},
        {"revision", nullptr},
    };
    const fs::path config = d / "adapter_config.json", tmp = d / "adapter_config.json.tmp";
    {
        std::ofstream out(tmp, std::ios::trunc);
        if (!out)
            throw core::OutputError("cannot write '" + tmp.string() + "': " + std::strerror(errno));
        out << c.dump(2) << "\n";
        if (!out) throw core::OutputError("writing '" + tmp.string() + "' failed (disk full?)");
    }
    fs::rename(tmp, config, ec);
    if (ec)
        throw core::OutputError("cannot rename '" + tmp.string() + "' to '" + config.string() +
                                "': " + ec.message());
    return static_cast<std::int64_t>(tensors.size());
}

std::int64_t lora_parameter_count(const LlamaConfig& c, const LoraOptions& o) {
    auto has = [&](const std::string& t) {
        return std::find(o.targets.begin(), o.targets.end(), t) != o.targets.end();
    };
    std::int64_t per_layer = 0; // A [rank, in] and B [out, rank] per targeted projection
    for (const ProjectionShape& p : c.projection_shapes())
        if (has(p.name)) per_layer += p.in + p.out;
    std::int64_t total = o.rank * per_layer * c.num_hidden_layers;
    if (has("lm_head") && !c.tie_word_embeddings) total += o.rank * (c.hidden_size + c.vocab_size);
    return total;
}

} // namespace trainscope::models
