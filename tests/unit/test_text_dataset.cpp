// Text datasets: each format's ids and labels against expectations built here (a byte-level
// tokenizer without merges, so ids are the bytes), masking, truncation, errors naming file, line
// and field; collation, packing and preference batches.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "trainscope/core/error.hpp"
#include "trainscope/data/text_batch.hpp"
#include "trainscope/data/tokenizer.hpp"

namespace td = trainscope::data;
namespace fs = std::filesystem;

namespace {

fs::path dir() {
    static const fs::path d = [] {
        const fs::path p = fs::temp_directory_path() / "trainscope_text_dataset_test";
        fs::create_directories(p);
        return p;
    }();
    return d;
}

const td::Tokenizer& bytes_tokenizer() {
    static const auto tok = [] {
        const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        const fs::path p = dir() / "bytes.model";
        std::ofstream out(p);
        for (int b = 0; b < 256; ++b)
            out << t[b >> 2] << t[(b & 3) << 4] << "== " << b << "\n";
        out.close();
        return td::load_tiktoken(p.string());
    }();
    return *tok;
}

std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir() / name;
    std::ofstream(p) << text;
    return p.string();
}

td::TextDataset load(const std::string& file, td::TextFormat f, std::int64_t max_len = 4096,
                     bool train_on_input = false) {
    td::TextDatasetOptions o;
    o.path = file;
    o.format = f;
    o.max_seq_len = max_len;
    o.train_on_input = train_on_input;
    return td::TextDataset(o, bytes_tokenizer());
}

std::vector<std::int64_t> labels_of(const td::TokenizedText& t) {
    std::vector<std::int64_t> l;
    for (std::size_t i = 0; i < t.ids.size(); ++i)
        l.push_back(t.mask[i] ? -100 : t.ids[i]);
    return l;
}

td::TokenizedText chat(const std::string& prompt, const std::string& response, bool masked) {
    return td::tokenize_messages(bytes_tokenizer(),
                                 {{"user", prompt, masked}, {"assistant", response, false}});
}

std::string error_of(const std::string& file, td::TextFormat f) {
    try {
        load(file, f);
    } catch (const trainscope::core::InputError& e) {
        return e.what();
    }
    return "";
}

} // namespace

TEST(TextDataset, InstructUsesAlpacasTwoTemplatesAndMasksThePrompt) {
    const auto f =
        write("alpaca.jsonl", R"({"instruction": "Add 2 and 3.", "input": "", "output": "5"})"
                              "\n"
                              R"({"instruction": "Sort.", "input": "b, a", "output": "a, b"})"
                              "\n");
    const auto ds = load(f, td::TextFormat::Instruct);
    ASSERT_EQ(ds.size(), 2);
    const std::string p0 = "Below is an instruction that describes a task. Write a response that "
                           "appropriately completes the request.\n\n### Instruction:\nAdd 2 and "
                           "3.\n\n### Response:\n";
    const std::string p1 = "Below is an instruction that describes a task, paired with an input "
                           "that provides further context. Write a response that appropriately "
                           "completes the request.\n\n### Instruction:\nSort.\n\n### Input:\nb, "
                           "a\n\n### Response:\n";
    const auto t0 = chat(p0, "5", true), t1 = chat(p1, "a, b", true);
    EXPECT_EQ(ds.sample(0).ids, t0.ids);
    EXPECT_EQ(ds.sample(0).labels, labels_of(t0));
    EXPECT_EQ(ds.sample(1).ids, t1.ids);
    // Trained tokens: the assistant turn only (header, "\n\n", content, eot).
    std::int64_t n = 0;
    for (auto l : ds.sample(1).labels)
        n += l != -100;
    EXPECT_EQ(n, 1 + 9 + 1 + 2 + 4 + 1);
    // train_on_input: everything but BOS and EOS.
    const auto all = load(f, td::TextFormat::Instruct, 4096, true);
    n = 0;
    for (auto l : all.sample(1).labels)
        n += l != -100;
    EXPECT_EQ(n, static_cast<std::int64_t>(all.sample(1).ids.size()) - 2);
}

