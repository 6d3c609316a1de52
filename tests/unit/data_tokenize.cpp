// data_tokenize: a helper program (not a test) for tests/python/test_tokenizer_reference.py, which
// compares trainscope's tokenizers with Python tiktoken and Hugging Face tokenizers.
//   data_tokenize <tokenizer file> <texts.json>
// reads a JSON array of strings and prints {"ids": [[...], ...], "decoded": ["...", ...]}.
// Errors: the message on stderr, exit code 3 (as trainscope's InputError).
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "trainscope/core/error.hpp"
#include "trainscope/data/tokenizer.hpp"

int main(int argc, char** argv) {
    if (argc != 3) {
        std::cerr << "usage: data_tokenize <tokenizer file> <texts.json>\n";
        return 2;
    }
    try {
        const auto tok = trainscope::data::load_tokenizer(argv[1]);
        std::ifstream in(argv[2]);
        const auto texts = nlohmann::json::parse(in);
        nlohmann::json out = {{"ids", nlohmann::json::array()},
                              {"decoded", nlohmann::json::array()}};
        for (const auto& t : texts) {
            const auto ids = tok->encode(t.get<std::string>());
            out["ids"].push_back(ids);
            out["decoded"].push_back(tok->decode(ids));
        }
        // Decoding a partial UTF-8 sequence is possible in general; replace rather than throw.
        std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } catch (const trainscope::core::Error& e) {
        std::cerr << e.what() << "\n";
        return e.exit_code();
    } catch (const std::exception& e) {
        std::cerr << argv[2] << ": " << e.what() << "\n";
        return 3;
    }
    return 0;
}
