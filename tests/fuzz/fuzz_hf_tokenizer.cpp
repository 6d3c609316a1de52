// libFuzzer target: data::load_hf_tokenizer on a Hugging Face tokenizer.json (byte-level BPE),
// then encoding and decoding a text with it (fuzz_tokenizer.hpp). The round trip is not required:
// added tokens may legitimately reuse vocabulary ids.
#include "fuzz_tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static trainscope::fuzz::FuzzFile file("tokenizer.json");
    return trainscope::fuzz::fuzz_tokenizer(data, size, file, trainscope::data::load_hf_tokenizer,
                                            /*lossless=*/false);
}
