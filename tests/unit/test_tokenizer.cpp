// Tokenizers: a tiktoken file and a tokenizer.json written here with hand-chosen merges, so the
// expected ids are known; Llama-3's split pattern seen through them; round trips over Unicode;
// special-token ids; the chat format; errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>

#include "trainscope/core/error.hpp"
#include "trainscope/data/tokenizer.hpp"

namespace td = trainscope::data;
namespace fs = std::filesystem;

namespace {

// Merged tokens (rank 256 + index), in rank order.
const std::vector<std::string> kMerges = {"he", "ll", "llo", "  ", "12", "123", "34", "\n\n"};

std::string b64(const std::string& s) {
    static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    std::size_t i = 0;
    for (; i + 2 < s.size(); i += 3) {
        const unsigned v = (static_cast<unsigned char>(s[i]) << 16) |
                           (static_cast<unsigned char>(s[i + 1]) << 8) |
                           static_cast<unsigned char>(s[i + 2]);
        for (int k = 18; k >= 0; k -= 6)
            out += t[(v >> k) & 63];
    }
    if (i < s.size()) {
        unsigned v = static_cast<unsigned char>(s[i]) << 16;
        if (i + 1 < s.size()) v |= static_cast<unsigned char>(s[i + 1]) << 8;
        out += t[(v >> 18) & 63];
        out += t[(v >> 12) & 63];
        out += i + 1 < s.size() ? t[(v >> 6) & 63] : '=';
        out += '=';
    }
    return out;
}

fs::path dir() {
    static const fs::path d = [] {
        const fs::path p = fs::temp_directory_path() / "trainscope_tokenizer_test";
        fs::create_directories(p);
        return p;
    }();
    return d;
}

std::string tiktoken_file() {
    const fs::path p = dir() / "tok.model";
    std::ofstream out(p);
    for (int b = 0; b < 256; ++b)
        out << b64(std::string(1, static_cast<char>(b))) << " " << b << "\n";
    for (std::size_t i = 0; i < kMerges.size(); ++i)
        out << b64(kMerges[i]) << " " << 256 + i << "\n";
    return p.string();
}

// GPT-2's byte -> code point table, written out from its definition.
std::string byte_char(int b) {
    const bool direct = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    unsigned cp = static_cast<unsigned>(b);
    if (!direct) {
        unsigned n = 0;
        for (int k = 0; k < b; ++k)
            if (!((k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || (k >= 0xAE))) ++n;
        cp = 256 + n;
    }
    std::string s;
    if (cp < 0x80) {
        s += static_cast<char>(cp);
    } else {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
}

std::string mapped(const std::string& bytes) {
    std::string s;
    for (unsigned char c : bytes)
        s += byte_char(c);
    return s;
}

std::string hf_file() {
    const fs::path p = dir() / "tokenizer.json";
    std::ofstream out(p);
    auto q = [](const std::string& s) {
        std::string o = "\"";
        for (char c : s) {
            if (c == '"' || c == '\\') o += '\\';
            o += c;
        }
        return o + "\"";
    };
    out << R"({"version": "1.0", "added_tokens": [)";
    const char* specials[] = {"<|begin_of_text|>",         "<|end_of_text|>",
                              "<|finetune_right_pad_id|>", "<|start_header_id|>",
                              "<|end_header_id|>",         "<|eot_id|>"};
    const int ids[] = {300, 301, 304, 306, 307, 309};
    for (int i = 0; i < 6; ++i)
        out << (i ? "," : "") << R"({"id": )" << ids[i] << R"(, "content": ")" << specials[i]
            << R"(", "special": true})";
    out << R"(], "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split",
        "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
        "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false,
        "trim_offsets": true, "use_regex": false}]}, "model": {"type": "BPE", "vocab": {)";
    for (int b = 0; b < 256; ++b)
        out << (b ? "," : "") << q(byte_char(b)) << ": " << b;
    for (std::size_t i = 0; i < kMerges.size(); ++i)
        out << "," << q(mapped(kMerges[i])) << ": " << 256 + i;
    out << R"(}, "merges": [)";
    // The merges that build each token, in rank order: he, ll, ll+o, ' '+' ', 1+2, 12+3, 3+4,
    // \n+\n.
    const std::vector<std::pair<std::string, std::string>> m = {
        {"h", "e"}, {"l", "l"},  {"ll", "o"}, {" ", " "},
        {"1", "2"}, {"12", "3"}, {"3", "4"},  {"\n", "\n"}};
    for (std::size_t i = 0; i < m.size(); ++i)
        out << (i ? "," : "") << "[" << q(mapped(m[i].first)) << ", " << q(mapped(m[i].second))
            << "]";
    out << "]}}";
    return p.string();
}