TEST(TextDataset, SummarizeGrammarTextAndTruncation) {
    const auto s = load(write("s.jsonl", R"({"dialogue": "A: hi\nB: yo", "summary": "greeting"})"),
                        td::TextFormat::Summarize);
    EXPECT_EQ(
        s.sample(0).ids,
        chat("Summarize this dialogue:\nA: hi\nB: yo\n---\nSummary:\n", "greeting", true).ids);
    const auto g = load(write("g.jsonl", R"({"input": "he go", "output": "He goes."})"),
                        td::TextFormat::Grammar);
    EXPECT_EQ(
        g.sample(0).ids,
        chat("Correct this to standard English: he go\n---\nCorrected: ", "He goes.", true).ids);
    const auto& sp = bytes_tokenizer().specials();
    const auto t = load(write("t.jsonl", R"({"text": "abc"})"), td::TextFormat::Text);
    EXPECT_EQ(t.sample(0).ids, (std::vector<std::int64_t>{sp.bos, 'a', 'b', 'c', sp.eos}));
    EXPECT_EQ(t.sample(0).labels, t.sample(0).ids); // completion: every token trained
    // Truncation: cut to max_seq_len, the last kept token becomes EOS (masked).
    const auto cut = load(write("long.jsonl", R"({"instruction": "x", "output": "yyyyyyyyyyyy"})"),
                          td::TextFormat::Instruct, 20);
    ASSERT_EQ(cut.sample(0).ids.size(), 20u);
    EXPECT_EQ(cut.sample(0).ids.back(), sp.eos);
    EXPECT_EQ(cut.sample(0).labels.back(), -100);
    EXPECT_EQ(cut.truncated(), 1);
}

TEST(TextDataset, OpenAiAndShareGptChatsAgree) {
    const auto a =
        load(write("chat.jsonl", R"({"messages": [{"role": "system", "content": "Be brief."}, )"
                                 R"({"role": "user", "content": "Hi?"}, )"
                                 R"({"role": "assistant", "content": "Hello."}]})"),
             td::TextFormat::Chat);
    const auto b =
        load(write("sg.json", R"([{"conversations": [{"from": "system", "value": "Be brief."},
                                                      {"from": "human", "value": "Hi?"},
                                                      {"from": "gpt", "value": "Hello."}]}])"),
             td::TextFormat::Chat);
    EXPECT_EQ(a.sample(0).ids, b.sample(0).ids);
    EXPECT_EQ(a.sample(0).labels, b.sample(0).labels);
    const auto want = td::tokenize_messages(
        bytes_tokenizer(),
        {{"system", "Be brief.", true}, {"user", "Hi?", true}, {"assistant", "Hello.", false}});
    EXPECT_EQ(a.sample(0).labels, labels_of(want));
}

TEST(TextDataset, ErrorsNameFileLineAndField) {
    auto expect = [](const std::string& file, td::TextFormat f,
                     const std::vector<std::string>& needles) {
        const std::string msg = error_of(file, f);
        ASSERT_FALSE(msg.empty()) << file;
        EXPECT_NE(msg.find(file), std::string::npos) << msg;
        for (const auto& n : needles)
            EXPECT_NE(msg.find(n), std::string::npos) << msg;
    };
    expect(write("e1.jsonl",
                 "{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \"a\"}\n"),
           td::TextFormat::Instruct, {"line 2", "\"output\""});
    expect(write("e2.jsonl", "{\"text\": \"a\"}\n{\"text\": \n"), td::TextFormat::Text,
           {"line 2", "not valid JSON"});
    expect(write("e3.jsonl", "{\"text\": 5}\n"), td::TextFormat::Text, {"line 1", "not a string"});
    expect(write("e4.jsonl", "\n\n"), td::TextFormat::Text, {"no records"});
    expect(write("e5.json", R"([{"messages": [{"role": "robot", "content": "x"}]}])"),
           td::TextFormat::Chat, {"element 0", "robot"});
    expect(write("e6.jsonl", R"({"prompt": "p", "chosen": "c"})"), td::TextFormat::Preference,
           {"line 1", "\"rejected\""});
}

