// Llama's configuration: Hugging Face config.json (both rotary forms, validated), the presets, the
// parameter and FLOP counts, and the rotary inverse frequencies (Llama-3's scaling included).
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

namespace trainscope::models {

using json = nlohmann::json;
// ---- configuration ------------------------------------------------------------------------------

namespace {

// Rotary settings of a config.json. transformers < 5 writes a top-level "rope_theta" and an
// optional "rope_scaling" object; transformers 5 writes one "rope_parameters" object
// {"rope_type", "rope_theta", and the scaling keys}. Both forms are read; where a file carries
// both they must agree. Nothing is defaulted: a wrong theta or a dropped scaling trains a
// different position code without any error.
class RopeReader {
  public:
    RopeReader(const json& config, const std::string& origin) : j_(config), origin_(origin) {}

    void read(LlamaConfig& c) const {
        const json* params = object_or_null("rope_parameters");
        const json* scaling = object_or_null("rope_scaling");
        const std::optional<double> top_theta = number_at(j_, "rope_theta", "\"rope_theta\"");
        std::optional<double> theta = top_theta;
        if (params) {
            const std::string where = "\"rope_parameters\"";
            if (!params->contains("rope_theta") && !params->contains("rope_type"))
                for (const auto& item : params->items())
                    if (item.value().is_object())
                        fail(where + " holds one entry per layer type (\"" + item.key() +
                             "\", ...): that is not a Llama configuration (every Llama layer "
                             "uses the same rotary embedding); use a Llama config.json");
            const std::optional<double> own =
                number_at(*params, "rope_theta", where + ".rope_theta");
            if (own && top_theta && *own != *top_theta)
                fail(where + ".rope_theta = " + num(*own) + " but the top-level \"rope_theta\" = " +
                     num(*top_theta) + ": remove one of them or make them equal");
            if (own) theta = own;
            c.rope_scaling = scaling_of(*params, where, /*may_hold_theta=*/true);
            if (scaling) {
                const RopeScaling old = scaling_of(*scaling, "\"rope_scaling\"", false);
                if (!same(old, c.rope_scaling))
                    fail("\"rope_scaling\" and \"rope_parameters\" describe different rotary "
                         "scalings: remove \"rope_scaling\" (transformers 5 reads only "
                         "\"rope_parameters\") or make them equal");
            }
        } else if (scaling) {
            c.rope_scaling = scaling_of(*scaling, "\"rope_scaling\"", /*may_hold_theta=*/false);
        }
        if (!theta)
            fail("no rotary base found: looked for \"rope_parameters\": {\"rope_theta\": ...} "
                 "(transformers >= 5) and a top-level \"rope_theta\" (older versions); add the "
                 "model's value (Llama-3: 500000, Llama-2: 10000) instead of relying on a default");
        c.rope_theta = *theta;
    }

  private:
    [[noreturn]] void fail(const std::string& what) const {
        throw core::ConfigError("'" + origin_ + "': " + what);
    }
    static std::string num(double v) {
        std::ostringstream o;
        o << v;
        return o.str();
    }
    const json* object_or_null(const char* key) const {
        if (!j_.contains(key) || j_[key].is_null()) return nullptr;
        if (!j_[key].is_object()) fail(std::string("\"") + key + "\" must be an object (or null)");
        return &j_[key];
    }
    std::optional<double> number_at(const json& o, const char* key, const std::string& name) const {
        if (!o.contains(key) || o[key].is_null()) return std::nullopt;
        if (!o[key].is_number()) fail(name + " must be a number");
        return o[key].get<double>();
    }

