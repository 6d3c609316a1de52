// JSON / JSONL text datasets, tokenised and masked as torchtune's builders do, and packing
// (collation into tensors: text_batch.cpp).
#include "trainscope/data/text_dataset.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trainscope/core/error.hpp"
#include "trainscope/core/text.hpp"

namespace trainscope::data {

using json = nlohmann::json;

namespace {

const char* kAlpacaWithInput =
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n";
const char* kAlpacaNoInput =
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n";
const char* kSummarize = "Summarize this dialogue:\n{dialogue}\n---\nSummary:\n";
const char* kGrammar = "Correct this to standard English: {input}\n---\nCorrected: ";

std::string fill_template(std::string t, const std::string& key, const std::string& value) {
    const std::string k = "{" + key + "}";
    for (auto at = t.find(k); at != std::string::npos; at = t.find(k, at + value.size()))
        t.replace(at, k.size(), value);
    return t;
}

// nlohmann's message quotes the token read so far ("last read: '...'"): the whole of a 5 MB string
// on a long line, raw invalid UTF-8 bytes included.
std::string json_error(const json::exception& e) {
    return core::printable(e.what(), 300);
}

// One record with its place in the file, for error messages.
struct Record {
    const json* value;
    std::string where; // "line 12" or "element 3"
};

class Reader {
  public:
    Reader(const std::string& path, TextFormat format) : path_(path), format_(format) {}

    [[noreturn]] void fail(const Record& r, const std::string& what) const {
        throw core::InputError("dataset '" + path_ + "' " + r.where + ": " + what +
                               " (llm.dataset.format=" + to_string(format_) + " expects " +
                               expected() + ")");
    }
    std::string str(const Record& r, const char* field, bool optional = false) const {
        const json& v = *r.value;
        if (!v.contains(field) || v[field].is_null()) {
            if (optional) return "";
            fail(r, std::string("missing field \"") + field + "\"");
        }
        if (!v[field].is_string()) fail(r, std::string("field \"") + field + "\" is not a string");
        return v[field].get<std::string>();
    }
    std::string expected() const {
        switch (format_) {
        case TextFormat::Instruct:
            return "instruction, optional input, output";
        case TextFormat::Summarize:
            return "dialogue, summary";
        case TextFormat::Grammar:
            return "input, output";
        case TextFormat::Chat:
            return "messages [{role, content}] or conversations [{from, value}]";
        case TextFormat::Text:
            return "text";
        case TextFormat::Preference:
            return "prompt, chosen, rejected";
        }
        return "";
    }

