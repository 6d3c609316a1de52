// Byte-level BPE tokenizers: Llama-3's tiktoken file and Hugging Face tokenizer.json. The split
// pattern runs on PCRE2 (UTF + Unicode properties, invalid UTF-8 tolerated, JIT when available);
// each piece is then merged pairwise by rank (tiktoken) or merge priority (HF) and mapped to ids.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "trainscope/data/tokenizer.hpp"

#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "trainscope/core/error.hpp"
#include "trainscope/core/text.hpp"

namespace trainscope::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Llama-3 (tiktoken cl100k-style) and GPT-2 split patterns.
const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The compiled split pattern.
class Splitter {
  public:
    Splitter(const std::string& pattern, const std::string& origin) {
        int err = 0;
        PCRE2_SIZE offset = 0;
        code_ =
            pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
        if (!code_) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            throw core::InputError(origin + ": the split pattern does not compile at offset " +
                                   std::to_string(offset) + ": " +
                                   reinterpret_cast<const char*>(msg));
        }
        pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE); // optional: falls back to the interpreter
    }
    ~Splitter() { pcre2_code_free(code_); }
    Splitter(const Splitter&) = delete;
    Splitter& operator=(const Splitter&) = delete;

    // Calls fn(piece) for every match, in order. Text between matches (none for these patterns,
    // whose last alternatives take any whitespace) is passed through as a piece as well.
    // Match data is per call, so that encode may run on several threads at once.
    template <class Fn> void split(std::string_view text, Fn&& fn) const {
        std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
            pcre2_match_data_create_from_pattern(code_, nullptr), &pcre2_match_data_free);
        pcre2_match_data* data = md.get();
        PCRE2_SIZE pos = 0;
        const auto* s = reinterpret_cast<PCRE2_SPTR>(text.data());
        while (pos < text.size()) {
            const int rc = pcre2_match(code_, s, text.size(), pos, 0, data, nullptr);
            if (rc < 0) { // no further match (e.g. invalid UTF-8 tail): keep the rest as bytes
                fn(text.substr(pos));
                return;
            }
            const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data);
            if (ov[0] > pos) fn(text.substr(pos, ov[0] - pos));
            if (ov[1] == ov[0]) { // empty match: step one byte to make progress
                fn(text.substr(ov[0], 1));
                pos = ov[0] + 1;
                continue;
            }
            fn(text.substr(ov[0], ov[1] - ov[0]));
            pos = ov[1];
        }
    }

  private:
    pcre2_code* code_ = nullptr;
};

constexpr std::int64_t kNoRank = std::numeric_limits<std::int64_t>::max();

// Byte-pair merging of one piece of n bytes, as tiktoken and HF's BPE model do: repeatedly merge
// the adjacent pair of parts with the lowest rank, the leftmost one on ties. Parts are byte ranges
// of the piece kept in a linked list; candidate pairs wait in a min-heap keyed (rank, start) and
// are dropped when popped if either part has changed since. This is O(n log n): rescanning all
// pairs after every merge is quadratic, and one long run without split points (a base64 blob, a
// line of 20,000 '=') then takes seconds to minutes.
// rank(begin, mid, end): rank of merging [begin, mid) with [mid, end), or kNoRank.
// merged(begin, mid, end): told of each merge, in order. Returns the start offsets of the final
// parts (each part ends where the next starts; the last at n).
class BytePairMerger {
  public:
    template <class Rank, class Merged>
    const std::vector<std::size_t>& run(std::size_t n, Rank&& rank, Merged&& merged) {
        next_.resize(n);
        prev_.resize(n);
        alive_.assign(n, 1);
        heap_.clear();
        for (std::size_t i = 0; i < n; ++i) {
            next_[i] = i + 1;
            prev_[i] = i == 0 ? kNone : i - 1;
        }
        auto push = [&](std::size_t b) {
            const std::size_t m = next_[b];
            if (m >= n) return;
            const std::int64_t r = rank(b, m, next_[m]);
            if (r == kNoRank) return;
            heap_.push_back({r, b, next_[m]});
            std::push_heap(heap_.begin(), heap_.end(), later);
        };
        for (std::size_t i = 0; i + 1 < n; ++i)
            push(i);
        while (!heap_.empty()) {
            std::pop_heap(heap_.begin(), heap_.end(), later);
            const Candidate c = heap_.back();
            heap_.pop_back();
            // Parts only grow, so the pair is unchanged iff the left part still starts at `begin`
            // and the part after it still ends at `end`.
            if (!alive_[c.begin]) continue;
            const std::size_t m = next_[c.begin];
            if (m >= n || next_[m] != c.end) continue;
            merged(c.begin, m, c.end);
            alive_[m] = 0;
            next_[c.begin] = c.end;
            if (c.end < n) prev_[c.end] = c.begin;
            if (prev_[c.begin] != kNone) push(prev_[c.begin]);
            push(c.begin);
        }
        starts_.clear();
        for (std::size_t i = 0; i < n; i = next_[i])
            starts_.push_back(i);
        return starts_;
    }

