// IDX reader and datasets: exact round trips of raw and gzip files written here, the error message
// for each kind of bad file, the installed Fashion-MNIST, the synthetic set and the options.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "data_test_util.hpp"
#include "test_util.hpp"
#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/data/datasets.hpp"
#include "trainscope/data/idx_reader.hpp"
#include "trainscope/data/options.hpp"

namespace fs = std::filesystem;
using namespace trainscope;
using data::read_idx;

namespace {

std::vector<std::uint8_t> idx_bytes(std::uint32_t magic, const std::vector<std::uint32_t>& dims,
                                    const std::vector<std::uint8_t>& payload) {
    std::vector<std::uint8_t> b;
    auto put32 = [&](std::uint32_t v) {
        for (int s = 24; s >= 0; s -= 8)
            b.push_back(static_cast<std::uint8_t>(v >> s));
    };
    put32(magic);
    for (auto d : dims)
        put32(d);
    b.insert(b.end(), payload.begin(), payload.end());
    return b;
}

std::vector<std::uint8_t> random_bytes(std::size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<std::uint8_t> v(n);
    for (auto& x : v)
        x = static_cast<std::uint8_t>(rng());
    return v;
}

void write_raw(const fs::path& p, const std::vector<std::uint8_t>& bytes) {
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// mode "wb" writes one gzip member, "ab" appends another.
void write_gz(const fs::path& p, const std::vector<std::uint8_t>& bytes, const char* mode = "wb") {
    gzFile f = gzopen(p.c_str(), mode);
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), int(bytes.size()));
    ASSERT_EQ(gzclose(f), Z_OK);
}

class IdxTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("trainscope_idx_test_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    // The InputError message read_idx gives for `p` (fails the test if it does not throw).
    std::string read_error(const fs::path& p) {
        try {
            read_idx(p.string());
        } catch (const core::InputError& e) {
            return e.what();
        }
        ADD_FAILURE() << "read_idx(" << p << ") did not throw InputError";
        return "";
    }

    fs::path dir_;
};

#define EXPECT_CONTAINS(text, part)                                                                \
    EXPECT_NE(std::string(text).find(part), std::string::npos) << "message: " << (text)

} // namespace

TEST_F(IdxTest, RawImagesRoundTrip) {
    auto payload = random_bytes(5 * 4 * 3, 1);
    write_raw(dir_ / "images", idx_bytes(0x00000803, {5, 4, 3}, payload));
    auto a = read_idx((dir_ / "images").string());
    EXPECT_EQ(a.dims, (std::vector<std::int64_t>{5, 4, 3}));
    EXPECT_EQ(a.data, payload);
}

TEST_F(IdxTest, GzipDetectedByMagicNotByName) {
    auto labels = random_bytes(1000, 2);
    auto images = random_bytes(7 * 28 * 28, 3);
    write_gz(dir_ / "labels.idx", idx_bytes(0x00000801, {1000}, labels));      // gzip, no .gz
    write_raw(dir_ / "images.gz", idx_bytes(0x00000803, {7, 28, 28}, images)); // raw, .gz name
    auto l = read_idx((dir_ / "labels.idx").string());
    EXPECT_EQ(l.dims, (std::vector<std::int64_t>{1000}));
    EXPECT_EQ(l.data, labels);
    auto i = read_idx((dir_ / "images.gz").string());
    EXPECT_EQ(i.dims, (std::vector<std::int64_t>{7, 28, 28}));
    EXPECT_EQ(i.data, images);
}

TEST_F(IdxTest, GzipWithSeveralMembers) {
    // gzip allows concatenated members (e.g. `cat a.gz b.gz`): one IDX file split across two.
    auto bytes = idx_bytes(0x00000803, {3, 10, 10}, random_bytes(300, 4));
    std::vector<std::uint8_t> first(bytes.begin(), bytes.begin() + 100),
        second(bytes.begin() + 100, bytes.end());
    write_gz(dir_ / "two", first, "wb");
    write_gz(dir_ / "two", second, "ab");
    EXPECT_EQ(read_idx((dir_ / "two").string()).data,
              std::vector<std::uint8_t>(bytes.begin() + 16, bytes.end()));
}

