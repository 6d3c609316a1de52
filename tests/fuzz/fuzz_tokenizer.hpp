// The body shared by the two tokenizer targets: load a tokenizer file, then encode a text with it.
// Input: the file, then after a NUL the text (a fixed sentence when there is none).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "fuzz_input.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/data/tokenizer.hpp"

namespace trainscope::fuzz {

// `load(path)` is data::load_tiktoken or data::load_hf_tokenizer. A file that loads must encode any
// text to ids inside the vocabulary and decode them without error; with `lossless`,
// decode(encode(text)) must also give the text back.
template <class Load>
int fuzz_tokenizer(const std::uint8_t* data, std::size_t size, FuzzFile& file, Load&& load,
                   bool lossless) {
    const SplitInput in = split_at_nul(data, size);
    const std::string text = in.parts.empty() ? std::string("Hello world, 1234 tokens!\n\n  ok")
                                              : std::string(in.parts[0]);
    std::unique_ptr<data::Tokenizer> tok;
    try {
        tok = load(file.write(in.file));
    } catch (const core::InputError&) {
        return 0;
    }
    const auto ids = tok->encode(text);
    for (auto id : ids)
        check(id >= 0 && id < tok->vocab_size(), "encoded id outside the vocabulary");
    const std::string back = tok->decode(ids);
    if (lossless) check(back == text, "decode(encode(text)) != text");
    return 0;
}

} // namespace trainscope::fuzz