  private:
    struct Candidate {
        std::int64_t rank;
        std::size_t begin, end;
    };
    // Heap order: the lowest rank first, then the leftmost.
    static bool later(const Candidate& a, const Candidate& b) {
        return a.rank != b.rank ? a.rank > b.rank : a.begin > b.begin;
    }
    static constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
    std::vector<std::size_t> next_, prev_, starts_;
    std::vector<char> alive_;
    std::vector<Candidate> heap_;
};

// Hash for string-keyed maps looked up with string_views of the text (no key copies).
struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using ByteMap = std::unordered_map<std::string, std::int64_t, StringHash, std::equal_to<>>;

int base64_value(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

bool base64_decode(const std::string& in, std::string& out) {
    out.clear();
    int bits = 0, acc = 0;
    std::size_t i = 0;
    for (; i < in.size() && in[i] != '='; ++i) {
        const int v = base64_value(in[i]);
        if (v < 0) return false;
        acc = (acc << 6) | v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out.push_back(static_cast<char>((acc >> bits) & 0xff));
        }
    }
    for (; i < in.size(); ++i)
        if (in[i] != '=') return false;
    return !out.empty();
}

// Llama-3's 256 special tokens in id order (from num_base_tokens).
std::vector<std::string> llama3_specials() {
    std::vector<std::string> s = {"<|begin_of_text|>",
                                  "<|end_of_text|>",
                                  "<|reserved_special_token_0|>",
                                  "<|reserved_special_token_1|>",
                                  "<|finetune_right_pad_id|>",
                                  "<|step_id|>",
                                  "<|start_header_id|>",
                                  "<|end_header_id|>",
                                  "<|eom_id|>",
                                  "<|eot_id|>",
                                  "<|python_tag|>"};
    for (int i = 2; s.size() < 256; ++i)
        s.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
    return s;
}

struct SpecialTable {
    std::unordered_map<std::string, std::int64_t> by_text;
    std::unordered_map<std::int64_t, std::string> by_id;
    void add(const std::string& text, std::int64_t id) {
        by_text[text] = id;
        by_id[id] = text;
    }
    SpecialTokens resolve() const {
        auto get = [&](const char* t) {
            auto it = by_text.find(t);
            return it == by_text.end() ? std::int64_t{-1} : it->second;
        };
        SpecialTokens s;
        s.bos = get("<|begin_of_text|>");
        s.eos = get("<|end_of_text|>");
        s.pad = get("<|finetune_right_pad_id|>");
        s.start_header = get("<|start_header_id|>");
        s.end_header = get("<|end_header_id|>");
        s.eot = get("<|eot_id|>");
        return s;
    }
};

// ---- tiktoken -----------------------------------------------------------------------------------