TEST(TextDataset, CollatePadsRightAndCountsShiftedLabels) {
    td::TokenizedSample a{{1, 2, 3, 4}, {-100, -100, 3, 4}}, b{{5, 6}, {5, 6}};
    const td::TextBatch batch = td::collate_samples({&a, &b}, 99);
    EXPECT_TRUE(torch::equal(batch.input_ids, torch::tensor({{1, 2, 3, 4}, {5, 6, 99, 99}})));
    EXPECT_TRUE(
        torch::equal(batch.labels, torch::tensor({{-100, -100, 3, 4}, {5, 6, -100, -100}})));
    EXPECT_EQ(batch.tokens, 6);
    EXPECT_EQ(batch.padded_tokens, 2);
    EXPECT_EQ(batch.label_tokens, 3); // labels[:, 1:]: 3, 4 and 6
    EXPECT_EQ(batch.max_len, 4);
    EXPECT_EQ(batch.min_len, 2);
    EXPECT_FALSE(batch.segment_ids.defined());

    td::PreferenceSample p{{{1, 2}, {-100, 2}}, {{3, 4, 5}, {-100, 4, 5}}};
    td::PreferenceSample q{{{6}, {6}}, {{7, 8}, {-100, 8}}};
    const td::TextBatch pb = td::collate_preference({&p, &q}, 0);
    // Chosen of every pair first, then the rejected ones, padded together.
    EXPECT_TRUE(
        torch::equal(pb.input_ids, torch::tensor({{1, 2, 0}, {6, 0, 0}, {3, 4, 5}, {7, 8, 0}})));
}

TEST(TextDataset, PackingRestartsPositionsAndSeparatesSegments) {
    td::TokenizedSample a{{1, 2, 3}, {1, 2, 3}}, b{{4, 5}, {-100, 5}},
        c{{6, 7, 8, 9}, {6, 7, 8, 9}};
    const auto packs = td::pack_samples({&a, &b, &c}, 6, 0);
    ASSERT_EQ(packs.size(), 2u); // a + b fill 5 of 6; c does not fit and starts the next pack
    EXPECT_EQ(packs[0].ids, (std::vector<std::int64_t>{1, 2, 3, 4, 5, 0}));
    EXPECT_EQ(packs[0].labels, (std::vector<std::int64_t>{1, 2, 3, -100, 5, -100}));
    EXPECT_EQ(packs[0].positions, (std::vector<std::int64_t>{0, 1, 2, 0, 1, 0}));
    EXPECT_EQ(packs[0].segments, (std::vector<std::int64_t>{0, 0, 0, 1, 1, 2}));
    EXPECT_EQ(packs[0].length, 5);
    EXPECT_EQ(packs[1].ids, (std::vector<std::int64_t>{6, 7, 8, 9, 0, 0}));
    const td::TextBatch batch = td::collate_packed({&packs[0], &packs[1]}, 0);
    EXPECT_TRUE(torch::equal(batch.position_ids[0], torch::tensor({0, 1, 2, 0, 1, 0})));
    EXPECT_TRUE(torch::equal(batch.segment_ids[1], torch::tensor({0, 0, 0, 0, 1, 1})));
    EXPECT_EQ(batch.tokens, 9);
    EXPECT_EQ(batch.padded_tokens, 3);
    // A sample longer than a pack is cut to it.
    td::TokenizedSample big{{1, 2, 3, 4, 5, 6, 7, 8}, {1, 2, 3, 4, 5, 6, 7, 8}};
    const auto one = td::pack_samples({&big}, 6, 0);
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(one[0].length, 6);
}