TEST_F(IdxTest, ErrorMessagesNameFileAndProblem) {
    write_raw(dir_ / "magic", idx_bytes(0x12345678, {2}, {1, 2}));
    auto m = read_error(dir_ / "magic");
    EXPECT_CONTAINS(m, (dir_ / "magic").string());
    EXPECT_CONTAINS(m, "not an IDX file (magic 0x12345678");

    write_raw(dir_ / "float", idx_bytes(0x00000D01, {2}, std::vector<std::uint8_t>(8)));
    EXPECT_CONTAINS(read_error(dir_ / "float"), "holds float32 elements");

    write_raw(dir_ / "short", idx_bytes(0x00000803, {60000, 28, 28}, random_bytes(123, 5)));
    m = read_error(dir_ / "short");
    EXPECT_CONTAINS(m, (dir_ / "short").string());
    EXPECT_CONTAINS(m, "is truncated: header says 60000x28x28 = 47040000 bytes, file has 123 after "
                       "the header");

    write_raw(dir_ / "long", idx_bytes(0x00000801, {4}, random_bytes(5, 6)));
    EXPECT_CONTAINS(read_error(dir_ / "long"), "is too long: header says 4 = 4 bytes, file has 5");

    auto header = idx_bytes(0x00000803, {60000, 28, 28}, {});
    header.resize(9);
    write_raw(dir_ / "header", header);
    EXPECT_CONTAINS(read_error(dir_ / "header"),
                    "truncated header: 3 dimensions need 16 bytes, file has 9");
    write_raw(dir_ / "tiny", {0, 0});
    EXPECT_CONTAINS(read_error(dir_ / "tiny"), "truncated header: 2 bytes");

    m = read_error(dir_ / "does-not-exist");
    EXPECT_CONTAINS(m, "cannot open IDX file '" + (dir_ / "does-not-exist").string() +
                           "': No such file or directory");
}

TEST_F(IdxTest, CorruptAndTruncatedGzip) {
    write_gz(dir_ / "good.gz", idx_bytes(0x00000803, {50, 28, 28}, random_bytes(50 * 784, 7)));
    auto gz = trainscope::testing::file_bytes(dir_ / "good.gz");
    ASSERT_GT(gz.size(), 1000u);

    auto corrupt = gz;
    for (std::size_t i = 100; i < 140; ++i)
        corrupt[i] ^= 0x5a;
    write_raw(dir_ / "corrupt.gz", corrupt);
    auto m = read_error(dir_ / "corrupt.gz");
    EXPECT_CONTAINS(m, (dir_ / "corrupt.gz").string());
    EXPECT_CONTAINS(m, "gzip stream corrupt");

    std::vector<std::uint8_t> cut(gz.begin(), gz.begin() + static_cast<long>(gz.size() / 2));
    write_raw(dir_ / "cut.gz", cut);
    EXPECT_CONTAINS(read_error(dir_ / "cut.gz"),
                    "gzip stream corrupt (compressed data ends early, the file is truncated)");

    auto trailer = gz; // CRC mismatch: zlib's "incorrect data check"
    trailer[trailer.size() - 6] ^= 0xff;
    write_raw(dir_ / "crc.gz", trailer);
    EXPECT_CONTAINS(read_error(dir_ / "crc.gz"), "gzip stream corrupt (incorrect data check)");
}