class TiktokenTokenizer final : public Tokenizer {
  public:
    explicit TiktokenTokenizer(const std::string& path) : splitter_(kLlama3Pattern, path) {
        std::ifstream in(path);
        if (!in) throw core::InputError("cannot read tokenizer file '" + path + "'");
        std::string line, bytes;
        std::int64_t lineno = 0;
        while (std::getline(in, line)) {
            ++lineno;
            if (!line.empty() && line.back() == '\r') line.pop_back();
            if (line.empty()) continue;
            std::istringstream f(line);
            std::string b64;
            long long rank = -1;
            if (!(f >> b64 >> rank) || rank < 0 || !base64_decode(b64, bytes))
                throw core::InputError("tokenizer file '" + path + "' line " +
                                       std::to_string(lineno) +
                                       ": expected '<base64 token> <rank>' (a tiktoken file such "
                                       "as Llama-3's original/tokenizer.model)");
            if (!encoder_.emplace(bytes, rank).second)
                throw core::InputError("tokenizer file '" + path + "' line " +
                                       std::to_string(lineno) + ": token listed twice");
            if (!decoder_.emplace(rank, bytes).second)
                throw core::InputError("tokenizer file '" + path + "' line " +
                                       std::to_string(lineno) + ": rank " + std::to_string(rank) +
                                       " listed twice");
        }
        if (in.bad()) // a read error ends getline like the end of the file does
            throw core::InputError("cannot read tokenizer file '" + path + "' after line " +
                                   std::to_string(lineno) + ": " + std::strerror(errno));
        if (encoder_.empty()) throw core::InputError("tokenizer file '" + path + "' is empty");
        // The specials take ids N..N+255 after the N base tokens: a gap in the ranks would give a
        // special the id of a base token.
        std::int64_t max_rank = 0;
        for (const auto& [rank, bytes] : decoder_)
            max_rank = std::max(max_rank, rank);
        if (max_rank != static_cast<std::int64_t>(decoder_.size()) - 1) // no overflow at 2^63-1
            throw core::InputError("tokenizer file '" + path + "' has " +
                                   std::to_string(decoder_.size()) + " tokens but ranks up to " +
                                   std::to_string(max_rank) +
                                   ": ranks must be 0..N-1 without gaps (the 256 special tokens "
                                   "take the ids after them)");
        for (int b = 0; b < 256; ++b)
            if (!encoder_.count(std::string(1, static_cast<char>(b))))
                throw core::InputError("tokenizer file '" + path + "' lacks the single byte " +
                                       std::to_string(b) +
                                       ": a byte-level BPE vocabulary needs all 256");
        num_base_ = static_cast<std::int64_t>(encoder_.size());
        const auto names = llama3_specials();
        for (std::size_t k = 0; k < names.size(); ++k)
            specials_table_.add(names[k], num_base_ + static_cast<std::int64_t>(k));
        specials_ = specials_table_.resolve();
    }

    std::vector<std::int64_t> encode(std::string_view text) const override {
        std::vector<std::int64_t> out;
        BytePairMerger bpe;
        splitter_.split(text, [&](std::string_view piece) {
            // A piece that is itself a token needs no merging (tiktoken does the same; most words
            // of a large vocabulary take this path).
            if (auto whole = encoder_.find(piece); whole != encoder_.end()) {
                out.push_back(whole->second);
                return;
            }
            auto rank = [&](std::size_t b, std::size_t, std::size_t e) {
                auto it = encoder_.find(piece.substr(b, e - b));
                return it == encoder_.end() ? kNoRank : it->second;
            };
            const auto& starts = bpe.run(piece.size(), rank, [](auto...) {});
            for (std::size_t i = 0; i < starts.size(); ++i) {
                const std::size_t end = i + 1 < starts.size() ? starts[i + 1] : piece.size();
                out.push_back(encoder_.find(piece.substr(starts[i], end - starts[i]))->second);
            }
        });
        return out;
    }

    std::string decode(const std::vector<std::int64_t>& ids) const override {
        std::string out;
        for (auto id : ids) {
            auto it = decoder_.find(id);
            if (it != decoder_.end()) {
                out += it->second;
                continue;
            }
            auto sp = specials_table_.by_id.find(id);
            if (sp == specials_table_.by_id.end())
                throw core::InputError("token id " + std::to_string(id) +
                                       " is outside the tokenizer's vocabulary of " +
                                       std::to_string(vocab_size()));
            out += sp->second;
        }
        return out;
    }

    std::int64_t vocab_size() const override { return num_base_ + 256; }
    std::optional<std::int64_t> special_id(std::string_view text) const override {
        auto it = specials_table_.by_text.find(std::string(text));
        if (it == specials_table_.by_text.end()) return std::nullopt;
        return it->second;
    }
    std::string kind() const override { return "tiktoken"; }

