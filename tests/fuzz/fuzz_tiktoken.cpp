// libFuzzer target: data::load_tiktoken on a tiktoken ranks file ("<base64 token> <rank>" lines),
// then encoding a text with it (fuzz_tokenizer.hpp). Byte-level BPE over all 256 bytes is
// lossless, so decode(encode(text)) must give the text back.
#include "fuzz_tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static trainscope::fuzz::FuzzFile file("tokenizer.model");
    return trainscope::fuzz::fuzz_tokenizer(data, size, file, trainscope::data::load_tiktoken,
                                            /*lossless=*/true);
}