    // The scaling of a rope_scaling / rope_parameters object: rope_type "default" (none) or
    // "llama3" (Llama-3.1) with all four of its keys, as transformers requires. Unknown keys are
    // refused: each one changes the frequencies in some other rope type.
    RopeScaling scaling_of(const json& r, const std::string& where, bool may_hold_theta) const {
        static const std::vector<std::string> llama3_keys = {
            "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
        std::string type = "default";
        for (const char* k : {"rope_type", "type"})
            if (r.contains(k)) {
                if (!r[k].is_string()) fail(where + "." + k + " must be a string");
                type = r[k].get<std::string>();
                break;
            }
        if (type != "default" && type != "llama3")
            fail(where + " has rope type '" + type +
                 "', which trainscope does not implement (only \"default\" and Llama-3.1's "
                 "\"llama3\"); use a Llama-3 / 3.1 / 3.2 model");
        for (const auto& item : r.items()) {
            const std::string& k = item.key();
            const bool known =
                k == "rope_type" || k == "type" || (may_hold_theta && k == "rope_theta") ||
                (type == "llama3" &&
                 std::find(llama3_keys.begin(), llama3_keys.end(), k) != llama3_keys.end());
            if (k == "partial_rotary_factor" && item.value().is_number() &&
                item.value().get<double>() == 1.0)
                continue; // the whole head rotates: what trainscope does
            if (!known)
                fail(where + " has \"" + k + "\", which rope type '" + type +
                     "' does not use in trainscope: remove it if it is unused, or use a model "
                     "trainscope supports (it would otherwise be ignored silently)");
        }
        RopeScaling s;
        if (type == "default") return s;
        s.enabled = true;
        for (const auto& k : llama3_keys)
            if (!r.contains(k) || !r[k].is_number())
                fail(where + " (rope type \"llama3\") needs a number \"" + k +
                     "\" (factor, low_freq_factor, high_freq_factor and "
                     "original_max_position_embeddings)");
        s.factor = r["factor"].get<double>();
        s.low_freq_factor = r["low_freq_factor"].get<double>();
        s.high_freq_factor = r["high_freq_factor"].get<double>();
        if (!r["original_max_position_embeddings"].is_number_integer())
            fail(where + ".original_max_position_embeddings must be an integer");
        s.original_max_position_embeddings =
            r["original_max_position_embeddings"].get<std::int64_t>();
        if (!(s.factor > 0) || !(s.low_freq_factor > 0) ||
            !(s.high_freq_factor > s.low_freq_factor) || s.original_max_position_embeddings <= 0)
            fail(where + ": llama3 scaling needs factor > 0, 0 < low_freq_factor < "
                         "high_freq_factor and original_max_position_embeddings > 0 (Llama-3.1: "
                         "8, 1, 4, 8192)");
        return s;
    }
    static bool same(const RopeScaling& a, const RopeScaling& b) {
        return a.enabled == b.enabled &&
               (!a.enabled ||
                (a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
                 a.high_freq_factor == b.high_freq_factor &&
                 a.original_max_position_embeddings == b.original_max_position_embeddings));
    }

    const json& j_;
    const std::string& origin_;
};

} // namespace

LlamaConfig LlamaConfig::from_hf_json_text(const std::string& text, const std::string& origin) {
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception& e) {
        throw core::ConfigError("'" + origin + "' is not valid JSON (" + e.what() +
                                "): llm.model needs the model's Hugging Face config.json; fix "
                                "or replace the file");
    }
    if (!j.is_object())
        throw core::ConfigError("'" + origin +
                                "' is not a JSON object: llm.model needs the model's Hugging "
                                "Face config.json");
    auto fail = [&](const std::string& what) {
        throw core::ConfigError("'" + origin + "': " + what);
    };
    auto need_int = [&](const char* key) -> std::int64_t {
        if (!j.contains(key))
            throw core::ConfigError("'" + origin + "' lacks \"" + key +
                                    "\": a Llama config.json needs hidden_size, "
                                    "intermediate_size, num_hidden_layers, num_attention_heads "
                                    "and vocab_size");
        if (!j[key].is_number_integer()) fail(std::string("\"") + key + "\" must be an integer");
        return j[key].get<std::int64_t>();
    };
    auto opt_num = [&](const char* key, double def) -> double {
        if (!j.contains(key) || j[key].is_null()) return def;
        if (!j[key].is_number()) fail(std::string("\"") + key + "\" must be a number");
        return j[key].get<double>();
    };
    auto opt_bool = [&](const char* key, bool def) -> bool {
        if (!j.contains(key) || j[key].is_null()) return def;
        if (!j[key].is_boolean()) fail(std::string("\"") + key + "\" must be true/false");
        return j[key].get<bool>();
    };
    // What trainscope's Llama cannot express is refused, never ignored: a model trained without
    // its biases (or with another activation) is a different model, and the run would still
    // finish with a plausible loss.
    if (j.contains("model_type") && !j["model_type"].is_null() &&
        (!j["model_type"].is_string() || j["model_type"].get<std::string>() != "llama"))
        fail("model_type = " + j["model_type"].dump() +
             ": trainscope builds Llama models only (model_type \"llama\"); use a Llama-3 / 3.1 "
             "/ 3.2 checkpoint");
    if (opt_bool("attention_bias", false))
        fail("attention_bias=true: trainscope's Llama has no attention biases (q/k/v/o_proj.bias) "
             "and would train a different model without them; use a checkpoint without "
             "attention biases (Llama-3 / 3.1 / 3.2)");
    if (opt_bool("mlp_bias", false))
        fail("mlp_bias=true: trainscope's Llama has no MLP biases (gate/up/down_proj.bias) and "
             "would train a different model without them; use a checkpoint without MLP biases "
             "(Llama-3 / 3.1 / 3.2)");
    if (j.contains("hidden_act") && !j["hidden_act"].is_null() &&
        (!j["hidden_act"].is_string() || j["hidden_act"].get<std::string>() != "silu"))
        fail("hidden_act = " + j["hidden_act"].dump() +
             ": trainscope's Llama MLP is SwiGLU (\"silu\"); use a Llama checkpoint");
    if (opt_num("attention_dropout", 0.0) != 0.0)
        fail("attention_dropout = " + j["attention_dropout"].dump() +
             ": trainscope does not apply dropout to attention probabilities; set it to 0.0 (as "
             "every Llama-3 config.json does)");
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
    if (j.contains("head_dim") && !j["head_dim"].is_null()) {
        c.head_dim = need_int("head_dim");
    } else {
        // Hugging Face derives it by integer division; a remainder would silently shrink the
        // attention (q_proj [heads * head_dim, hidden] no longer square).
        if (c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads != 0)
            fail("hidden_size = " + std::to_string(c.hidden_size) +
                 " is not a multiple of num_attention_heads = " +
                 std::to_string(c.num_attention_heads) +
                 " and there is no \"head_dim\": fix the sizes, or give head_dim explicitly");
        c.head_dim = c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0;
    }
    c.rms_norm_eps = opt_num("rms_norm_eps", 1e-6);
    c.max_position_embeddings =
        j.contains("max_position_embeddings") && !j["max_position_embeddings"].is_null()
            ? need_int("max_position_embeddings")
            : 2048;
    c.tie_word_embeddings = opt_bool("tie_word_embeddings", false);
    RopeReader(j, origin).read(c);
    try {
        c.validate();
    } catch (const core::ConfigError& e) {
        throw core::ConfigError("'" + origin + "': " + e.what());
    }
    return c;
}

LlamaConfig LlamaConfig::from_hf_json_file(const std::string& path) {
    if (!std::filesystem::is_regular_file(path))
        throw core::InputError("the model configuration '" + path + "' is " +
                               core::file_kind(path) +
                               ", not a regular file: llm.model must be a Hugging Face model "
                               "directory holding config.json, or that config.json itself");
    std::ifstream in(path);
    if (!in)
        throw core::ConfigError("cannot read the model configuration '" + path +
                                "': llm.model must be a Hugging Face model directory holding "
                                "config.json, or that config.json itself");
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
            "number of query heads): fix num_key_value_heads or num_attention_heads");
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
std::vector<ProjectionShape> LlamaConfig::projection_shapes() const {
    const std::int64_t h = hidden_size, f = intermediate_size, q = num_attention_heads * head_dim,
                       kv = num_key_value_heads * head_dim;
    return {{"q_proj", q, h},    {"k_proj", kv, h}, {"v_proj", kv, h},  {"o_proj", h, q},
            {"gate_proj", f, h}, {"up_proj", f, h}, {"down_proj", h, f}};
}

std::int64_t LlamaConfig::projection_parameters() const {
    std::int64_t n = 0;
    for (const ProjectionShape& p : projection_shapes())
        n += p.numel();
    return n;
}
std::int64_t LlamaConfig::layer_parameters() const {
    return projection_parameters() + 2 * hidden_size; // and the two RMSNorm weights
}
std::int64_t LlamaConfig::num_parameters() const {
    return embedding_parameters() + num_hidden_layers * layer_parameters() + hidden_size +
           head_parameters();
}

double LlamaConfig::forward_flops_per_token(std::int64_t seq_len) const {
    const double matmul =
        static_cast<double>(num_hidden_layers * projection_parameters() + vocab_size * hidden_size);
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

} // namespace trainscope::models