  private:
    Splitter splitter_;
    ByteMap encoder_;
    std::unordered_map<std::int64_t, std::string> decoder_;
    SpecialTable specials_table_;
    std::int64_t num_base_ = 0;
};

// ---- Hugging Face tokenizer.json (byte-level BPE)
// -------------------------------------------------

// GPT-2's reversible byte <-> printable code point table.
std::array<std::uint32_t, 256> bytes_to_unicode() {
    std::array<std::uint32_t, 256> map{};
    std::array<bool, 256> direct{};
    for (int b = '!'; b <= '~'; ++b)
        direct[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b)
        direct[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b)
        direct[b] = true;
    std::uint32_t n = 0;
    for (int b = 0; b < 256; ++b)
        map[b] = direct[b] ? static_cast<std::uint32_t>(b) : 256 + n++;
    return map;
}

// Token ids of tokenizer.json: integers below 2^31 (the merge table keys a pair of ids in 64 bits).
// A float id such as 1e300 must not reach get<std::int64_t>(): that conversion is undefined.
bool valid_id(const json& v) {
    return v.is_number_integer() && v.get<std::int64_t>() >= 0 &&
           v.get<std::int64_t>() < (std::int64_t{1} << 31);
}

class HfBpeTokenizer final : public Tokenizer {
  public:
    explicit HfBpeTokenizer(const std::string& path) : path_(path) {
        json j;
        try {
            std::ifstream in(path);
            if (!in) throw core::InputError("cannot read tokenizer file '" + path + "'");
            j = json::parse(in);
        } catch (const json::exception& e) {
            throw core::InputError("tokenizer file '" + path + "' is not valid JSON: " + e.what());
        }
        auto fail = [&](const std::string& what) {
            throw core::InputError("tokenizer file '" + path + "': " + what);
        };
        // Features that change the ids and that this byte-level BPE does not implement are
        // refused by name rather than ignored.
        auto set = [](const json& o, const char* key) {
            return o.is_object() && o.contains(key) && !o[key].is_null();
        };
        try {
            if (!j.contains("model") || !j["model"].is_object()) fail("no \"model\" object");
            const json& model = j["model"];
            if (model.value("type", std::string()) != "BPE")
                fail("model.type is '" + model.value("type", std::string("?")) +
                     "': only byte-level BPE tokenizers (Llama-3) are supported");
            if (set(j, "normalizer"))
                fail("normalizer is not supported (byte-level BPE such as Llama-3's has none): "
                     "use a byte-level BPE tokenizer or its tiktoken file");
            if (model.value("byte_fallback", false))
                fail("model.byte_fallback is not supported (a SentencePiece-style BPE, not "
                     "byte-level)");
            for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
                if (set(model, key) && !model[key].get<std::string>().empty())
                    fail(std::string("model.") + key + " is not supported");
            if (set(model, "dropout") && model["dropout"].get<double>() != 0.0)
                fail("model.dropout is not supported (it makes encoding random)");
            ignore_merges_ = model.value("ignore_merges", false);
            if (!model.contains("vocab") || !model["vocab"].is_object()) fail("no model.vocab");
            read_pre_tokenizer(j, fail);
            read_vocab(model["vocab"], fail);
            if (!model.contains("merges") || !model["merges"].is_array()) fail("no model.merges");
            read_merges(model["merges"], fail);
            if (j.contains("added_tokens") && j["added_tokens"].is_array())
                for (const auto& t : j["added_tokens"]) {
                    if (!valid_id(t.at("id")))
                        fail("added_tokens has the id " + t.at("id").dump() +
                             " (ids are integers 0 .. 2^31-1)");
                    const auto id = t.at("id").get<std::int64_t>();
                    specials_table_.add(t.at("content").get<std::string>(), id);
                    max_id_ = std::max(max_id_, id);
                }
        } catch (const json::exception& e) {
            fail(std::string("unexpected JSON structure: ") + e.what());
        }
        specials_ = specials_table_.resolve();
    }

