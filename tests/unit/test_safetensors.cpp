// safetensors: round trips of every dtype with metadata, sharded checkpoints, and corrupt files
// rejected with the file and the tensor named.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "test_util.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/models/safetensors.hpp"

namespace tm_ = trainscope::models;
namespace fs = std::filesystem;

namespace {

// A file with the given header text and `data` bytes after it.
void write_raw(const fs::path& p, const std::string& header, std::size_t data_bytes,
               std::uint64_t declared = 0) {
    std::ofstream out(p, std::ios::binary);
    const std::uint64_t n = declared ? declared : header.size();
    for (int i = 0; i < 8; ++i)
        out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header;
    out << std::string(data_bytes, '\0');
}

std::string error_of(const fs::path& p) {
    try {
        tm_::SafetensorsFile f(p.string());
    } catch (const trainscope::core::InputError& e) {
        return e.what();
    }
    return "";
}

} // namespace

TEST(Safetensors, RoundTripsEveryDtypeWithMetadata) {
    const fs::path dir = trainscope::testing::temp_dir("st", "roundtrip");
    torch::manual_seed(0);
    std::vector<std::pair<std::string, torch::Tensor>> in = {
        {"f64", torch::randn({3, 2}, torch::kFloat64)},
        {"f32", torch::randn({5}, torch::kFloat32)},
        {"f16", torch::randn({2, 3}).to(torch::kFloat16)},
        {"bf16", torch::randn({4, 1}).to(torch::kBFloat16)},
        {"i64", torch::randint(-1000, 1000, {7}, torch::kInt64)},
        {"i32", torch::randint(-1000, 1000, {2, 2}, torch::kInt32)},
        {"i8", torch::randint(-100, 100, {3}, torch::kInt8)},
        {"u8", torch::randint(0, 255, {9}, torch::kUInt8)},
        {"bool", torch::randint(0, 2, {5}, torch::kInt64).to(torch::kBool)},
        {"scalar", torch::tensor(3.5)},
        {"strided", torch::randn({4, 6}).t()}, // non-contiguous input is stored contiguous
    };
    const std::string path = (dir / "x.safetensors").string();
    tm_::save_safetensors(path, in, {{"format", "pt"}, {"note", "ü"}});
    tm_::SafetensorsFile f(path);
    EXPECT_EQ(f.metadata().at("note"), "ü");
    EXPECT_EQ(f.entries().size(), in.size());
    for (const auto& [name, t] : in) {
        const torch::Tensor back = f.tensor(name);
        EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
        EXPECT_TRUE(torch::equal(back, t)) << name;
    }
    // Data starts 8-byte aligned, as the format recommends.
    std::ifstream raw(path, std::ios::binary);
    std::uint64_t n = 0;
    raw.read(reinterpret_cast<char*>(&n), 8);
    EXPECT_EQ(n % 8, 0u);
    fs::remove_all(dir);
}

TEST(Safetensors, ShardedCheckpointThroughTheIndex) {
    const fs::path dir = trainscope::testing::temp_dir("st", "sharded");
    const torch::Tensor a = torch::arange(6.0).view({2, 3}), b = torch::ones({4});
    tm_::save_safetensors((dir / "model-00001-of-00002.safetensors").string(), {{"a", a}});
    tm_::save_safetensors((dir / "model-00002-of-00002.safetensors").string(), {{"b", b}});
    std::ofstream(dir / "model.safetensors.index.json")
        << R"({"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                              "b": "model-00002-of-00002.safetensors"}})";
    tm_::SafetensorsCheckpoint ck(dir.string());
    EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b"}));
    EXPECT_TRUE(torch::equal(ck.tensor("a"), a));
    EXPECT_TRUE(torch::equal(ck.tensor("b"), b));
    EXPECT_NE(ck.file_of("b").find("00002"), std::string::npos);
    EXPECT_THROW(ck.tensor("c"), trainscope::core::InputError);
    fs::remove(dir / "model-00002-of-00002.safetensors");
    EXPECT_THROW(tm_::SafetensorsCheckpoint{dir.string()}, trainscope::core::InputError);
    fs::remove_all(dir);
}

TEST(Safetensors, CorruptFilesAreRejectedNamingFileAndTensor) {
    const fs::path dir = trainscope::testing::temp_dir("st", "corrupt");
    const fs::path p = dir / "bad.safetensors";
    auto expect = [&](const std::vector<std::string>& needles) {
        const std::string msg = error_of(p);
        ASSERT_FALSE(msg.empty()) << "accepted";
        EXPECT_NE(msg.find(p.string()), std::string::npos) << msg;
        for (const auto& n : needles)
            EXPECT_NE(msg.find(n), std::string::npos) << msg;
    };
    { std::ofstream(p, std::ios::binary) << "abc"; }
    expect({"too short"});
    write_raw(p, "{}", 0, 1000);
    expect({"exceeds the file"});
    write_raw(p, "{\"w\": [", 0);
    expect({"not valid JSON"});
    write_raw(p, R"({"w": {"dtype": "F8", "shape": [2], "data_offsets": [0, 2]}})", 2);
    expect({"'w'", "F8"});
    write_raw(p, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8);
    expect({"'w'", "outside the data section"});
    write_raw(p, R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})", 16);
    expect({"'w'", "need 12"});
    write_raw(p, R"({"u": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                     "w": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
              12);
    expect({"overlap"});
    write_raw(p, R"({"w": {"dtype": "F32", "shape": [2]}})", 8);
    expect({"'w'", "data_offsets"});
    fs::remove_all(dir);
}
