// Tokenizers for LLM fine-tuning: Llama-3's tiktoken file (original/tokenizer.model: one
// "<base64 token> <rank>" per line) with Llama-3's split pattern and its 256 special tokens, and
// Hugging Face tokenizer.json byte-level BPE. The Unicode split pattern runs on PCRE2 (UTF mode,
// JIT where available). Both encode ordinary text (special-token text is NOT parsed: the datasets
// add specials by id) and decode ids back to text (specials rendered as their text).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trainscope::data {

// Ids of the special tokens the formats use. For a tiktoken file the 256 specials take ids
// num_base_tokens + k in Llama-3's order (begin_of_text, end_of_text, reserved_special_token_0,
// reserved_special_token_1, finetune_right_pad_id, step_id, start_header_id, end_header_id,
// eom_id, eot_id, python_tag, then reserved_special_token_2 ... up to 256 in total): 128000,
// 128001, 128004 (pad), 128006/128007 (headers), 128009 (eot) for the real file. For
// tokenizer.json they are looked up by text among its added_tokens.
struct SpecialTokens {
    std::int64_t bos = -1;          // <|begin_of_text|>
    std::int64_t eos = -1;          // <|end_of_text|>
    std::int64_t pad = -1;          // <|finetune_right_pad_id|>
    std::int64_t start_header = -1; // <|start_header_id|>
    std::int64_t end_header = -1;   // <|end_header_id|>
    std::int64_t eot = -1;          // <|eot_id|>
};

class Tokenizer {
  public:
    virtual ~Tokenizer() = default;
    // Ordinary text -> ids (split pattern, then byte-level BPE per piece). No BOS/EOS added.
    virtual std::vector<std::int64_t> encode(std::string_view text) const = 0;
    // Ids -> text (UTF-8; invalid sequences from partial tokens are kept bytewise).
    virtual std::string decode(const std::vector<std::int64_t>& ids) const = 0;
    // Number of ids (base + specials): the model's vocab_size must be at least this.
    virtual std::int64_t vocab_size() const = 0;
    // Id of a special token given its text ("<|eot_id|>"), if the tokenizer has it.
    virtual std::optional<std::int64_t> special_id(std::string_view text) const = 0;
    // "tiktoken" or "hf-bpe".
    virtual std::string kind() const = 0;
    const SpecialTokens& specials() const { return specials_; }

  protected:
    SpecialTokens specials_;
};

// original/tokenizer.model (tiktoken). Errors (core::InputError) name the file and line.
std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path);
// tokenizer.json (model.type "BPE", byte-level pre-tokenizer). Errors name the file and key.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);
// By name: *.json -> HF, otherwise tiktoken; a directory -> tokenizer.json, else
// original/tokenizer.model, else tokenizer.model inside it.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// A chat message (role: system, user, assistant, ipython).
struct Message {
    std::string role;
    std::string content;
    bool masked = false; // true: its tokens get label -100
};

// Token ids with a per-token mask (true = no loss on this token).
struct TokenizedText {
    std::vector<std::int64_t> ids;
    std::vector<bool> mask;
};

// Llama-3 chat format as torchtune's Llama3Tokenizer.tokenize_messages: BOS (if add_bos), then per
// message <|start_header_id|> role <|end_header_id|> "\n\n" content <|eot_id|>, then EOS if
// add_eos. Header and content tokens take the message's mask; BOS and EOS are always masked (as in
// torchtune).
TokenizedText tokenize_messages(const Tokenizer& tokenizer, const std::vector<Message>& messages,
                                bool add_bos = true, bool add_eos = true);

} // namespace trainscope::data