    std::vector<std::int64_t> encode(std::string_view text) const override {
        std::vector<std::int64_t> out;
        BytePairMerger bpe;
        std::vector<std::int64_t> ids; // id of the part starting at each byte
        splitter_->split(text, [&](std::string_view piece) {
            // HF's BPE takes a piece that is in the vocabulary whole only with ignore_merges
            // (Llama-3 sets it); otherwise the merges alone decide.
            if (ignore_merges_)
                if (auto whole = by_bytes_.find(piece); whole != by_bytes_.end()) {
                    out.push_back(whole->second);
                    return;
                }
            ids.resize(piece.size());
            for (std::size_t i = 0; i < piece.size(); ++i)
                ids[i] = byte_id_[static_cast<unsigned char>(piece[i])];
            auto rank = [&](std::size_t b, std::size_t m, std::size_t) {
                auto it = merges_.find(pair_key(ids[b], ids[m]));
                return it == merges_.end() ? kNoRank : it->second.first;
            };
            auto merged = [&](std::size_t b, std::size_t m, std::size_t) {
                ids[b] = merges_.find(pair_key(ids[b], ids[m]))->second.second;
            };
            for (std::size_t start : bpe.run(piece.size(), rank, merged))
                out.push_back(ids[start]);
        });
        return out;
    }

    std::string decode(const std::vector<std::int64_t>& ids) const override {
        std::string out;
        for (auto id : ids) {
            auto sp = specials_table_.by_id.find(id);
            if (sp != specials_table_.by_id.end()) {
                out += sp->second;
                continue;
            }
            auto it = bytes_of_.find(id);
            if (it == bytes_of_.end())
                throw core::InputError("token id " + std::to_string(id) +
                                       " is not in the tokenizer's vocabulary");
            out += it->second;
        }
        return out;
    }

    std::int64_t vocab_size() const override { return max_id_ + 1; }
    std::optional<std::int64_t> special_id(std::string_view text) const override {
        auto it = specials_table_.by_text.find(std::string(text));
        if (it == specials_table_.by_text.end()) return std::nullopt;
        return it->second;
    }
    std::string kind() const override { return "hf-bpe"; }

  private:
    static std::uint64_t pair_key(std::int64_t a, std::int64_t b) {
        return (static_cast<std::uint64_t>(a) << 32) ^ static_cast<std::uint64_t>(b);
    }

    // Pre-tokenizer: a Split regex (Llama-3: Sequence[Split, ByteLevel without regex]) or a
    // ByteLevel with its own regex (GPT-2's pattern, as HF's ByteLevel uses).
    template <class Fail> void read_pre_tokenizer(const json& j, Fail&& fail) {
        if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
            fail("pre_tokenizer is missing: only byte-level BPE (a ByteLevel pre-tokenizer, "
                 "optionally after a Split regex) is supported");
        std::string pattern;
        bool byte_level = false;
        std::function<void(const json&)> scan = [&](const json& p) {
            const std::string type = p.value("type", std::string());
            if (type == "Sequence" && p.contains("pretokenizers")) {
                for (const auto& q : p["pretokenizers"])
                    scan(q);
            } else if (type == "Split") {
                if (!p.contains("pattern") || !p["pattern"].contains("Regex"))
                    fail("pre_tokenizer Split without a Regex pattern is not supported");
                if (p.value("behavior", std::string("Isolated")) != "Isolated" ||
                    p.value("invert", false))
                    fail("pre_tokenizer Split with behavior '" +
                         p.value("behavior", std::string()) +
                         "' or invert true is not supported (Isolated, invert false)");
                if (!pattern.empty()) fail("pre_tokenizer with two split patterns");
                pattern = p["pattern"]["Regex"].get<std::string>();
            } else if (type == "ByteLevel") {
                byte_level = true;
                if (p.value("add_prefix_space", false))
                    fail("pre_tokenizer ByteLevel add_prefix_space true is not supported");
                if (p.value("use_regex", true)) {
                    if (!pattern.empty()) fail("pre_tokenizer with two split patterns");
                    pattern = kGpt2Pattern;
                }
            } else {
                fail("pre_tokenizer type '" + type + "' is not supported (Split, ByteLevel)");
            }
        };
        scan(j["pre_tokenizer"]);
        if (!byte_level)
            fail("pre_tokenizer has no ByteLevel step: only byte-level BPE is supported");
        if (pattern.empty())
            fail("pre_tokenizer has no split pattern (a Split regex or ByteLevel use_regex)");
        splitter_ = std::make_unique<Splitter>(pattern, "tokenizer file '" + path_ + "'");
    }