TEST_F(IdxTest, ImageLabelPair) {
    auto images = random_bytes(6 * 5 * 4, 8);
    std::vector<std::uint8_t> labels{3, 0, 1, 3, 2, 1};
    write_gz(dir_ / "img", idx_bytes(0x00000803, {6, 5, 4}, images));
    write_raw(dir_ / "lbl", idx_bytes(0x00000801, {6}, labels));
    auto set = data::load_idx_pair((dir_ / "img").string(), (dir_ / "lbl").string(), 4);
    EXPECT_EQ(set.images.sizes(), (std::vector<std::int64_t>{6, 1, 5, 4}));
    EXPECT_EQ(set.images.scalar_type(), torch::kUInt8);
    EXPECT_EQ(set.labels.scalar_type(), torch::kInt64);
    EXPECT_EQ(set.num_classes, 4);
    EXPECT_EQ(set.images[2][0][3][1].item<int>(), images[2 * 20 + 3 * 4 + 1]);
    EXPECT_EQ(set.labels[4].item<std::int64_t>(), 2);

    write_raw(dir_ / "lbl5", idx_bytes(0x00000801, {5}, {0, 1, 2, 3, 4}));
    try {
        data::load_idx_pair((dir_ / "img").string(), (dir_ / "lbl5").string(), 10);
        FAIL() << "count mismatch accepted";
    } catch (const core::InputError& e) {
        EXPECT_CONTAINS(e.what(), "has 6 images but");
        EXPECT_CONTAINS(e.what(), "has 5 labels");
    }
    // Swapped arguments: a labels file where images are expected.
    EXPECT_THROW(data::load_idx_pair((dir_ / "lbl").string(), (dir_ / "img").string(), 10),
                 core::InputError);
}

// Issue 16: a label beyond the dataset's classes used to widen the head silently (200 classes
// for a 10-class dataset, validation accuracy ~0). It is refused, naming the file, the first bad
// label, its index, the class count and how many labels are bad; the largest valid label passes.
TEST_F(IdxTest, LabelsBeyondTheClassesAreRefused) {
    write_gz(dir_ / "img", idx_bytes(0x00000803, {6, 5, 4}, random_bytes(6 * 5 * 4, 8)));
    write_raw(dir_ / "ok", idx_bytes(0x00000801, {6}, {9, 0, 1, 9, 2, 1}));
    const auto ok = data::load_idx_pair((dir_ / "img").string(), (dir_ / "ok").string(), 10);
    EXPECT_EQ(ok.num_classes, 10); // the dataset's count, not the largest label + 1
    EXPECT_EQ(ok.labels[0].item<std::int64_t>(), 9);

    auto refused = [&](const std::vector<std::uint8_t>& labels, int classes) {
        write_raw(dir_ / "bad", idx_bytes(0x00000801, {6}, labels));
        try {
            data::load_idx_pair((dir_ / "img").string(), (dir_ / "bad").string(), classes);
        } catch (const core::InputError& e) {
            return std::string(e.what());
        }
        return std::string();
    };
    std::string m = refused({3, 0, 200, 1, 255, 2}, 10);
    EXPECT_CONTAINS(m, "IDX file '" + (dir_ / "bad").string() + "'");
    EXPECT_CONTAINS(m, "label 200 at index 2 is not a class of this dataset (10 classes, labels "
                       "0 to 9); 2 of its 6 labels are out of range");
    EXPECT_CONTAINS(m, "download or install it again");
    m = refused({0, 1, 2, 3, 4, 10}, 10); // the boundary: 10 classes are labels 0..9
    EXPECT_CONTAINS(m, "label 10 at index 5 is not a class of this dataset (10 classes");
    EXPECT_EQ(m.find("out of range"), std::string::npos) << m; // one bad label: no count
    EXPECT_CONTAINS(refused({0, 1, 2, 3, 4, 4}, 4), "label 4 at index 4");
}

TEST_F(IdxTest, DatasetLabelsBeyondTenClassesAreRefused) {
    // A Fashion-MNIST layout whose test labels hold a 200: refused with the file named.
    write_gz(dir_ / "train-images-idx3-ubyte.gz",
             idx_bytes(0x00000803, {4, 28, 28}, random_bytes(4 * 784, 11)));
    write_gz(dir_ / "train-labels-idx1-ubyte.gz", idx_bytes(0x00000801, {4}, {0, 1, 2, 3}));
    write_gz(dir_ / "t10k-images-idx3-ubyte.gz",
             idx_bytes(0x00000803, {2, 28, 28}, random_bytes(2 * 784, 12)));
    write_gz(dir_ / "t10k-labels-idx1-ubyte.gz", idx_bytes(0x00000801, {2}, {1, 200}));
    try {
        data::open_dataset(trainscope::testing::data_config({{"data.path", dir_.string()}}));
        FAIL() << "label 200 accepted for a 10-class dataset";
    } catch (const core::InputError& e) {
        EXPECT_CONTAINS(e.what(), "IDX file '" + (dir_ / "t10k-labels-idx1-ubyte.gz").string() +
                                      "': label 200 at index 1 is not a class of this dataset "
                                      "(10 classes");
    }
    // Labels 0..3 only: still the dataset's 10 classes (the head does not shrink either).
    write_gz(dir_ / "t10k-labels-idx1-ubyte.gz", idx_bytes(0x00000801, {2}, {1, 3}));
    const auto s =
        data::open_dataset(trainscope::testing::data_config({{"data.path", dir_.string()}}));
    EXPECT_EQ(s.num_classes(), 10);
    EXPECT_CONTAINS(s.description, "10 classes");
}

