// libFuzzer target: data::load_tiktoken on a tiktoken ranks file ("<base64 token> <rank>" lines),
// then encoding a text with it. Input: the file, then after a NUL the text (a fixed sentence when
// there is none). Byte-level BPE is lossless: decode(encode(text)) must give the text back.
#include <cstdint>
#include <memory>
#include <string>

#include "fuzz_input.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/data/tokenizer.hpp"

using namespace trainscope;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static fuzz::FuzzFile file("tokenizer.model");
    const fuzz::SplitInput in = fuzz::split_at_nul(data, size);
    const std::string text = fuzz::text_part(in);
    std::unique_ptr<data::Tokenizer> tok;
    try {
        tok = data::load_tiktoken(file.write(in.file));
    } catch (const core::InputError&) {
        return 0;
    }
    // A tokenizer that loaded must encode any text and decode its own ids without error.
    const auto ids = tok->encode(text);
    for (auto id : ids)
        fuzz::check(id >= 0 && id < tok->vocab_size(), "encoded id outside the vocabulary");
    fuzz::check(tok->decode(ids) == text, "decode(encode(text)) != text");
    fuzz::check(tok->special_id("<|eot_id|>") == tok->specials().eot, "eot id mismatch");
    return 0;
}