std::vector<std::int64_t> bytes_of(const std::string& s) {
    std::vector<std::int64_t> v;
    for (unsigned char c : s)
        v.push_back(c);
    return v;
}

} // namespace

TEST(Tokenizer, TiktokenMergesByRankWithinLlama3Pieces) {
    const auto tok = td::load_tiktoken(tiktoken_file());
    EXPECT_EQ(tok->kind(), "tiktoken");
    // "hello": he (256), then ll (257), then ll+o (258) -> [he, llo].
    EXPECT_EQ(tok->encode("hello"), (std::vector<std::int64_t>{256, 258}));
    // " hello" is one piece (a leading non-letter joins the word): [' ', he, llo].
    EXPECT_EQ(tok->encode(" hello"), (std::vector<std::int64_t>{' ', 256, 258}));
    // Numbers split in groups of three: "12345" -> "123" + "45" (not 12 + 34 + 5).
    EXPECT_EQ(tok->encode("12345"), (std::vector<std::int64_t>{261, '4', '5'}));
    // Whitespace: "\n\n" is one piece; "  x" is " " + " x" (the run leaves its last space to the
    // word), so the two spaces are never merged into token 259.
    EXPECT_EQ(tok->encode("a\n\nb"), (std::vector<std::int64_t>{'a', 263, 'b'}));
    EXPECT_EQ(tok->encode("a  x"), (std::vector<std::int64_t>{'a', ' ', ' ', 'x'}));
    EXPECT_EQ(tok->encode("a  \n"), (std::vector<std::int64_t>{'a', 259, '\n'}));
    // Contractions are their own piece, case-insensitively.
    EXPECT_EQ(tok->encode("I'M"), (std::vector<std::int64_t>{'I', '\'', 'M'}));
    EXPECT_EQ(tok->encode(""), std::vector<std::int64_t>{});
}

TEST(Tokenizer, RoundTripsUnicodeAndWhitespace) {
    const auto tok = td::load_tiktoken(tiktoken_file());
    for (const std::string s :
         {"hello world", "Grüße aus Köln", "日本語のテキスト", "emoji 🚀🔥 ok",
          "tabs\tand\n\nlines  ", "  leading and trailing  ", "12345 678,9 -- !?", "mixed\r\nCRLF"})
        EXPECT_EQ(tok->decode(tok->encode(s)), s) << s;
}

TEST(Tokenizer, SpecialTokensFollowTheBaseVocabulary) {
    const auto tok = td::load_tiktoken(tiktoken_file());
    const std::int64_t n = 256 + static_cast<std::int64_t>(kMerges.size());
    const auto& s = tok->specials();
    EXPECT_EQ(s.bos, n);
    EXPECT_EQ(s.eos, n + 1);
    EXPECT_EQ(s.pad, n + 4);
    EXPECT_EQ(s.start_header, n + 6);
    EXPECT_EQ(s.end_header, n + 7);
    EXPECT_EQ(s.eot, n + 9);
    EXPECT_EQ(tok->special_id("<|python_tag|>").value(), n + 10);
    EXPECT_EQ(tok->special_id("<|reserved_special_token_2|>").value(), n + 11);
    EXPECT_EQ(tok->special_id("<|reserved_special_token_246|>").value(), n + 255);
    EXPECT_EQ(tok->vocab_size(), n + 256);
    EXPECT_EQ(tok->decode({s.bos, 'h', 'i', s.eot}), "<|begin_of_text|>hi<|eot_id|>");
    // Special-token text inside ordinary text is ordinary text.
    for (auto id : tok->encode("<|eot_id|>"))
        EXPECT_LT(id, n);
}