    // Vocabulary entries spell bytes with GPT-2's printable code points; keep them as bytes.
    template <class Fail> void read_vocab(const json& vocab, Fail&& fail) {
        const auto table = bytes_to_unicode();
        std::unordered_map<std::uint32_t, char> byte_of_cp;
        for (int b = 0; b < 256; ++b)
            byte_of_cp[table[b]] = static_cast<char>(b);
        for (auto it = vocab.begin(); it != vocab.end(); ++it) {
            if (!valid_id(*it)) fail("model.vocab['" + it.key() + "'] has the id " + it->dump());
            const auto id = it->get<std::int64_t>();
            std::string bytes;
            bool mapped = true;
            const std::string& s = it.key();
            for (std::size_t i = 0; i < s.size() && mapped;) {
                const unsigned char c = static_cast<unsigned char>(s[i]);
                const std::size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
                std::uint32_t cp = len == 1 ? c : c & (0x3F >> (len - 1));
                for (std::size_t k = 1; k < len && i + k < s.size(); ++k)
                    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
                auto b = byte_of_cp.find(cp);
                if (b == byte_of_cp.end())
                    mapped = false;
                else
                    bytes.push_back(b->second);
                i += len;
            }
            // A token outside the byte alphabet (e.g. a special token listed in the vocabulary)
            // cannot come out of byte-level BPE: it decodes to its text.
            if (!mapped)
                bytes = s;
            else
                by_bytes_.emplace(bytes, id);
            if (!bytes_of_.emplace(id, bytes).second)
                fail("model.vocab gives the id " + std::to_string(id) + " twice");
            by_text_.emplace(s, id);
            max_id_ = std::max(max_id_, id);
        }
        for (int b = 0; b < 256; ++b) {
            auto it = by_bytes_.find(std::string(1, static_cast<char>(b)));
            if (it == by_bytes_.end())
                fail("model.vocab lacks the byte " + std::to_string(b) +
                     ": a byte-level BPE vocabulary needs all 256");
            byte_id_[b] = it->second;
        }
    }

    template <class Fail> void read_merges(const json& merges, Fail&& fail) {
        std::int64_t rank = 0;
        for (const auto& m : merges) {
            std::string a, b;
            if (m.is_string()) {
                const std::string s = m.get<std::string>();
                const auto sp = s.find(' ');
                if (sp == std::string::npos) fail("model.merges entry '" + s + "' is not 'a b'");
                a = s.substr(0, sp);
                b = s.substr(sp + 1);
            } else if (m.is_array() && m.size() == 2) {
                a = m[0].get<std::string>();
                b = m[1].get<std::string>();
            } else {
                fail("model.merges[" + std::to_string(rank) + "] is neither \"a b\" nor [a, b]");
            }
            auto ia = by_text_.find(a), ib = by_text_.find(b), iab = by_text_.find(a + b);
            if (ia == by_text_.end() || ib == by_text_.end() || iab == by_text_.end())
                fail("model.merges[" + std::to_string(rank) + "] ('" + a + "' + '" + b +
                     "') names a token missing from model.vocab");
            // The first listing of a pair counts (the lowest rank), as in HF.
            merges_.emplace(pair_key(ia->second, ib->second), std::pair{rank, iab->second});
            ++rank;
        }
    }

    std::unique_ptr<Splitter> splitter_;
    ByteMap by_bytes_;                                      // token bytes -> id
    std::unordered_map<std::string, std::int64_t> by_text_; // vocabulary spelling -> id
    std::unordered_map<std::int64_t, std::string> bytes_of_;
    std::unordered_map<std::uint64_t, std::pair<std::int64_t, std::int64_t>> merges_; // rank, id
    std::array<std::int64_t, 256> byte_id_{};
    SpecialTable specials_table_;
    std::string path_;
    bool ignore_merges_ = false;
    std::int64_t max_id_ = -1;
};

