// Options of run.workload=llm (llm.*, dist.zero) and their resolved form. Fine-tuning defaults
// follow torchtune's Llama-3-8B recipes: where the user left a train.* or run.precision option at
// its (image-classification) default, an LLM run uses AdamW, lr 3e-4, weight decay 0.01, cosine
// schedule, bf16 — said once in the log and recorded in /config like any resolved option.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainscope/data/text_dataset.hpp"
#include "trainscope/distributed/options.hpp"
#include "trainscope/models/llama.hpp"
#include "trainscope/models/lora.hpp"
#include "trainscope/train/options.hpp"

namespace trainscope::core {
class Config;
class OptionRegistry;
} // namespace trainscope::core

namespace trainscope::train {

void declare_llm_options(core::OptionRegistry& registry);

enum class LlmMethod { Full, Lora, Qlora, Dpo, Qat };
LlmMethod parse_llm_method(const std::string& name);
const char* to_string(LlmMethod method);

struct LlmOptions {
    std::string model = "tiny"; // preset name, or a directory / config.json path
    bool model_is_preset = true;
    std::string checkpoint; // safetensors to load; empty: random initialisation
    std::string tokenizer;  // tokenizer file or directory
    LlmMethod method = LlmMethod::Lora;
    data::TextDatasetOptions dataset;
    bool packed = false;
    // Validation after every epoch: a seeded share of the dataset held out (llm.val_fraction) or
    // a file of the same format (llm.val_dataset.path); neither = none.
    double val_fraction = 0;
    std::string val_path;
    models::LoraOptions lora;
    double dpo_beta = 0.1, dpo_label_smoothing = 0.0;
    std::int64_t qat_start_step = 0, qat_group_size = 256;
    bool qat_lora = false;
    bool activation_checkpointing = false;
    std::int64_t loss_chunks = 8; // llm.loss_chunks (kDefaultLossChunks)
    std::int64_t gradient_accumulation = 1;
    dist::ShardingOptions sharding;        // dist.zero, dist.reshard_after_forward, dist.prefetch
    std::string save_adapters;             // PEFT adapter directory ("" = none)
    bool adapters_beside_run_file = false; // llm.save_adapters=auto: <run file>.adapter
    // run.precision as resolved for the LLM run (bf16, torchtune's, unless set).
    std::string precision = "bf16";

    // Reads and cross-checks llm.* against the run's train.* (`train`, read once by the Session):
    // ConfigError naming the option on any inconsistency.
    static LlmOptions from_config(const core::Config& config, const TrainConfig& train);
};

// Whether `method` trains LoRA adapters (lora, qlora, dpo, qat with llm.qat.lora).
bool uses_lora(const LlmOptions& o);

// llm.save_adapters=auto's PEFT adapter directory: "<run file>.adapter".
std::string adapter_dir_beside(const std::string& run_file);
// Refuses (core::OutputError naming the path, `setting` and the fix) an adapter directory that
// would be overwritten without output.overwrite, a path that exists but is no directory, the run
// file's own path, and a parent that is missing, not a directory or not writable: the adapters
// are written at the end of the run, so this is checked at its start.
void check_adapter_dir(const std::string& dir, const std::string& setting, bool overwrite,
                       const std::string& run_file);

// The model's configuration: preset or config.json; for the tiny preset the vocabulary is sized to
// the tokenizer (vocab 0 means "take it from the tokenizer").
models::LlamaConfig resolve_llama_config(const LlmOptions& o, std::int64_t tokenizer_vocab);

} // namespace trainscope::train