TEST(Tokenizer, Llama3ChatFormatAndMask) {
    const auto tok = td::load_tiktoken(tiktoken_file());
    const auto& s = tok->specials();
    const auto t =
        td::tokenize_messages(*tok, {{"user", " hi ", true}, {"assistant", "yo", false}});
    std::vector<std::int64_t> want = {s.bos, s.start_header};
    std::vector<bool> mask = {true, true};
    auto add = [&](const std::vector<std::int64_t>& ids, bool m) {
        for (auto id : ids) {
            want.push_back(id);
            mask.push_back(m);
        }
    };
    add(bytes_of("user"), true);
    add({s.end_header, 263}, true); // "\n\n" is token 263 in this vocabulary
    add(bytes_of("hi"), true);      // content stripped
    add({s.eot, s.start_header}, true);
    mask.back() = false; // the assistant header carries the assistant's mask
    add(bytes_of("assistant"), false);
    add({s.end_header, 263}, false);
    add(bytes_of("yo"), false);
    add({s.eot}, false);
    add({s.eos}, true); // EOS never trained on
    EXPECT_EQ(t.ids, want);
    EXPECT_EQ(t.mask, mask);
}

TEST(Tokenizer, HuggingFaceJsonGivesTheTiktokenIds) {
    const auto tt = td::load_tiktoken(tiktoken_file());
    const auto hf = td::load_tokenizer(hf_file()); // dispatch on .json
    EXPECT_EQ(hf->kind(), "hf-bpe");
    for (const std::string s : {"hello world", "he said 12345\n\nhello  there", "Grüße 🚀 hello"})
        EXPECT_EQ(hf->encode(s), tt->encode(s)) << s;
    EXPECT_EQ(hf->decode(hf->encode("Grüße hello")), "Grüße hello");
    EXPECT_EQ(hf->specials().eot, 309);
    EXPECT_EQ(hf->specials().pad, 304);
    EXPECT_EQ(hf->vocab_size(), 310);
}

TEST(Tokenizer, BadFilesAreNamed) {
    const fs::path bad = dir() / "bad.model";
    std::ofstream(bad) << "aGk= 0\n!!notbase64 1\n";
    try {
        td::load_tiktoken(bad.string());
        FAIL();
    } catch (const trainscope::core::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
    }
    EXPECT_THROW(td::load_tokenizer((dir() / "missing.model").string()),
                 trainscope::core::InputError);
    const fs::path wp = dir() / "wordpiece.json";
    std::ofstream(wp) << R"({"model": {"type": "WordPiece", "vocab": {}}})";
    try {
        td::load_tokenizer(wp.string());
        FAIL();
    } catch (const trainscope::core::InputError& e) {
        EXPECT_NE(std::string(e.what()).find("WordPiece"), std::string::npos) << e.what();
    }
}

namespace {

// A tiktoken file of the 256 bytes followed by `tokens` (ranks 256...).
std::string write_tiktoken(const std::string& name, const std::vector<std::string>& tokens) {
    const fs::path p = dir() / name;
    std::ofstream out(p);
    for (int b = 0; b < 256; ++b)
        out << b64(std::string(1, static_cast<char>(b))) << " " << b << "\n";
    for (std::size_t i = 0; i < tokens.size(); ++i)
        out << b64(tokens[i]) << " " << 256 + i << "\n";
    return p.string();
}

std::string json_string(const std::string& s) {
    std::string o = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\';
        o += c;
    }
    return o + "\"";
}