  private:
    std::string path_;
    TextFormat format_;
};

// Messages from OpenAI-style "messages" or ShareGPT "conversations"; non-assistant turns masked
// unless train_on_input.
std::vector<Message> chat_messages(const Reader& rd, const Record& r, const json& list,
                                   bool sharegpt, bool train_on_input) {
    if (!list.is_array() || list.empty())
        rd.fail(r, std::string("\"") + (sharegpt ? "conversations" : "messages") +
                       "\" is not a non-empty array");
    std::vector<Message> out;
    for (std::size_t i = 0; i < list.size(); ++i) {
        const json& m = list[i];
        const char* rk = sharegpt ? "from" : "role";
        const char* ck = sharegpt ? "value" : "content";
        if (!m.is_object() || !m.contains(rk) || !m.contains(ck) || !m[rk].is_string() ||
            !m[ck].is_string())
            rd.fail(r, "turn " + std::to_string(i) + " lacks string fields \"" + rk + "\" and \"" +
                           ck + "\"");
        std::string role = m[rk].get<std::string>();
        if (sharegpt) {
            if (role == "human")
                role = "user";
            else if (role == "gpt")
                role = "assistant";
            else if (role != "system")
                rd.fail(r, "turn " + std::to_string(i) + ": ShareGPT \"from\" is '" + role +
                               "' (use system, human or gpt)");
        } else if (role != "system" && role != "user" && role != "assistant" && role != "ipython") {
            rd.fail(r, "turn " + std::to_string(i) + ": role '" + role +
                           "' (use system, user, assistant or ipython)");
        }
        Message msg;
        msg.role = role;
        msg.content = m[ck].get<std::string>();
        msg.masked = role != "assistant" && !train_on_input;
        out.push_back(std::move(msg));
    }
    return out;
}

TokenizedSample to_sample(const TokenizedText& t) {
    TokenizedSample s;
    s.ids = t.ids;
    s.labels.resize(t.ids.size());
    for (std::size_t i = 0; i < t.ids.size(); ++i)
        s.labels[i] = t.mask[i] ? kIgnoreLabel : t.ids[i];
    return s;
}

// torchtune's truncate(tokens, max_seq_len, eos): cut, and the last kept token becomes EOS
// (masked).
bool truncate(TokenizedText& t, std::int64_t max_len, std::int64_t eos) {
    if (static_cast<std::int64_t>(t.ids.size()) <= max_len) return false;
    t.ids.resize(static_cast<std::size_t>(max_len));
    t.mask.resize(static_cast<std::size_t>(max_len));
    t.ids.back() = eos;
    t.mask.back() = true;
    return true;
}

} // namespace

TextFormat parse_text_format(const std::string& name) {
    if (name == "instruct") return TextFormat::Instruct;
    if (name == "summarize") return TextFormat::Summarize;
    if (name == "grammar") return TextFormat::Grammar;
    if (name == "chat") return TextFormat::Chat;
    if (name == "text") return TextFormat::Text;
    if (name == "preference") return TextFormat::Preference;
    throw core::ConfigError("llm.dataset.format = '" + name +
                            "': use instruct, summarize, grammar, chat, text or preference");
}

const char* to_string(TextFormat f) {
    switch (f) {
    case TextFormat::Instruct:
        return "instruct";
    case TextFormat::Summarize:
        return "summarize";
    case TextFormat::Grammar:
        return "grammar";
    case TextFormat::Chat:
        return "chat";
    case TextFormat::Text:
        return "text";
    case TextFormat::Preference:
        return "preference";
    }
    return "?";
}

TextDataset::TextDataset(const TextDatasetOptions& options, const Tokenizer& tok)
    : options_(options) {
    std::ifstream in(options.path);
    if (!in)
        throw core::InputError("cannot read dataset '" + options.path +
                               "': " + std::strerror(errno));
    // Records: a JSON array, or one object per line (JSONL).
    std::vector<json> values;
    std::vector<std::string> where;
    const bool jsonl =
        options.path.size() >= 6 && options.path.compare(options.path.size() - 6, 6, ".jsonl") == 0;
    if (jsonl) {
        std::string line;
        std::int64_t n = 0;
        while (std::getline(in, line)) {
            ++n;
            if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
            try {
                values.push_back(json::parse(line));
            } catch (const json::exception& e) {
                throw core::InputError("dataset '" + options.path + "' line " + std::to_string(n) +
                                       " is not valid JSON: " + json_error(e));
            }
            where.push_back("line " + std::to_string(n));
            if (options.max_samples > 0 &&
                static_cast<std::int64_t>(values.size()) >= options.max_samples)
                break;
        }
        if (in.bad()) // a read error ends getline like the end of the file does
            throw core::InputError("cannot read dataset '" + options.path + "' after line " +
                                   std::to_string(n) + ": " + std::strerror(errno));
    } else {
        json all;
        try {
            all = json::parse(in);
        } catch (const json::exception& e) {
            throw core::InputError("dataset '" + options.path +
                                   "' is not valid JSON: " + json_error(e) +
                                   " (a .json dataset is one array of objects; use .jsonl for "
                                   "one object per line)");
        }
        if (!all.is_array())
            throw core::InputError("dataset '" + options.path + "' is not a JSON array of objects");
        for (std::size_t i = 0; i < all.size(); ++i) {
            if (options.max_samples > 0 &&
                static_cast<std::int64_t>(values.size()) >= options.max_samples)
                break;
            values.push_back(std::move(all[i]));
            where.push_back("element " + std::to_string(i));
        }
    }
    if (values.empty()) throw core::InputError("dataset '" + options.path + "' has no records");

    const Reader rd(options.path, options.format);
    const SpecialTokens& sp = tok.specials();
    const bool train_input = options.train_on_input;
    std::int64_t prompt = -1; // the record's masked prefix (its first side for preferences)
    auto finish = [&](std::vector<Message> msgs) {
        TokenizedText t = tokenize_messages(tok, msgs, true, true);
        if (prompt < 0) {
            prompt = 0;
            while (prompt < static_cast<std::int64_t>(t.mask.size()) &&
                   t.mask[static_cast<std::size_t>(prompt)])
                ++prompt;
        }
        if (truncate(t, options.max_seq_len, sp.eos)) ++truncated_;
        return to_sample(t);
    };
    auto prompt_response = [&](const std::string& prompt, const std::string& response) {
        return finish({{"user", prompt, !train_input}, {"assistant", response, false}});
    };
    for (std::size_t k = 0; k < values.size(); ++k) {
        const Record r{&values[k], where[k]};
        if (!values[k].is_object()) rd.fail(r, "the record is not a JSON object");
        prompt = options.format == TextFormat::Text ? 1 : -1; // text: only BOS is not trained
        switch (options.format) {
        case TextFormat::Instruct: {
            const std::string input = rd.str(r, "input", true);
            std::string prompt = fill_template(input.empty() ? kAlpacaNoInput : kAlpacaWithInput,
                                               "instruction", rd.str(r, "instruction"));
            prompt = fill_template(prompt, "input", input);
            samples_.push_back(prompt_response(prompt, rd.str(r, "output")));
            break;
        }
        case TextFormat::Summarize:
            samples_.push_back(
                prompt_response(fill_template(kSummarize, "dialogue", rd.str(r, "dialogue")),
                                rd.str(r, "summary")));
            break;
        case TextFormat::Grammar:
            samples_.push_back(prompt_response(fill_template(kGrammar, "input", rd.str(r, "input")),
                                               rd.str(r, "output")));
            break;
        case TextFormat::Chat: {
            const json& v = values[k];
            const bool sharegpt = v.contains("conversations");
            if (!sharegpt && !v.contains("messages"))
                rd.fail(r, "missing field \"messages\" (or ShareGPT \"conversations\")");
            samples_.push_back(finish(chat_messages(
                rd, r, sharegpt ? v["conversations"] : v["messages"], sharegpt, train_input)));
            break;
        }
        case TextFormat::Text: {
            // Completion: BOS + text + EOS, every token trained on, cut to max_seq_len.
            TokenizedSample s;
            s.ids.push_back(sp.bos);
            for (auto id : tok.encode(rd.str(r, "text")))
                s.ids.push_back(id);
            s.ids.push_back(sp.eos);
            if (static_cast<std::int64_t>(s.ids.size()) > options.max_seq_len) {
                s.ids.resize(static_cast<std::size_t>(options.max_seq_len));
                ++truncated_;
            }
            s.labels = s.ids;
            samples_.push_back(std::move(s));
            break;
        }
        case TextFormat::Preference: {
            const json& v = values[k];
            if (!v.contains("prompt")) rd.fail(r, "missing field \"prompt\"");
            std::vector<Message> prompt;
            if (v["prompt"].is_string())
                prompt.push_back({"user", v["prompt"].get<std::string>(), true});
            else
                for (auto m : chat_messages(rd, r, v["prompt"], false, false)) {
                    m.masked = true; // the prompt is never trained on
                    prompt.push_back(m);
                }
            auto side = [&](const char* key) {
                if (!v.contains(key)) rd.fail(r, std::string("missing field \"") + key + "\"");
                std::vector<Message> msgs = prompt;
                if (v[key].is_string())
                    msgs.push_back({"assistant", v[key].get<std::string>(), false});
                else
                    for (auto& m : chat_messages(rd, r, v[key], false, false))
                        msgs.push_back(m);
                return finish(msgs);
            };
            PreferenceSample p;
            p.chosen = side("chosen");
            p.rejected = side("rejected");
            preferences_.push_back(std::move(p));
            break;
        }
        }
        prompt_tokens_.push_back(std::max<std::int64_t>(prompt, 0));
    }
}

namespace {
std::int64_t scored_labels(const TokenizedSample& s) {
    // Position 0's label is never scored (label t is predicted from position t - 1).
    std::int64_t n = 0;
    for (std::size_t i = 1; i < s.labels.size(); ++i)
        n += s.labels[i] != kIgnoreLabel;
    return n;
}
} // namespace

std::int64_t TextDataset::trained_tokens(std::int64_t i) const {
    if (is_preference()) {
        const PreferenceSample& p = preference(i);
        return scored_labels(p.chosen) + scored_labels(p.rejected);
    }
    return scored_labels(sample(i));
}

std::int64_t TextDataset::prompt_tokens(std::int64_t i) const {
    return prompt_tokens_.at(static_cast<std::size_t>(i));
}

std::int64_t TextDataset::size() const {
    return static_cast<std::int64_t>(is_preference() ? preferences_.size() : samples_.size());
}

const TokenizedSample& TextDataset::sample(std::int64_t i) const {
    if (is_preference())
        throw core::InternalError("TextDataset::sample on preference data: use preference()");
    return samples_.at(static_cast<std::size_t>(i));
}

const PreferenceSample& TextDataset::preference(std::int64_t i) const {
    if (!is_preference())
        throw core::InternalError("TextDataset::preference on supervised data: use sample()");
    return preferences_.at(static_cast<std::size_t>(i));
}

std::vector<PackedSample> pack_samples(const std::vector<const TokenizedSample*>& samples,
                                       std::int64_t max_seq_len, std::int64_t pad_id) {
    std::vector<PackedSample> packs;
    PackedSample cur;
    std::int64_t segment = 0;
    auto close = [&] {
        if (cur.ids.empty()) return;
        const auto used = static_cast<std::int64_t>(cur.ids.size());
        cur.length = used;
        for (std::int64_t i = used; i < max_seq_len; ++i) {
            cur.ids.push_back(pad_id);
            cur.labels.push_back(kIgnoreLabel);
            cur.positions.push_back(i - used);
            cur.segments.push_back(segment); // padding: a segment of its own
        }
        packs.push_back(std::move(cur));
        cur = PackedSample();
        segment = 0;
    };
    for (const TokenizedSample* s : samples) {
        const auto n =
            std::min<std::int64_t>(static_cast<std::int64_t>(s->ids.size()), max_seq_len);
        if (static_cast<std::int64_t>(cur.ids.size()) + n > max_seq_len) close();
        for (std::int64_t i = 0; i < n; ++i) {
            cur.ids.push_back(s->ids[static_cast<std::size_t>(i)]);
            cur.labels.push_back(s->labels[static_cast<std::size_t>(i)]);
            cur.positions.push_back(i);
            cur.segments.push_back(segment);
        }
        ++segment;
    }
    close();
    return packs;
}

} // namespace trainscope::data
