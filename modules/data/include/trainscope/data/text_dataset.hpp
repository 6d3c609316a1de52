// Text datasets for LLM fine-tuning, read from JSON (an array of objects) or JSONL (one object per
// line), tokenised and masked as torchtune's dataset builders do, and collated into padded batches.
//
//   instruct     Alpaca fields instruction, input (optional), output; torchtune's Alpaca template
//   summarize    dialogue, summary; "Summarize this dialogue:\n{dialogue}\n---\nSummary:\n"
//   grammar      input, output; "Correct this to standard English: {input}\n---\nCorrected: "
//   chat         messages [{role, content}] (OpenAI style) or conversations [{from, value}]
//                (ShareGPT: from = system | human | gpt)
//   text         text (plain completion: every token trained on)
//   preference   prompt (string, or messages), chosen, rejected (strings or messages)
//
// Masking: prompt tokens get label -100 unless train_on_input; for chat, non-assistant turns
// (system and user) are masked unless train_on_input. Sequences end with EOS and are truncated to
// max_seq_len (the last kept token is then not replaced: torchtune truncates plainly).
// No LibTorch here (the fuzz build compiles the reader alone): batches are in text_batch.hpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainscope/data/tokenizer.hpp"

namespace trainscope::data {

enum class TextFormat { Instruct, Summarize, Grammar, Chat, Text, Preference };
TextFormat
parse_text_format(const std::string& name); // throws core::ConfigError naming llm.dataset.format
const char* to_string(TextFormat format);

struct TextDatasetOptions {
    std::string path; // .json or .jsonl
    TextFormat format = TextFormat::Instruct;
    std::int64_t max_seq_len = 2048;
    bool train_on_input = false;
    std::int64_t max_samples = 0; // 0 = all
};

// The label of a token without loss (PyTorch's cross-entropy ignore_index).
inline constexpr std::int64_t kIgnoreLabel = -100;

// One tokenised example: ids and labels of equal length, labels[i] = ids[i] or -100.
struct TokenizedSample {
    std::vector<std::int64_t> ids;
    std::vector<std::int64_t> labels;
};

struct PreferenceSample {
    TokenizedSample chosen, rejected; // each = prompt + response, prompt masked
};

// A loaded and tokenised dataset. Errors (core::InputError) name the file, the line (JSONL) or
// element index (JSON), and the missing/mistyped field with the format's expected fields.
class TextDataset {
  public:
    TextDataset(const TextDatasetOptions& options, const Tokenizer& tokenizer);
    std::int64_t size() const;
    TextFormat format() const { return options_.format; }
    bool is_preference() const { return options_.format == TextFormat::Preference; }
    const TokenizedSample& sample(std::int64_t i) const;      // SFT formats
    const PreferenceSample& preference(std::int64_t i) const; // preference format
    std::int64_t truncated() const { return truncated_; }     // samples cut at max_seq_len
    // Tokens of sample i that carry a loss (labels after the first position that are not -100;
    // for a preference pair, chosen and rejected together). 0 when llm.max_seq_len cut the
    // sample inside its masked prompt.
    std::int64_t trained_tokens(std::int64_t i) const;
    // Length of sample i's masked prefix (BOS, template and prompt) before truncation: the
    // llm.max_seq_len it needs to train on at least one token is this plus one.
    std::int64_t prompt_tokens(std::int64_t i) const;

  private:
    TextDatasetOptions options_;
    std::vector<TokenizedSample> samples_;
    std::vector<PreferenceSample> preferences_;
    std::vector<std::int64_t> prompt_tokens_; // per sample, before truncation
    std::int64_t truncated_ = 0;
};

// Greedy packing as torchtune's PackedDataset: samples appended in order into packs of exactly
// max_seq_len tokens (a sample longer than max_seq_len is truncated; a sample that does not fit the
// current pack starts the next one), the rest padded with pad_id / label -100. Positions restart at
// 0 for every sample; segment ids number the samples inside a pack (padding gets its own id).
struct PackedSample {
    std::vector<std::int64_t> ids, labels, positions, segments;
    std::int64_t length = 0; // tokens before padding
};
std::vector<PackedSample> pack_samples(const std::vector<const TokenizedSample*>& samples,
                                       std::int64_t max_seq_len, std::int64_t pad_id);

} // namespace trainscope::data