// A GPT-2-style tokenizer.json: byte-level with GPT-2's regex, the 256 bytes then `merges`
// (pairs of byte strings; token 256 + i is merges[i].first + merges[i].second). `model_extra` and
// `top_extra` are spliced into the "model" and top-level objects.
std::string write_hf(const std::string& name,
                     const std::vector<std::pair<std::string, std::string>>& merges,
                     const std::string& model_extra = "", const std::string& top_extra = "",
                     const std::string& pre_tokenizer =
                         R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})") {
    const fs::path p = dir() / name;
    std::ofstream out(p);
    out << "{" << top_extra << R"("pre_tokenizer": )" << pre_tokenizer
        << R"(, "model": {"type": "BPE", )" << model_extra << R"("vocab": {)";
    for (int b = 0; b < 256; ++b)
        out << (b ? "," : "") << json_string(byte_char(b)) << ": " << b;
    for (std::size_t i = 0; i < merges.size(); ++i)
        out << "," << json_string(mapped(merges[i].first + merges[i].second)) << ": " << 256 + i;
    out << R"(}, "merges": [)";
    for (std::size_t i = 0; i < merges.size(); ++i)
        out << (i ? "," : "")
            << json_string(mapped(merges[i].first) + " " + mapped(merges[i].second));
    out << "]}}";
    return p.string();
}

// Reference BPE written from the definition: rescan all adjacent pairs, merge the lowest-ranked
// (leftmost on ties), until no pair merges. `rank_of(a, b)` is -1 for "no merge".
template <class RankOf>
std::vector<std::string> naive_bpe(const std::string& piece, RankOf rank_of) {
    std::vector<std::string> parts;
    for (char c : piece)
        parts.emplace_back(1, c);
    for (;;) {
        std::int64_t best = -1;
        std::size_t at = 0;
        for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
            const std::int64_t r = rank_of(parts[i], parts[i + 1]);
            if (r >= 0 && (best < 0 || r < best)) best = r, at = i;
        }
        if (best < 0) return parts;
        parts[at] += parts[at + 1];
        parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
}

// Random merges over the letters a, b, c: each joins two earlier tokens (bytes or merges).
std::vector<std::pair<std::string, std::string>> random_merges(std::uint32_t seed, int count) {
    std::vector<std::string> tokens = {"a", "b", "c"};
    std::vector<std::pair<std::string, std::string>> merges;
    std::uint32_t x = seed;
    auto next = [&] { return x = x * 1664525u + 1013904223u, (x >> 8); };
    while (static_cast<int>(merges.size()) < count) {
        const std::string& l = tokens[next() % tokens.size()];
        const std::string& r = tokens[next() % tokens.size()];
        const std::string t = l + r;
        if (t.size() > 6 || std::find(tokens.begin(), tokens.end(), t) != tokens.end()) continue;
        merges.emplace_back(l, r);
        tokens.push_back(t);
    }
    return merges;
}

std::string random_word(std::uint32_t& x, std::size_t n) {
    std::string s;
    for (std::size_t i = 0; i < n; ++i) {
        x = x * 1103515245u + 12345u;
        s += "abc"[(x >> 16) % 3];
    }
    return s;
}

} // namespace