namespace {

using trainscope::testing::data_config;

} // namespace

TEST_F(IdxTest, OptionsDefaultsAndRanges) {
    auto o = data::data_options(data_config({}));
    EXPECT_EQ(o.dataset, "fashion-mnist");
    EXPECT_EQ(o.path, "/usr/share/datasets/fashion-mnist");
    EXPECT_EQ(o.synthetic_samples, 4096);
    EXPECT_EQ(o.synthetic_classes, 10);
    EXPECT_EQ(o.workers, 1);
    EXPECT_EQ(o.prefetch, 2);
    EXPECT_FALSE(o.pin_memory);
    EXPECT_TRUE(o.drop_last);
    EXPECT_EQ(o.image_size, 32);
    EXPECT_EQ(o.channels, 3);
    EXPECT_EQ(o.preprocess, data::Preprocess::Host);
    EXPECT_EQ(data::data_options(data_config({{"data.preprocess", "device"}})).preprocess,
              data::Preprocess::Device);
    EXPECT_THROW(data_config({{"data.preprocess", "gpu"}}), core::ConfigError);
    EXPECT_EQ(data::data_options(data_config({{"cv.channels", "1"}})).channels, 1);
    EXPECT_THROW(data_config({{"cv.channels", "2"}}), core::ConfigError);
    EXPECT_THROW(data_config({{"cv.image_size", "28"}}), core::ConfigError);
    EXPECT_THROW(data_config({{"cv.image_size", "31"}}), core::ConfigError);
    EXPECT_EQ(data::data_options(data_config({{"cv.image_size", "512"}})).image_size, 512);
    try {
        data_config({{"cv.image_size", "513"}});
        FAIL() << "cv.image_size=513 accepted";
    } catch (const core::ConfigError& e) {
        EXPECT_CONTAINS(e.what(), "cv.image_size");
        EXPECT_CONTAINS(e.what(), "513");
    }
    EXPECT_THROW(data_config({{"data.prefetch", "0"}}), core::ConfigError);
    EXPECT_THROW(data_config({{"data.dataset", "cifar10"}}), core::ConfigError);
}

TEST_F(IdxTest, MissingDatasetNamesPathAndFix) {
    try {
        data::open_dataset(data_config({{"data.path", (dir_ / "nowhere").string()}}));
        FAIL() << "missing dataset accepted";
    } catch (const core::InputError& e) {
        EXPECT_CONTAINS(e.what(), "'" + (dir_ / "nowhere" / "train-images-idx3-ubyte").string() +
                                      "(.gz)' not found");
        EXPECT_CONTAINS(e.what(), "install Debian's package dataset-fashion-mnist (scripts/setup "
                                  "does) or set data.path");
    }
}

TEST_F(IdxTest, MnistLayoutFromDataPath) {
    // A miniature MNIST directory: mixed raw and gzip files, 12 train / 4 test images.
    std::vector<std::uint8_t> train_labels{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1};
    write_gz(dir_ / "train-images-idx3-ubyte.gz",
             idx_bytes(0x00000803, {12, 28, 28}, random_bytes(12 * 784, 9)));
    write_raw(dir_ / "train-labels-idx1-ubyte", idx_bytes(0x00000801, {12}, train_labels));
    write_gz(dir_ / "t10k-images-idx3-ubyte.gz",
             idx_bytes(0x00000803, {4, 28, 28}, random_bytes(4 * 784, 10)));
    write_gz(dir_ / "t10k-labels-idx1-ubyte.gz", idx_bytes(0x00000801, {4}, {9, 8, 7, 6}));
    auto s =
        data::open_dataset(data_config({{"data.dataset", "mnist"}, {"data.path", dir_.string()}}));
    EXPECT_EQ(s.train.size(), 12);
    EXPECT_EQ(s.test.size(), 4);
    EXPECT_EQ(s.train.num_classes, 10);
    EXPECT_FLOAT_EQ(s.train.mean, 0.1307f);
    EXPECT_FLOAT_EQ(s.test.std, 0.3081f);
    EXPECT_CONTAINS(s.description, "MNIST from " + dir_.string() + ": 12 train + 4 test");
}

