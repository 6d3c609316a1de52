// llm.* options: declaration, resolution and cross-checks.
#include "trainscope/train/llm_options.hpp"

#include <filesystem>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/text.hpp"

namespace trainscope::train {
namespace {

std::vector<std::string> split_list(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream in(s);
    for (std::string item; std::getline(in, item, ',');) {
        const auto b = item.find_first_not_of(" \t");
        if (b == std::string::npos) continue;
        out.push_back(item.substr(b, item.find_last_not_of(" \t") - b + 1));
    }
    return out;
}

bool is_preset(const std::string& name) {
    for (const char* p : {"llama3-8b", "llama3.1-8b", "llama3.2-1b", "llama3.2-3b", "tiny"})
        if (name == p) return true;
    return false;
}

std::string shown(double v) {
    std::ostringstream o;
    o << v;
    return o.str();
}

} // namespace

void declare_llm_options(core::OptionRegistry& r) {
    r.add_input_path("llm.model", "tiny",
                     "Llama model: a preset (llama3-8b, llama3.1-8b, llama3.2-1b, llama3.2-3b, "
                     "tiny) or a Hugging Face model directory / config.json (in an INI file: "
                     "relative to the file)",
                     {"llama3-8b", "llama3.1-8b", "llama3.2-1b", "llama3.2-3b", "tiny"});
    r.add_choice("llm.init", "auto", {"auto", "random", "checkpoint"},
                 "weights: checkpoint = load the model directory's safetensors; random = "
                 "initialise (scaling studies without weights); auto = checkpoint for a "
                 "directory with safetensors, else random");
    r.add_input_path("llm.tokenizer", "",
                     "tokenizer: Llama-3 tiktoken file (original/tokenizer.model) or Hugging Face "
                     "tokenizer.json; empty = the model directory's (in an INI file: relative to "
                     "the file)");
    r.add_choice("llm.method", "lora", {"full", "lora", "qlora", "dpo", "qat"},
                 "fine-tuning method: full weights, LoRA adapters, LoRA over NF4 weights, DPO "
                 "(LoRA policy vs adapters-off reference), QAT (int8 activations / int4 weights "
                 "fake-quantised)");
    r.add_input_path("llm.dataset.path", "",
                     "dataset file (.json array or .jsonl; in an INI file: relative to the file)");
    r.add_choice("llm.dataset.format", "instruct",
                 {"instruct", "summarize", "grammar", "chat", "text", "preference"},
                 "dataset type: instruct (Alpaca), summarize (dialogue/summary), grammar "
                 "(input/output), chat (OpenAI messages or ShareGPT conversations), text (plain "
                 "completion), preference (prompt/chosen/rejected; llm.method=dpo)");
    r.add_float("llm.val_fraction", 0.0,
                "held-out validation share of llm.dataset.path, in [0, 1): a seeded split "
                "(run.seed) the run never trains on, evaluated after every epoch (val_loss, "
                "val_perplexity; DPO: val_accuracy = reward accuracy); 0 = none (torchtune's "
                "default: no split)",
                0.0, 1.0);
    r.add_input_path("llm.val_dataset.path", "",
                     "validation dataset file (same llm.dataset.format), evaluated after every "
                     "epoch instead of a llm.val_fraction split; empty = none (in an INI file: "
                     "relative to the file)");
    r.add_int("llm.max_seq_len", 2048, "tokens per sample after truncation (and per pack)", 8,
              1 << 20);
    r.add_int("llm.max_samples", 0, "use the first N samples of the dataset (0 = all)", 0);
    r.add_bool("llm.train_on_input", false,
               "also train on prompt / user tokens (default: only responses)");
    r.add_bool("llm.packed", false,
               "pack samples greedily into sequences of llm.max_seq_len (attention per sample)");
    r.add_int("llm.lora.rank", 8, "LoRA rank", 1, 4096);
    r.add_float("llm.lora.alpha", 16.0, "LoRA alpha (the update is scaled by alpha / rank)", 0.0,
                1e6);
    r.add_float("llm.lora.dropout", 0.0, "dropout on the LoRA input", 0.0, 1.0);
    r.add_string("llm.lora.targets", "q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                 "projections that get adapters (comma-separated: q_proj k_proj v_proj o_proj "
                 "gate_proj up_proj down_proj lm_head)");
    r.add_float("llm.dpo.beta", 0.1, "DPO temperature beta", 0.0, 1e3);
    r.add_float("llm.dpo.label_smoothing", 0.0, "DPO label smoothing epsilon (conservative DPO)",
                0.0, 0.5);
    r.add_int("llm.qat.start_step", 0, "QAT: iterations before fake quantisation is switched on",
              0);
    r.add_int("llm.qat.group_size", 256, "QAT: int4 weight group size along the input dimension", 1,
              1 << 20);
    r.add_bool("llm.qat.lora", false,
               "QAT: train LoRA adapters over the fake-quantised weights "
               "instead of all weights");
    r.add_bool("llm.activation_checkpointing", false,
               "recompute each decoder layer's activations in backward instead of keeping them");
    r.add_int("llm.loss_chunks", 8,
              "token chunks of the output projection and loss (torchtune's "
              "CEWithChunkedOutputLoss; each chunk's gradients computed in forward): one chunk's "
              "logits at a time; 1 = the whole [batch, seq, vocab] logits",
              1, 1 << 20);
    r.add_int("llm.gradient_accumulation", 1,
              "micro-batches per optimizer step (train.batch_size samples each)", 1, 1 << 20);
    r.add_string("llm.save_adapters", "auto",
                 "PEFT adapter directory for the trained LoRA adapters (adapter_model.safetensors "
                 "+ adapter_config.json): auto = beside the run file (<output.file>.adapter), none "
                 "= not saved, or a directory path");
}

LlmMethod parse_llm_method(const std::string& name) {
    if (name == "full") return LlmMethod::Full;
    if (name == "lora") return LlmMethod::Lora;
    if (name == "qlora") return LlmMethod::Qlora;
    if (name == "dpo") return LlmMethod::Dpo;
    if (name == "qat") return LlmMethod::Qat;
    throw core::ConfigError("llm.method = '" + name + "': use full, lora, qlora, dpo or qat");
}

const char* to_string(LlmMethod method) {
    switch (method) {
    case LlmMethod::Full:
        return "full";
    case LlmMethod::Lora:
        return "lora";
    case LlmMethod::Qlora:
        return "qlora";
    case LlmMethod::Dpo:
        return "dpo";
    case LlmMethod::Qat:
        return "qat";
    }
    return "?";
}

bool uses_lora(const LlmOptions& o) {
    return o.method == LlmMethod::Lora || o.method == LlmMethod::Qlora ||
           o.method == LlmMethod::Dpo || (o.method == LlmMethod::Qat && o.qat_lora);
}

LlmOptions LlmOptions::from_config(const core::Config& c, const TrainConfig& train) {
    namespace fs = std::filesystem;
    LlmOptions o;
    o.model = c.get_string("llm.model");
    o.model_is_preset = is_preset(o.model);
    if (!o.model_is_preset && !fs::exists(o.model))
        throw core::ConfigError("llm.model = '" + o.model +
                                "' is neither a preset (llama3-8b, llama3.1-8b, llama3.2-1b, "
                                "llama3.2-3b, tiny) nor an existing model directory or "
                                "config.json");
    // A FIFO would block the read and a device never ends: a directory or a regular config.json,
    // and inside a directory only regular files, refused before anything is opened (as the
    // tokenizer and the datasets are).
    if (!o.model_is_preset && !fs::is_directory(o.model) && !fs::is_regular_file(o.model))
        throw core::InputError("llm.model = '" + o.model + "' is " + core::file_kind(o.model) +
                               ": set llm.model to a Hugging Face model directory, its "
                               "config.json, or a preset");
    if (!o.model_is_preset && fs::is_directory(o.model))
        for (const char* name :
             {"config.json", "model.safetensors", "model.safetensors.index.json"}) {
            const fs::path f = fs::path(o.model) / name;
            std::error_code ec;
            if (fs::exists(fs::symlink_status(f, ec)) && !fs::is_regular_file(f))
                throw core::InputError("llm.model = '" + o.model + "': " + f.string() + " is " +
                                       core::file_kind(f.string()) +
                                       ", not a regular file: replace it with the model's " + name +
                                       " (a FIFO or device cannot be read as one)");
        }
    const fs::path model_dir = o.model_is_preset           ? fs::path()
                               : fs::is_directory(o.model) ? fs::path(o.model)
                                                           : fs::path(o.model).parent_path();
    const std::string init = c.get_string("llm.init");
    const bool dir_has_weights =
        !o.model_is_preset && (fs::exists(model_dir / "model.safetensors") ||
                               fs::exists(model_dir / "model.safetensors.index.json"));
    if (init == "checkpoint") {
        if (!dir_has_weights)
            throw core::ConfigError(
                "llm.init=checkpoint but " +
                (o.model_is_preset ? "llm.model=" + o.model + " is a preset without weights"
                                   : "'" + model_dir.string() +
                                         "' has no model.safetensors or "
                                         "model.safetensors.index.json") +
                ": point llm.model at a Hugging Face model directory, or use llm.init=random");
        o.checkpoint = model_dir.string();
    } else if (init == "auto" && dir_has_weights) {
        o.checkpoint = model_dir.string();
    }
    o.tokenizer = c.get_string("llm.tokenizer");
    if (o.tokenizer.empty()) {
        if (o.model_is_preset)
            throw core::ConfigError("llm.tokenizer is empty and llm.model=" + o.model +
                                    " is a preset without files: set llm.tokenizer to a Llama-3 "
                                    "tokenizer.model or tokenizer.json (the tiny runs use "
                                    "inputs/llm/data/tiny_tokenizer.model)");
        o.tokenizer = model_dir.string();
    }
    // Missing input files are input errors (exit 3), as a missing data.path is.
    if (!fs::exists(o.tokenizer))
        throw core::InputError("llm.tokenizer = '" + o.tokenizer +
                               "': no such file or directory; set llm.tokenizer to a Llama-3 "
                               "tokenizer.model or tokenizer.json");
    if (!fs::is_directory(o.tokenizer) && !fs::is_regular_file(o.tokenizer))
        throw core::InputError("llm.tokenizer = '" + o.tokenizer + "' is " +
                               core::file_kind(o.tokenizer) +
                               ", not a file: set llm.tokenizer to a Llama-3 tokenizer.model or "
                               "tokenizer.json (or the model directory holding one)");

    o.method = parse_llm_method(c.get_string("llm.method"));
    o.dataset.path = c.get_string("llm.dataset.path");
    if (o.dataset.path.empty())
        throw core::ConfigError("llm.dataset.path is empty: name a .json or .jsonl dataset (e.g. "
                                "inputs/llm/data/instruct.jsonl)");
    if (!fs::is_regular_file(o.dataset.path))
        throw core::InputError("llm.dataset.path = '" + o.dataset.path +
                               "': " + (fs::exists(o.dataset.path) ? "is " : "") +
                               core::file_kind(o.dataset.path) +
                               "; set it to a .json or .jsonl dataset file");
    o.dataset.format = data::parse_text_format(c.get_string("llm.dataset.format"));
    o.dataset.max_seq_len = c.get_int("llm.max_seq_len");
    o.dataset.train_on_input = c.get_bool("llm.train_on_input");
    o.dataset.max_samples = c.get_int("llm.max_samples");
    o.packed = c.get_bool("llm.packed");
    o.val_fraction = c.get_float("llm.val_fraction");
    o.val_path = c.get_string("llm.val_dataset.path");
    if (o.val_fraction >= 1.0)
        throw core::ConfigError("llm.val_fraction = " + shown(o.val_fraction) +
                                " leaves nothing to train on: use a share in [0, 1) such as 0.05, "
                                "or 0 for no validation");
    if (o.val_fraction > 0 && !o.val_path.empty())
        throw core::ConfigError("llm.val_fraction = " + shown(o.val_fraction) +
                                " and llm.val_dataset.path = '" + o.val_path +
                                "' both name a validation set: set one of them");
    if (!o.val_path.empty() && !fs::is_regular_file(o.val_path))
        throw core::InputError(
            "llm.val_dataset.path = '" + o.val_path +
            "': " + (fs::exists(o.val_path) ? "is " : "") + core::file_kind(o.val_path) +
            "; set it to a .json or .jsonl file in llm.dataset.format, or leave it empty");
    const bool preference = o.dataset.format == data::TextFormat::Preference;
    if (o.method == LlmMethod::Dpo && !preference)
        throw core::ConfigError("llm.method=dpo needs preference data (prompt, chosen, "
                                "rejected): set llm.dataset.format=preference");
    if (o.method != LlmMethod::Dpo && preference)
        throw core::ConfigError("llm.dataset.format=preference is for llm.method=dpo; use "
                                "llm.method=dpo, or a supervised format (instruct, summarize, "
                                "grammar, chat, text)");
    if (o.packed && preference)
        throw core::ConfigError("llm.packed=true does not apply to preference data (chosen and "
                                "rejected must stay paired): set llm.packed=false");

    o.lora.rank = c.get_int("llm.lora.rank");
    o.lora.alpha = c.get_float("llm.lora.alpha");
    o.lora.dropout = c.get_float("llm.lora.dropout");
    o.lora.targets = split_list(c.get_string("llm.lora.targets"));
    if (o.lora.targets.empty())
        throw core::ConfigError("llm.lora.targets is empty: name at least one projection (e.g. "
                                "q_proj,v_proj)");
    models::validate_lora_targets(o.lora.targets);
    o.dpo_beta = c.get_float("llm.dpo.beta");
    o.dpo_label_smoothing = c.get_float("llm.dpo.label_smoothing");
    o.qat_start_step = c.get_int("llm.qat.start_step");
    o.qat_group_size = c.get_int("llm.qat.group_size");
    o.qat_lora = c.get_bool("llm.qat.lora");
    o.activation_checkpointing = c.get_bool("llm.activation_checkpointing");
    o.loss_chunks = c.get_int("llm.loss_chunks");
    o.gradient_accumulation = c.get_int("llm.gradient_accumulation");
    o.sharding = dist::read_sharding(c);
    const int zero = dist::to_int(o.sharding.zero);
    if ((zero == 1 || zero == 2) && uses_lora(o))
        throw core::ConfigError("dist.zero=" + std::to_string(zero) +
                                " shards the optimizer state of full-weight training; llm.method=" +
                                to_string(o.method) +
                                (o.method == LlmMethod::Qat ? " with llm.qat.lora=true" : "") +
                                " trains only LoRA adapters (small): set dist.zero=0, or "
                                "dist.zero=3 to shard the frozen base weights too");
    const std::string save = c.get_string("llm.save_adapters");
    if (save == "auto")
        o.save_adapters = adapter_dir_beside(c.get_string("output.file"));
    else if (save != "none")
        o.save_adapters = save;
    o.adapters_beside_run_file = save == "auto";
    // Written at the very end of the run: refuse an existing directory now, as the run file is.
    // The auto path is checked by the workload once the run file's path is final (--resume writes
    // <stem>.resume<k>.h5).
    if (save != "auto" && uses_lora(o) && !o.save_adapters.empty())
        check_adapter_dir(o.save_adapters, save, c.get_bool("output.overwrite"),
                          c.get_string("output.file"));

    o.precision = c.get_string("run.precision");
    // torchtune's defaults for what was left unset came with the configuration
    // (apply_workload_defaults).
    // The sharded optimizers (ZeRO-1/2, FSDP) implement AdamW and step without a loss scaler.
    if (zero > 0 && train.optimizer.kind != "adamw")
        throw core::ConfigError("dist.zero=" + std::to_string(zero) +
                                " implements AdamW: set train.optimizer=adamw");
    if (zero > 0 && o.precision == "fp16-mixed")
        throw core::ConfigError("dist.zero=" + std::to_string(zero) +
                                " has no loss scaler for run.precision=fp16-mixed: use "
                                "bf16-mixed (as torchtune's recipes) or fp32, or dist.zero=0");
    return o;
}

std::string adapter_dir_beside(const std::string& run_file) {
    return run_file + ".adapter";
}

void check_adapter_dir(const std::string& dir, const std::string& setting, bool overwrite,
                       const std::string& run_file) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path p(dir);
    if (!p.has_filename()) p = p.parent_path(); // "a/b/" names the directory b
    std::error_code ea, eb;
    const fs::path mine = fs::weakly_canonical(fs::absolute(p, ea), ea);
    const fs::path run = fs::weakly_canonical(fs::absolute(run_file, eb), eb);
    if (!ea && !eb && mine == run)
        throw core::OutputError("llm.save_adapters=" + setting + " is the run file itself (" +
                                "output.file=" + run_file +
                                "): the LoRA adapters are a PEFT directory written beside the run "
                                "file; choose another path, llm.save_adapters=auto or none");
    if (fs::exists(p, ec) && !overwrite)
        throw core::OutputError("LoRA adapter directory '" + dir +
                                "' exists (llm.save_adapters=" + setting +
                                "); set output.overwrite=true, choose another output.file or "
                                "llm.save_adapters=PATH, or llm.save_adapters=none");
    if (fs::exists(p, ec) && !fs::is_directory(p, ec))
        throw core::OutputError("'" + dir + "' (llm.save_adapters=" + setting +
                                ") exists and is not a directory: the LoRA adapters are written "
                                "as a PEFT adapter directory; remove it, choose another "
                                "output.file or llm.save_adapters=PATH, or llm.save_adapters=none");
    const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
    if (fs::exists(parent, ec) && !fs::is_directory(parent, ec))
        throw core::OutputError("'" + parent.string() +
                                "' is not a directory (llm.save_adapters=" + setting +
                                "): the adapter directory cannot be created inside it; "
                                "choose another path or llm.save_adapters=none");
    if (!fs::is_directory(parent, ec))
        throw core::OutputError(
            "directory '" + parent.string() + "' does not exist (llm.save_adapters=" + setting +
            "): create it first (mkdir -p " + parent.string() + ") or choose another path");
    // Permission bits do not tell (root passes access(); /proc, read-only mounts and full quotas
    // refuse anyway): create and remove a directory there, as the end of the run will.
    const fs::path probe =
        parent / (".trainscope-adapter-probe-" + std::to_string(static_cast<long>(::getpid())));
    if (::mkdir(probe.c_str(), 0700) != 0) {
        const int err = errno;
        throw core::OutputError("directory '" + parent.string() +
                                "' is not writable (llm.save_adapters=" + setting +
                                "): creating a directory there failed (" + std::strerror(err) +
                                "), so the adapters would be lost at the end of the run; choose a "
                                "writable path or llm.save_adapters=none");
    }
    ::rmdir(probe.c_str());
}

models::LlamaConfig resolve_llama_config(const LlmOptions& o, std::int64_t tokenizer_vocab) {
    namespace fs = std::filesystem;
    models::LlamaConfig cfg;
    if (o.model_is_preset) {
        cfg = models::LlamaConfig::preset(o.model);
        if (o.model == "tiny" && tokenizer_vocab > 0) cfg.vocab_size = tokenizer_vocab;
    } else {
        const fs::path p =
            fs::is_directory(o.model) ? fs::path(o.model) / "config.json" : fs::path(o.model);
        cfg = models::LlamaConfig::from_hf_json_file(p.string());
    }
    if (tokenizer_vocab > cfg.vocab_size)
        throw core::ConfigError("the tokenizer has " + std::to_string(tokenizer_vocab) +
                                " ids but the model's vocab_size is " +
                                std::to_string(cfg.vocab_size) + " (llm.model=" + o.model +
                                "): use the model's own tokenizer (llm.tokenizer)");
    cfg.validate();
    return cfg;
}

} // namespace trainscope::train
