// Torch-free parser tests for the sanitizer build: valid inputs of each parser family, and every
// bad input the fuzzers found, which must now be a core::InputError / ConfigError naming the file
// and the problem (never a crash, an overflow or an allocation the file cannot back).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fuzz_input.hpp"
#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/data/idx_reader.hpp"
#include "trainscope/data/options.hpp"
#include "trainscope/data/text_dataset.hpp"
#include "trainscope/data/tokenizer.hpp"
#include "trainscope/models/safetensors_header.hpp"

using namespace trainscope;

namespace {

// The message of the core::Error that fn() throws ("" when it throws none).
template <class Fn> std::string error_of(Fn&& fn) {
    try {
        fn();
    } catch (const core::Error& e) {
        return e.what();
    }
    return "";
}

const core::OptionRegistry& data_registry() {
    static const core::OptionRegistry r = [] {
        core::OptionRegistry reg;
        data::declare_options(reg);
        return reg;
    }();
    return r;
}

std::string safetensors(const std::string& header, std::size_t data_bytes) {
    std::string f;
    for (int i = 0; i < 8; ++i)
        f.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
    return f + header + std::string(data_bytes, '\0');
}

std::string safetensors_error(const std::string& file) {
    return error_of([&] {
        models::parse_safetensors_header(reinterpret_cast<const unsigned char*>(file.data()),
                                         file.size(), "x.safetensors");
    });
}

} // namespace

TEST(SafetensorsHeader, ValidHeaderGivesEntriesAndMetadata) {
    const std::string f = safetensors(R"({"__metadata__": {"format": "pt"},
        "a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
        "b": {"dtype": "I64", "shape": [], "data_offsets": [16, 24]}})",
                                      24);
    const auto h = models::parse_safetensors_header(
        reinterpret_cast<const unsigned char*>(f.data()), f.size(), "x.safetensors");
    ASSERT_EQ(h.entries.size(), 2u);
    EXPECT_EQ(h.entries[0].dtype, "BF16");
    EXPECT_EQ(h.entries[0].shape, (std::vector<std::int64_t>{2, 3}));
    EXPECT_EQ(h.entries[1].begin, 16u);
    EXPECT_EQ(h.metadata.at("format"), "pt");
    EXPECT_EQ(h.header_bytes, f.size() - 24);
}

TEST(SafetensorsHeader, ShapesThatOverflowOrAreNotIntegersAreRejected) {
    // numel * 4 wraps to 0 modulo 2^64: it used to pass the size check with an empty range.
    auto msg = safetensors_error(safetensors(
        R"({"w": {"dtype": "F32", "shape": [4294967296, 1073741824], "data_offsets": [0, 0]}})",
        0));
    EXPECT_NE(msg.find("more than 2^64"), std::string::npos) << msg;
    // A float dimension was converted to an integer out of range (undefined behaviour).
    msg = safetensors_error(
        safetensors(R"({"w": {"dtype": "U8", "shape": [1e300], "data_offsets": [0, 0]}})", 0));
    EXPECT_NE(msg.find("'w' has a dimension that is not an integer"), std::string::npos) << msg;
    msg = safetensors_error(
        safetensors(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]}})", 1));
    EXPECT_NE(msg.find("data_offsets must be [begin, end]"), std::string::npos) << msg;
    msg = safetensors_error(
        safetensors(R"({"w": {"dtype": "U8", "shape": 3, "data_offsets": [0, 3]}})", 3));
    EXPECT_NE(msg.find("shape must be an array"), std::string::npos) << msg;
    EXPECT_NE(safetensors_error("").find("too short"), std::string::npos);
}

TEST(IdxReader, ReadsAndRejectsNamingTheFile) {
    fuzz::FuzzFile file("t10k-labels-idx1-ubyte");
    const std::string ok("\0\0\x08\x01\0\0\0\x02\x07\x03", 10);
    const data::IdxArray a = data::read_idx(file.write(ok));
    EXPECT_EQ(a.dims, (std::vector<std::int64_t>{2}));
    EXPECT_EQ(a.data, (std::vector<std::uint8_t>{7, 3}));
    const std::string huge("\0\0\x08\x03\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 16);
    const std::string msg = error_of([&] { data::read_idx(file.write(huge)); });
    EXPECT_NE(msg.find(file.path()), std::string::npos) << msg;
    EXPECT_NE(msg.find("is truncated"), std::string::npos) << msg;
}

TEST(ConfigFile, ValuesAreValidatedAndErrorsNameTheFile) {
    fuzz::FuzzFile file("run.ini");
    const auto parse = [&](const std::string& ini) {
        return fuzz::parse_command_line(data_registry(), {"--config", file.write(ini)});
    };
    EXPECT_EQ(parse("[data]\nworkers = 3\n").config.get_int("data.workers"), 3);
    std::string msg = error_of([&] { parse("[data]\nworkers = 3x\n"); });
    EXPECT_NE(msg.find(file.path()), std::string::npos) << msg;
    EXPECT_NE(msg.find("data.workers"), std::string::npos) << msg;
    // Boost.Program_options' error messages looped forever on these (fuzz_config timeouts).
    msg = error_of([&] { parse("[data]\n%invalid_line%\n"); });
    EXPECT_NE(msg.find("contains an invalid line '%invalid_line%'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(file.path()), std::string::npos) << msg;
    msg = error_of([&] { fuzz::parse_command_line(data_registry(), {"--x%canonical_option%="}); });
    EXPECT_NE(msg.find("unknown option 'x%canonical_option%'"), std::string::npos) << msg;
}

TEST(TextDatasetRecords, BadRecordsNameFileAndLine) {
    fuzz::FuzzFile model("bytes.model"), jsonl("d.jsonl");
    std::string ranks;
    const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int b = 0; b < 256; ++b)
        ranks += std::string{b64[b >> 2], b64[(b & 3) << 4]} + "== " + std::to_string(b) + "\n";
    const auto tok = data::load_tiktoken(model.write(ranks));
    data::TextDatasetOptions o;
    o.format = data::TextFormat::Chat;
    o.path = jsonl.write("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n\n"
                         "{\"messages\": [{\"role\": \"user\", \"content\": 7}]}\n");
    const std::string msg = error_of([&] { data::TextDataset(o, *tok); });
    EXPECT_NE(msg.find(jsonl.path()), std::string::npos) << msg;
    EXPECT_NE(msg.find("line 3"), std::string::npos) << msg;
}

TEST(TokenizerFiles, IdsOutOfRangeAreRejectedNotOverflowed) {
    fuzz::FuzzFile model("tokenizer.model"), hf("tokenizer.json");
    // rank + 1 overflowed int64 in the dense-ranks check (fuzz_tiktoken).
    std::string msg =
        error_of([&] { data::load_tiktoken(model.write("YQ== 9223372036854775807\n")); });
    EXPECT_NE(msg.find("ranks up to 9223372036854775807"), std::string::npos) << msg;
    // A float id was converted to int64 out of range (fuzz_hf_tokenizer; the added_tokens case is
    // corpus/hf_tokenizer/regress-added-token-float-id.json).
    msg = error_of([&] {
        data::load_hf_tokenizer(hf.write(R"({"pre_tokenizer": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": {"a": 1e300}, "merges": []}})"));
    });
    EXPECT_NE(msg.find("model.vocab['a'] has the id 1e+300"), std::string::npos) << msg;
}