TEST(FashionMnist, InstalledDatasetIsComplete) {
    const std::string dir = "/usr/share/datasets/fashion-mnist";
    if (!fs::is_directory(dir))
        GTEST_SKIP() << dir << " absent: install Debian's dataset-fashion-mnist (scripts/setup)";
    core::OptionRegistry r;
    data::declare_options(r);
    auto s = data::open_dataset(core::Config::from_values(r, {}));
    EXPECT_EQ(s.train.images.sizes(), (std::vector<std::int64_t>{60000, 1, 28, 28}));
    EXPECT_EQ(s.test.images.sizes(), (std::vector<std::int64_t>{10000, 1, 28, 28}));
    EXPECT_EQ(s.train.num_classes, 10);
    auto train_counts = torch::bincount(s.train.labels);
    auto test_counts = torch::bincount(s.test.labels);
    ASSERT_EQ(train_counts.size(0), 10);
    EXPECT_TRUE(torch::equal(train_counts, torch::full({10}, 6000, torch::kInt64)));
    EXPECT_TRUE(torch::equal(test_counts, torch::full({10}, 1000, torch::kInt64)));
    // The published normalisation constants are the training set's statistics.
    auto x = s.train.images.to(torch::kFloat64).div(255.0);
    EXPECT_NEAR(x.mean().item<double>(), s.train.mean, 1e-3);
    EXPECT_NEAR(x.std().item<double>(), s.train.std, 1e-3);
}

TEST(Synthetic, DeterministicBalancedAndLearnable) {
    auto a = data::make_synthetic(600, 1, 28, 28, 10, 123);
    auto b = data::make_synthetic(600, 1, 28, 28, 10, 123);
    auto c = data::make_synthetic(600, 1, 28, 28, 10, 124);
    EXPECT_EQ(a.images.sizes(), (std::vector<std::int64_t>{600, 1, 28, 28}));
    EXPECT_TRUE(torch::equal(a.images, b.images));
    EXPECT_TRUE(torch::equal(a.labels, b.labels));
    EXPECT_FALSE(torch::equal(a.images, c.images));
    EXPECT_TRUE(torch::equal(torch::bincount(a.labels), torch::full({10}, 60, torch::kInt64)));

    // Learnable: a nearest-class-mean classifier fitted on the first 500 images labels the other
    // 100 far above chance (10 %).
    auto x = a.images.to(torch::kFloat32).view({600, -1}); // [600, 784]
    auto train = x.narrow(0, 0, 500), test = x.narrow(0, 500, 100);
    auto ytrain = a.labels.narrow(0, 0, 500), ytest = a.labels.narrow(0, 500, 100);
    std::vector<torch::Tensor> means;
    for (int k = 0; k < 10; ++k)
        means.push_back(train.index({ytrain == k}).mean(0));
    auto centres = torch::stack(means);                     // [10, 784]
    auto predicted = torch::cdist(test, centres).argmin(1); // [100]
    EXPECT_GT(predicted.eq(ytest).sum().item<std::int64_t>(), 90);

    core::OptionRegistry r;
    data::declare_options(r);
    auto s = data::open_dataset(core::Config::from_values(
        r, {{"data.dataset", "synthetic"}, {"data.synthetic_samples", "400"}}));
    EXPECT_EQ(s.train.size(), 400);
    EXPECT_EQ(s.test.size(), 100);
    EXPECT_EQ(s.train.images.sizes().slice(1), (std::vector<std::int64_t>{1, 28, 28}));
    EXPECT_FLOAT_EQ(s.train.mean, 0.5f);
}