// Both tokenizers against the from-the-definition reference on random single-piece words: tiktoken
// (any two adjacent tokens whose concatenation is a token merge, by that token's rank; a piece that
// is a token is taken whole) and HF (only the listed pairs merge, by list position).
TEST(Tokenizer, MergesMatchANaiveReferenceOnRandomWords) {
    const auto merges = random_merges(7, 60);
    std::vector<std::string> tokens;
    std::map<std::string, std::int64_t> tt_rank, hf_id;
    std::map<std::pair<std::string, std::string>, std::int64_t> hf_rank;
    for (int b = 0; b < 256; ++b)
        hf_id[std::string(1, static_cast<char>(b))] = b;
    for (std::size_t i = 0; i < merges.size(); ++i) {
        const std::string t = merges[i].first + merges[i].second;
        tokens.push_back(t);
        tt_rank[t] = hf_id[t] = 256 + static_cast<std::int64_t>(i);
        hf_rank[merges[i]] = static_cast<std::int64_t>(i);
    }
    const auto tt = td::load_tiktoken(write_tiktoken("random.model", tokens));
    const auto hf = td::load_hf_tokenizer(write_hf("random.json", merges));
    std::uint32_t x = 11;
    for (int k = 0; k < 300; ++k) {
        const std::string w = random_word(x, k < 297 ? 1 + k % 40 : 2000);
        std::vector<std::int64_t> want_tt, want_hf;
        if (tt_rank.count(w)) {
            want_tt = {tt_rank[w]};
        } else {
            for (const auto& p : naive_bpe(w, [&](const std::string&a, const std::string&b) {
                     auto it = tt_rank.find(a + b);
                     return it == tt_rank.end() ? std::int64_t{-1} : it->second;
                 }))
                want_tt.push_back(p.size() == 1 ? static_cast<unsigned char>(p[0]) : tt_rank[p]);
        }
        for (const auto& p : naive_bpe(w, [&](const std::string&a, const std::string&b) {
                 auto it = hf_rank.find({a, b});
                 return it == hf_rank.end() ? std::int64_t{-1} : it->second;
             }))
            want_hf.push_back(hf_id.at(p));
        ASSERT_EQ(tt->encode(w), want_tt) << w;
        ASSERT_EQ(hf->encode(w), want_hf) << w;
    }
}

// Equal ranks merge the leftmost pair first: "   " (one trailing-whitespace piece) with the
// merge "  " gives ["  ", " "], not [" ", "  "].
TEST(Tokenizer, EqualRanksMergeLeftmostFirst) {
    const auto tok = td::load_tiktoken(tiktoken_file());
    EXPECT_EQ(tok->encode("x   "), (std::vector<std::int64_t>{'x', 259, ' '}));
    EXPECT_EQ(tok->encode("\n\n\n"), (std::vector<std::int64_t>{263, '\n'}));
}

// A run without split points (a base64 blob, a line of '=') must not take quadratic time: 200,000
// bytes in one piece. Rescanning all pairs after each merge needed minutes here.
TEST(Tokenizer, LongRunsEncodeInLinearithmicTime) {
    const auto tok = td::load_tiktoken(write_tiktoken("runs.model", {"==", "====", "aa", "aaaa"}));
    const auto t0 = std::chrono::steady_clock::now();
    const std::string eq(200000, '='), letters(200001, 'a');
    const auto a = tok->encode(eq), b = tok->encode(letters);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
    // Pairs merge leftmost first, so the runs become "====" tokens (257, 259) plus a tail "a".
    EXPECT_EQ(a, std::vector<std::int64_t>(50000, 257));
    std::vector<std::int64_t> want(50000, 259);
    want.push_back('a');
    EXPECT_EQ(b, want);
}

// ignore_merges (Llama-3's tokenizer.json sets it) takes a piece that is in the vocabulary whole;
// without it only the merges decide. Merges: b+c (256), a+b (257), ab+c (258): "abc" merges b+c
// first and then cannot reach "abc". tiktoken always takes a whole-token piece.
TEST(Tokenizer, HuggingFaceIgnoreMerges) {
    const std::vector<std::pair<std::string, std::string>> m = {
        {"b", "c"}, {"a", "b"}, {"ab", "c"}};
    const auto plain = td::load_hf_tokenizer(write_hf("merges.json", m));
    const auto whole =
        td::load_hf_tokenizer(write_hf("ignore.json", m, R"("ignore_merges": true, )"));
    EXPECT_EQ(plain->encode("abc"), (std::vector<std::int64_t>{'a', 256}));
    EXPECT_EQ(whole->encode("abc"), (std::vector<std::int64_t>{258}));
    EXPECT_EQ(plain->decode({'a', 256}), "abc");
    const auto tt = td::load_tiktoken(write_tiktoken("abc.model", {"bc", "ab", "abc"}));
    EXPECT_EQ(tt->encode("abc"), (std::vector<std::int64_t>{258}));
    // GPT-2's pattern (ByteLevel use_regex): " abc" is one piece, "'s" splits off.
    EXPECT_EQ(plain->encode("x's abc"), (std::vector<std::int64_t>{'x', '\'', 's', ' ', 'a', 256}));
}

