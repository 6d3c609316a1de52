// libFuzzer target: data::load_hf_tokenizer on a Hugging Face tokenizer.json (byte-level BPE),
// then encoding and decoding a text with it. Input: the JSON, then after a NUL the text (a fixed
// sentence when there is none). Decoding is not checked against the text: added tokens may
// legitimately reuse vocabulary ids.
#include <cstdint>
#include <memory>
#include <string>

#include "fuzz_input.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/data/tokenizer.hpp"

using namespace trainscope;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static fuzz::FuzzFile file("tokenizer.json");
    const fuzz::SplitInput in = fuzz::split_at_nul(data, size);
    const std::string text = fuzz::text_part(in);
    std::unique_ptr<data::Tokenizer> tok;
    try {
        tok = data::load_hf_tokenizer(file.write(in.file));
    } catch (const core::InputError&) {
        return 0;
    }
    // A tokenizer that loaded must encode any text and decode its own ids without error.
    const auto ids = tok->encode(text);
    for (auto id : ids)
        fuzz::check(id >= 0 && id < tok->vocab_size(), "encoded id outside the vocabulary");
    tok->decode(ids);
    return 0;
}