// Python's str.strip() (torchtune strips role and content): it removes every character for which
// str.isspace() holds, which beyond ASCII whitespace includes U+001C..U+001F, U+0085, U+00A0 and
// the Unicode space separators.
bool python_space(std::uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string python_strip(const std::string& t) {
    // Decode to (offset, code point); invalid bytes count as non-space.
    auto cp_at = [&](std::size_t i, std::size_t& len) -> std::uint32_t {
        const unsigned char c = static_cast<unsigned char>(t[i]);
        len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
        if (len == 1 || i + len > t.size()) return len = 1, c < 0x80 ? c : 0xFFFFFFFF;
        std::uint32_t cp = c & (0x7F >> len);
        for (std::size_t k = 1; k < len; ++k)
            cp = (cp << 6) | (static_cast<unsigned char>(t[i + k]) & 0x3F);
        return cp;
    };
    std::size_t begin = 0, end = 0, len = 0;
    bool seen = false;
    for (std::size_t i = 0; i < t.size(); i += len)
        if (!python_space(cp_at(i, len))) {
            if (!seen) begin = i, seen = true;
            end = i + len;
        }
    return seen ? t.substr(begin, end - begin) : std::string();
}

} // namespace

std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path) {
    return std::make_unique<TiktokenTokenizer>(path);
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
    return std::make_unique<HfBpeTokenizer>(path);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
    const fs::path p(path);
    if (fs::is_directory(p)) {
        for (const char* name : {"tokenizer.json", "original/tokenizer.model", "tokenizer.model"})
            if (fs::exists(p / name)) return load_tokenizer((p / name).string());
        throw core::InputError("'" + path +
                               "' has no tokenizer.json, original/tokenizer.model or "
                               "tokenizer.model: set llm.tokenizer to the tokenizer file");
    }
    if (!fs::exists(p)) throw core::InputError("tokenizer file '" + path + "' does not exist");
    // A FIFO or device (/dev/zero) would block or be read without end: only regular files, of a
    // size a tokenizer can have (Llama 3's tokenizer.json is 9 MB).
    if (!fs::is_regular_file(p))
        throw core::InputError("tokenizer file '" + path + "' is " + core::file_kind(path) +
                               ", not a regular file: set llm.tokenizer to a tokenizer.model or "
                               "tokenizer.json");
    constexpr std::uintmax_t kMaxTokenizerBytes = std::uintmax_t{1} << 30;
    if (std::error_code ec; fs::file_size(p, ec) > kMaxTokenizerBytes && !ec)
        throw core::InputError("tokenizer file '" + path +
                               "' is larger than 1 GiB: not a "
                               "tokenizer; set llm.tokenizer to a tokenizer.model or "
                               "tokenizer.json");
    if (p.extension() == ".json") return load_hf_tokenizer(path);
    return load_tiktoken(path);
}

TokenizedText tokenize_messages(const Tokenizer& tok, const std::vector<Message>& messages,
                                bool add_bos, bool add_eos) {
    const SpecialTokens& s = tok.specials();
    if (s.start_header < 0 || s.end_header < 0 || s.eot < 0 || s.bos < 0 || s.eos < 0)
        throw core::InputError("the tokenizer lacks Llama-3's special tokens (begin/end of text, "
                               "header ids, eot): it cannot format chat messages");
    TokenizedText out;
    auto push = [&](std::int64_t id, bool masked) {
        out.ids.push_back(id);
        out.mask.push_back(masked);
    };
    // BOS and EOS are never trained on (torchtune masks them).
    if (add_bos) push(s.bos, true);
    for (const Message& m : messages) {
        push(s.start_header, m.masked);
        for (auto id : tok.encode(python_strip(m.role)))
            push(id, m.masked);
        push(s.end_header, m.masked);
        for (auto id : tok.encode("\n\n"))
            push(id, m.masked);
        for (auto id : tok.encode(python_strip(m.content)))
            push(id, m.masked);
        push(s.eot, m.masked);
    }
    if (add_eos) push(s.eos, true);
    return out;
}

} // namespace trainscope::data