// Features that would change the ids are refused with the key named, not ignored.
TEST(Tokenizer, UnsupportedTokenizerJsonFeaturesAreNamed) {
    auto message = [](const std::string& path) {
        try {
            td::load_hf_tokenizer(path);
        } catch (const trainscope::core::InputError& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    const std::vector<std::pair<std::string, std::string>> m = {{"a", "b"}};
    EXPECT_NE(
        message(write_hf("n.json", m, "", R"("normalizer": {"type": "NFC"}, )")).find("normalizer"),
        std::string::npos);
    EXPECT_NE(message(write_hf("f.json", m, R"("byte_fallback": true, )")).find("byte_fallback"),
              std::string::npos);
    EXPECT_NE(message(write_hf("d.json", m, R"("dropout": 0.1, )")).find("dropout"),
              std::string::npos);
    EXPECT_NE(message(write_hf("i.json", m, "", "",
                               R"({"type": "Sequence", "pretokenizers": [{"type": "Split",
                               "pattern": {"Regex": "\\s+"}, "behavior": "Isolated",
                               "invert": true}, {"type": "ByteLevel", "use_regex": false}]})"))
                  .find("invert"),
              std::string::npos);
    EXPECT_NE(message(write_hf("m.json", m, "", "", R"({"type": "Metaspace"})")).find("Metaspace"),
              std::string::npos);
    EXPECT_NE(message(write_hf("s.json", m, "", "", R"({"type": "Split", "pattern": {"Regex":
                               "\\s+"}, "behavior": "Isolated", "invert": false})"))
                  .find("ByteLevel"),
              std::string::npos);
    EXPECT_NE(message(write_hf("x.json", {{"a", "b"}, {"ab", "zz"}})).find("merges[1]"),
              std::string::npos);
}

TEST(Tokenizer, TiktokenRanksMustBeDenseAndUnique) {
    auto message = [](const std::string& text) {
        const fs::path p = dir() / "ranks.model";
        std::ofstream out(p);
        for (int b = 0; b < 256; ++b)
            out << b64(std::string(1, static_cast<char>(b))) << " " << b << "\n";
        out << text;
        out.close();
        try {
            td::load_tiktoken(p.string());
        } catch (const trainscope::core::InputError& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    // A gap would give a special token the id of a base token.
    EXPECT_NE(message(b64("ab") + " 300\n").find("without gaps"), std::string::npos);
    EXPECT_NE(message(b64("ab") + " 256\n" + b64("cd") + " 256\n").find("line 258"),
              std::string::npos);
    EXPECT_EQ(message(b64("ab") + " 256\n"), "no error");
}

// Role and content are stripped like Python's str.strip() in torchtune: Unicode spaces (NBSP,
// ideographic space, line separator) as well as ASCII ones; other characters stay.
TEST(Tokenizer, ChatStripsUnicodeWhitespaceLikePython) {
    const auto tok = td::load_tiktoken(tiktoken_file());
    const auto& s = tok->specials();
    const auto t = td::tokenize_messages(
        *tok, {{" user\t", "\xC2\xA0\xE3\x80\x80 yo\xC2\xA0x \xE2\x80\xA8\x1F", false}}, false,
        false);
    std::vector<std::int64_t> want = {s.start_header};
    for (auto id : bytes_of("user"))
        want.push_back(id);
    want.insert(want.end(), {s.end_header, 263});
    for (auto id : tok->encode("yo\xC2\xA0x")) // the inner NBSP stays
        want.push_back(id);
    want.push_back(s.eot);
    EXPECT_EQ(t.ids, want);
    EXPECT_EQ(td::tokenize_messages(*tok, {{"user", "\xC2\xA0\xE3\x80\x80", false}}, false, false)
                  .ids.size(),
              bytes_of("user").size() + 4); // header, "\n\n", eot: no content tokens
}
