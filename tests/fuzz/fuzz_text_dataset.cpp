// libFuzzer target: data::TextDataset reading a JSON or JSONL dataset in each of the six formats
// and tokenising it with a byte-level tiktoken tokenizer (every byte a token, a few merges).
// Input: byte 0 picks the format (bits 0-2), .jsonl or .json (bit 3) and train_on_input (bit 4);
// byte 1 is max_seq_len; the rest is the file. Accepted samples must be consistent.
#include <cstdint>
#include <memory>
#include <string>

#include "fuzz_input.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/data/text_dataset.hpp"
#include "trainscope/data/tokenizer.hpp"

using namespace trainscope;

namespace {

const data::Tokenizer& tokenizer() {
    static const std::unique_ptr<data::Tokenizer> tok = [] {
        static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        std::string ranks;
        for (int b = 0; b < 256; ++b) // one byte in base64: two symbols and "=="
            ranks += std::string{b64[b >> 2], b64[(b & 3) << 4]} + "== " + std::to_string(b) + "\n";
        // Merges "he" (aGU=), "ll" (bGw=), "  " (ICA=) so that pieces merge as well.
        ranks += "aGU= 256\nbGw= 257\nICA= 258\n";
        static fuzz::FuzzFile file("bytes.model");
        return data::load_tiktoken(file.write(ranks));
    }();
    return *tok;
}

void check_sample(const data::TokenizedSample& s, std::int64_t max_len) {
    fuzz::check(s.ids.size() == s.labels.size(), "ids and labels differ in length");
    fuzz::check(!s.ids.empty() && static_cast<std::int64_t>(s.ids.size()) <= max_len,
                "sample longer than max_seq_len or empty");
    for (std::size_t i = 0; i < s.ids.size(); ++i)
        fuzz::check(s.labels[i] == s.ids[i] || s.labels[i] == data::kIgnoreLabel,
                    "label neither the id nor ignored");
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static fuzz::FuzzFile jsonl("data.jsonl");
    static fuzz::FuzzFile json("data.json");
    if (size < 2) return 0;
    const data::TextFormat formats[] = {data::TextFormat::Instruct, data::TextFormat::Summarize,
                                        data::TextFormat::Grammar,  data::TextFormat::Chat,
                                        data::TextFormat::Text,     data::TextFormat::Preference};
    data::TextDatasetOptions o;
    o.format = formats[(data[0] & 7) % 6];
    const bool is_jsonl = (data[0] & 8) == 0;
    o.train_on_input = (data[0] & 16) != 0;
    o.max_seq_len = 1 + data[1];
    const std::string_view text(reinterpret_cast<const char*>(data) + 2, size - 2);
    o.path = is_jsonl ? jsonl.write(text) : json.write(text);
    std::unique_ptr<data::TextDataset> ds;
    try {
        ds = std::make_unique<data::TextDataset>(o, tokenizer());
    } catch (const core::InputError&) {
        return 0;
    }
    fuzz::check(ds->size() > 0, "a dataset without records was accepted");
    std::vector<const data::TokenizedSample*> samples;
    for (std::int64_t i = 0; i < ds->size(); ++i) {
        if (ds->is_preference()) {
            check_sample(ds->preference(i).chosen, o.max_seq_len);
            check_sample(ds->preference(i).rejected, o.max_seq_len);
        } else {
            check_sample(ds->sample(i), o.max_seq_len);
            samples.push_back(&ds->sample(i));
        }
    }
    for (const auto& p : data::pack_samples(samples, o.max_seq_len, /*pad_id=*/0))
        fuzz::check(static_cast<std::int64_t>(p.ids.size()) == o.max_seq_len, "pack not full");
    return 0;
}
