// data.dataset=imagefolder: the test writes a small ImageNet-layout tree itself (PNG through
// libpng, JPEG through TurboJPEG; RGB, gray, RGBA, palette; different sizes) and checks labels and
// order, decoded pixels, the eval transform against hand-computed values, the random crop's
// torchvision semantics and determinism across worker counts, and the error messages.
#include <gtest/gtest.h>
#include <png.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "data_test_util.hpp"
#include "test_util.hpp"
#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/data/datasets.hpp"
#include "trainscope/data/image_decoder.hpp"
#include "trainscope/data/image_folder.hpp"
#include "trainscope/data/loader.hpp"
#include "trainscope/data/options.hpp"

namespace fs = std::filesystem;
using namespace trainscope;
using data::ImageFolderTransform;

namespace {

#define EXPECT_CONTAINS(text, part)                                                                \
    EXPECT_NE(std::string(text).find(part), std::string::npos) << "message: " << (text)

// 8-bit pixels, row-major [h, w, channels].
struct Pixels {
    int width = 0, height = 0, channels = 3;
    std::vector<std::uint8_t> v;
    // The RGB image a decoder must produce (gray replicated, alpha dropped).
    std::vector<std::uint8_t> rgb() const {
        std::vector<std::uint8_t> out;
        for (std::size_t p = 0; p < v.size() / channels; ++p)
            for (int c = 0; c < 3; ++c)
                out.push_back(v[p * channels + (channels < 3 ? 0 : c)]);
        return out;
    }
};

// A smooth pattern (JPEG keeps it within a few grey levels), different per `seed`.
Pixels pattern(int width, int height, int channels, int seed) {
    Pixels p{width, height, channels, {}};
    for (int y = 0; y < height; ++y)
        for (int x = 0; x < width; ++x)
            for (int c = 0; c < channels; ++c)
                p.v.push_back(static_cast<std::uint8_t>(
                    c == 3 ? (x * 255) / std::max(1, width - 1) // alpha, 0 included
                           : 10 + 4 * seed + x * 120 / width + y * 60 / height + c * 25));
    return p;
}

Pixels constant(int width, int height, std::uint8_t r, std::uint8_t g, std::uint8_t b) {
    Pixels p{width, height, 3, {}};
    for (int i = 0; i < width * height; ++i)
        p.v.insert(p.v.end(), {r, g, b});
    return p;
}

void write_png(const fs::path& path, const Pixels& p) {
    png_image img;
    std::memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = static_cast<png_uint_32>(p.width);
    img.height = static_cast<png_uint_32>(p.height);
    img.format = p.channels == 1   ? PNG_FORMAT_GRAY
                 : p.channels == 3 ? PNG_FORMAT_RGB
                                   : PNG_FORMAT_RGBA;
    ASSERT_NE(png_image_write_to_file(&img, path.c_str(), 0, p.v.data(), 0, nullptr), 0)
        << img.message;
}

// A palette PNG: `indices` [h, w] into `palette` (RGB triplets).
void write_palette_png(const fs::path& path, int width, int height,
                       const std::vector<std::uint8_t>& indices,
                       const std::vector<std::uint8_t>& palette) {
    png_image img;
    std::memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = static_cast<png_uint_32>(width);
    img.height = static_cast<png_uint_32>(height);
    img.format = PNG_FORMAT_RGB_COLORMAP;
    img.colormap_entries = static_cast<png_uint_32>(palette.size() / 3);
    ASSERT_NE(png_image_write_to_file(&img, path.c_str(), 0, indices.data(), 0, palette.data()), 0)
        << img.message;
}

void write_jpeg(const fs::path& path, const Pixels& p) {
    tjhandle tj = tjInitCompress();
    ASSERT_NE(tj, nullptr);
    unsigned char* jpeg = nullptr;
    unsigned long size = 0;
    const bool gray = p.channels == 1;
    ASSERT_EQ(tjCompress2(tj, p.v.data(), p.width, 0, p.height, gray ? TJPF_GRAY : TJPF_RGB, &jpeg,
                          &size, gray ? TJSAMP_GRAY : TJSAMP_444, /*quality=*/100,
                          TJFLAG_ACCURATEDCT),
              0)
        << tjGetErrorStr2(tj);
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(jpeg), size);
    tjFree(jpeg);
    tjDestroy(tj);
}

void write_bytes(const fs::path& p, const std::vector<std::uint8_t>& b) {
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

torch::Tensor as_tensor(const std::vector<std::uint8_t>& rgb, int height, int width) {
    return torch::tensor(std::vector<std::int64_t>(rgb.begin(), rgb.end()))
        .view({height, width, 3})
        .to(torch::kUInt8);
}

// (v / 255 - mean_c) / std_c of a float32 [3, ...] tensor of pixel values, as torchvision.
torch::Tensor normalise(torch::Tensor x) {
    x = x.div(255.0);
    for (int c = 0; c < 3; ++c)
        x[c].sub_(data::kImageNetMean[c]).div_(data::kImageNetStd[c]);
    return x;
}

using trainscope::testing::data_config;

struct Expected {
    std::vector<std::uint8_t> rgb;
    int height, width;
    bool lossy; // JPEG
};

// root/{train,val}/{ant,bird,cat}/..., 12 training images in 3 classes plus 4 validation images.
class ImageFolderTest : public ::testing::Test {
  protected:
    void SetUp() override {
        root_ = fs::temp_directory_path() /
                ("trainscope_imagefolder_" + std::to_string(::getpid()) + "_" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(root_);
        for (const char* split : {"train", "val"})
            for (const char* cls : {"cat", "ant", "bird"})
                fs::create_directories(root_ / split / cls);
        fs::create_directories(root_ / "train" / "bird" / "sub");
        auto t = root_ / "train";
        add_jpeg(t / "ant" / "a0.jpg", pattern(33, 47, 3, 0));
        add_png(t / "ant" / "a1.png", pattern(40, 30, 3, 1));
        add_png(t / "ant" / "a2.Png", pattern(64, 20, 3, 2));
        add_jpeg(t / "ant" / "a3.jpeg", pattern(50, 50, 3, 3));
        add_png(t / "bird" / "b0.png", pattern(28, 28, 3, 4));
        add_jpeg(t / "bird" / "b1.JPG", pattern(45, 31, 3, 5));
        add_jpeg(t / "bird" / "z.jpeg", pattern(26, 38, 1, 6));       // grayscale JPEG
        add_png(t / "bird" / "sub" / "a.png", pattern(20, 64, 1, 7)); // grayscale PNG
        add_png(t / "cat" / "c0.png", constant(37, 29, 200, 100, 50));
        add_jpeg(t / "cat" / "c1.jpg", pattern(60, 44, 3, 8));
        add_png(t / "cat" / "c2.png", pattern(30, 36, 4, 9)); // RGBA
        // Palette PNG: 4 colours in vertical stripes.
        const std::vector<std::uint8_t> palette{255, 0, 0, 0, 255, 0, 0, 0, 255, 17, 34, 51};
        std::vector<std::uint8_t> indices, rgb;
        for (int y = 0; y < 21; ++y)
            for (int x = 0; x < 35; ++x) {
                indices.push_back(static_cast<std::uint8_t>(x % 4));
                rgb.insert(rgb.end(), palette.begin() + 3 * (x % 4),
                           palette.begin() + 3 * (x % 4) + 3);
            }
        write_palette_png(t / "cat" / "c3.png", 35, 21, indices, palette);
        expected_[(t / "cat" / "c3.png").string()] = {rgb, 21, 35, false};
        // Ignored: other extensions, files without one.
        std::ofstream(t / "ant" / "notes.txt") << "not an image";
        std::ofstream(t / "cat" / "README") << "not an image";
        std::ofstream(root_ / "train" / "LICENSE") << "not a class";

        auto v = root_ / "val";
        add_png(v / "ant" / "disguised.jpg", pattern(32, 32, 3, 10)); // PNG named .jpg
        add_jpeg(v / "bird" / "v0.jpg", pattern(48, 40, 3, 11));
        add_jpeg(v / "bird" / "v1.jpg", pattern(40, 48, 3, 12));
        add_png(v / "cat" / "v2.png", constant(50, 70, 10, 240, 128));
    }
    void TearDown() override { fs::remove_all(root_); }

    void add_png(const fs::path& p, const Pixels& px) {
        write_png(p, px);
        expected_[p.string()] = {px.rgb(), px.height, px.width, false};
    }
    void add_jpeg(const fs::path& p, const Pixels& px) {
        write_jpeg(p, px);
        expected_[p.string()] = {px.rgb(), px.height, px.width, true};
    }

    data::DatasetSplits open() {
        return data::open_dataset(
            data_config({{"data.dataset", "imagefolder"}, {"data.path", root_.string()}}));
    }

    fs::path root_;
    std::map<std::string, Expected> expected_;
};

} // namespace

TEST_F(ImageFolderTest, ClassesLabelsAndOrderAsTorchvision) {
    auto s = open();
    ASSERT_TRUE(s.is_image_folder());
    EXPECT_EQ(s.name, "imagefolder");
    const auto& f = *s.train_folder;
    EXPECT_EQ(f.classes, (std::vector<std::string>{"ant", "bird", "cat"}));
    EXPECT_EQ(s.num_classes(), 3);
    EXPECT_EQ(s.size(data::Split::Train), 12);
    EXPECT_EQ(s.size(data::Split::Test), 4);
    // Inside a class: the class directory's files by name, then its sub-directories (torchvision's
    // sorted os.walk), so bird/z.jpeg comes before bird/sub/a.png.
    const fs::path t = root_ / "train";
    const std::vector<fs::path> files{t / "ant/a0.jpg",  t / "ant/a1.png",     t / "ant/a2.Png",
                                      t / "ant/a3.jpeg", t / "bird/b0.png",    t / "bird/b1.JPG",
                                      t / "bird/z.jpeg", t / "bird/sub/a.png", t / "cat/c0.png",
                                      t / "cat/c1.jpg",  t / "cat/c2.png",     t / "cat/c3.png"};
    ASSERT_EQ(f.files.size(), files.size());
    for (std::size_t i = 0; i < files.size(); ++i) {
        EXPECT_EQ(f.files[i], files[i].string());
        EXPECT_EQ(f.labels[i], static_cast<std::int64_t>(i / 4));
    }
    EXPECT_EQ(s.test_folder->labels, (std::vector<std::int64_t>{0, 1, 1, 2}));
    EXPECT_CONTAINS(s.description, "image folder " + root_.string() + ": 12 train + 4 val images");
    EXPECT_CONTAINS(s.description, "3 classes");
}

TEST_F(ImageFolderTest, DecodedPixels) {
    ASSERT_EQ(expected_.size(), 16u);
    for (const auto& [path, e] : expected_) {
        SCOPED_TRACE(path);
        auto img = data::decode_image_file(path);
        ASSERT_EQ(img.height, e.height);
        ASSERT_EQ(img.width, e.width);
        ASSERT_EQ(img.rgb.size(), e.rgb.size());
        if (!e.lossy) {
            EXPECT_EQ(img.rgb, e.rgb); // PNG (gray replicated, alpha dropped, palette looked up)
            continue;
        }
        // JPEG at quality 100, 4:4:4: within a few grey levels of the encoded pattern.
        int worst = 0;
        double sum = 0;
        for (std::size_t i = 0; i < e.rgb.size(); ++i) {
            const int d = std::abs(int(img.rgb[i]) - int(e.rgb[i]));
            worst = std::max(worst, d);
            sum += d;
        }
        EXPECT_LE(worst, 6);
        EXPECT_LE(sum / static_cast<double>(e.rgb.size()), 1.0);
    }
    // A grayscale JPEG becomes three equal channels.
    auto gray = data::decode_image_file((root_ / "train/bird/z.jpeg").string());
    for (std::size_t p = 0; p < gray.rgb.size(); p += 3) {
        ASSERT_EQ(gray.rgb[p], gray.rgb[p + 1]);
        ASSERT_EQ(gray.rgb[p], gray.rgb[p + 2]);
    }
}

TEST(ImageFolderTransforms, EvalResizeAndCentreCropExact) {
    EXPECT_EQ(data::eval_resize_size(224), 256);
    EXPECT_EQ(data::eval_resize_size(32), 37);   // 36.57
    EXPECT_EQ(data::eval_resize_size(512), 585); // 585.14
    ImageFolderTransform eval{32, /*train=*/false, 0};

    // 74x74, v(x) = 3x: shrunk by exactly 2 to 37x37 (antialiased: weights 1/8, 3/8, 3/8, 1/8 on
    // columns 2j-1..2j+2) column j is 3 * (2j + 0.5); the centre crop starts at round(2.5) = 2
    // (half to even), so output column x is 6 (x + 2) + 1.5 on every row and channel.
    auto ramp = (torch::arange(74, torch::kInt64) * 3).to(torch::kUInt8);
    auto img = ramp.view({1, 74, 1}).expand({74, 74, 3}).contiguous(); // [H, W, 3]
    auto out = eval(img, /*epoch=*/5, /*index=*/3);
    ASSERT_EQ(out.sizes(), (std::vector<std::int64_t>{3, 32, 32}));
    auto columns = torch::arange(32, torch::kFloat32).add(2).mul(6).add(1.5);
    auto expected = normalise(columns.view({1, 1, 32}).expand({3, 32, 32}).clone());
    EXPECT_TRUE(torch::allclose(out, expected, 1e-5, 1e-5)) << (out - expected).abs().max();

    // 50x81, v = 2x + y: shorter side 50 → 37, longer int(37 * 81 / 50) = int(59.94) = 59
    // (truncated as torchvision, not rounded), then rows from round(2.5) = 2 and columns from
    // round(13.5) = 14.
    auto x = torch::arange(81, torch::kInt64).mul(2).view({1, 81});
    auto y = torch::arange(50, torch::kInt64).view({50, 1});
    auto grad = (x + y).to(torch::kUInt8).unsqueeze(2).expand({50, 81, 3}).contiguous();
    namespace F = torch::nn::functional;
    auto resized = F::interpolate(grad.permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat32),
                                  F::InterpolateFuncOptions()
                                      .size(std::vector<std::int64_t>{37, 59})
                                      .mode(torch::kBilinear)
                                      .align_corners(false)
                                      .antialias(true))[0]; // [3, 37, 59]
    auto reference = normalise(resized.narrow(1, 2, 32).narrow(2, 14, 32).contiguous());
    EXPECT_TRUE(torch::allclose(eval(grad, 0, 0), reference, 1e-5, 1e-5));

    // A constant image stays constant (any shape, train or eval).
    auto flat = torch::full({45, 23, 3}, 77, torch::kUInt8);
    flat.select(2, 1).fill_(130);
    auto level =
        normalise(torch::tensor({77.0f, 130.0f, 77.0f}).view({3, 1, 1}).expand({3, 32, 32}));
    EXPECT_TRUE(torch::allclose(eval(flat, 0, 0), level, 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(ImageFolderTransform{32, true, 9}(flat, 2, 7), level, 1e-5, 1e-5));
}

TEST(ImageFolderTransforms, RandomResizedCropAsTorchvision) {
    // Fallback after 10 failed draws: no box of >= 8 % of a 10x1000 strip fits with ratio
    // <= 4/3, so the centre crop clamped to ratio 4/3 is taken: h = 10, w = round(13.33) = 13,
    // left = (1000 - 13) // 2.
    for (std::int64_t index = 0; index < 20; ++index) {
        auto wide = data::draw_train_augmentation(10, 1000, 1, 0, index).box;
        EXPECT_EQ(wide.top, 0);
        EXPECT_EQ(wide.height, 10);
        EXPECT_EQ(wide.width, 13);
        EXPECT_EQ(wide.left, 493);
        auto tall = data::draw_train_augmentation(1000, 10, 1, 0, index).box;
        EXPECT_EQ(tall.width, 10);
        EXPECT_EQ(tall.height, 13);
        EXPECT_EQ(tall.top, 493);
        EXPECT_EQ(tall.left, 0);
    }
    // On a 200x300 image the draws succeed: boxes inside the image, area 8..100 % and aspect
    // ratio 3/4..4/3 (up to rounding of the sides), flips half of the time, and the same draw for
    // the same (seed, epoch, index) only.
    int flips = 0, changed = 0;
    double min_area = 1, max_area = 0;
    for (std::int64_t i = 0; i < 2000; ++i) {
        auto a = data::draw_train_augmentation(200, 300, 42, 3, i);
        const auto& b = a.box;
        ASSERT_GE(b.top, 0);
        ASSERT_GE(b.left, 0);
        ASSERT_LE(b.top + b.height, 200);
        ASSERT_LE(b.left + b.width, 300);
        const double area = double(b.height * b.width) / (200.0 * 300.0);
        min_area = std::min(min_area, area);
        max_area = std::max(max_area, area);
        const double ratio = double(b.width) / double(b.height);
        EXPECT_GE(ratio, 0.74);
        EXPECT_LE(ratio, 1.35);
        flips += a.flip;
        auto again = data::draw_train_augmentation(200, 300, 42, 3, i);
        EXPECT_EQ(again.box.top, b.top);
        EXPECT_EQ(again.box.left, b.left);
        EXPECT_EQ(again.box.width, b.width);
        EXPECT_EQ(again.flip, a.flip);
        auto other = data::draw_train_augmentation(200, 300, 42, 4, i).box;
        changed += other.top != b.top || other.left != b.left || other.width != b.width;
    }
    EXPECT_GT(min_area, 0.079);
    EXPECT_LT(min_area, 0.1);
    EXPECT_GT(max_area, 0.6);
    EXPECT_LE(max_area, 1.0);
    EXPECT_GT(flips, 900);
    EXPECT_LT(flips, 1100);
    EXPECT_GT(changed, 1900);
}

TEST_F(ImageFolderTest, LoaderBatchesDeterministicForAnyWorkerCount) {
    auto s = open();
    data::AdaptedTransform shape{3, 32, 0.5f, 0.5f}; // only image_size matters for image folders
    auto train = data::make_batch_source(s, data::Split::Train, shape, data::Preprocess::Host, 7);
    auto val = data::make_batch_source(s, data::Split::Test, shape, data::Preprocess::Host, 7);
    const std::vector<std::int64_t> order{5, 11, 0, 8, 3, 9, 1, 7, 10, 2, 4, 6};

    data::Loader serial(train, order, /*epoch=*/1, 5, 0, 1, false, false);
    auto ref = trainscope::testing::drain(serial);
    ASSERT_EQ(ref.size(), 3u);
    EXPECT_EQ(ref[0].images.sizes(), (std::vector<std::int64_t>{5, 3, 32, 32}));
    EXPECT_EQ(ref[2].images.sizes(), (std::vector<std::int64_t>{2, 3, 32, 32}));
    for (std::size_t k = 0; k < ref.size(); ++k)
        for (std::int64_t i = 0; i < ref[k].size; ++i)
            EXPECT_EQ(ref[k].labels[i].item<std::int64_t>(),
                      s.train_folder->labels[static_cast<std::size_t>(order[5 * k + i])]);
    for (auto [workers, prefetch] : {std::pair{2, 1}, {2, 3}, {3, 2}}) {
        SCOPED_TRACE("workers " + std::to_string(workers));
        data::Loader threaded(train, order, 1, 5, workers, prefetch, false, false);
        auto got = trainscope::testing::drain(threaded);
        ASSERT_EQ(got.size(), ref.size());
        for (std::size_t k = 0; k < got.size(); ++k) {
            EXPECT_TRUE(torch::equal(got[k].images, ref[k].images)) << "batch " << k;
            EXPECT_TRUE(torch::equal(got[k].labels, ref[k].labels));
        }
    }

    // Row 8 (cat/c0.png) is a constant colour: every crop gives the same normalised constant.
    auto level =
        normalise(torch::tensor({200.0f, 100.0f, 50.0f}).view({3, 1, 1}).expand({3, 32, 32}));
    EXPECT_TRUE(torch::allclose(ref[0].images[3], level, 1e-5, 1e-5));
    // Row 4 (bird/b0.png, lossless): the crop and flip drawn from (seed 7, epoch 1, row 4).
    const auto& e = expected_.at((root_ / "train/bird/b0.png").string());
    auto img = as_tensor(e.rgb, e.height, e.width);
    auto a = data::draw_train_augmentation(e.height, e.width, 7, 1, 4);
    namespace F = torch::nn::functional;
    auto crop = F::interpolate(img.narrow(0, a.box.top, a.box.height)
                                   .narrow(1, a.box.left, a.box.width)
                                   .permute({2, 0, 1})
                                   .unsqueeze(0)
                                   .to(torch::kFloat32),
                               F::InterpolateFuncOptions()
                                   .size(std::vector<std::int64_t>{32, 32})
                                   .mode(torch::kBilinear)
                                   .align_corners(false)
                                   .antialias(true))[0]; // [3, 32, 32]
    if (a.flip) crop = crop.flip({2});
    EXPECT_TRUE(torch::allclose(ref[2].images[0], normalise(crop), 1e-5, 1e-5));

    // Another epoch draws other crops; evaluation has no randomness.
    data::Loader epoch2(train, order, 2, 5, 0, 1, false, false);
    EXPECT_FALSE(torch::equal(epoch2.next()->images, ref[0].images));
    data::Loader v1(val, {0, 1, 2, 3}, 1, 4, 0, 1, false, false);
    data::Loader v2(val, {0, 1, 2, 3}, 9, 4, 2, 2, false, false);
    auto b1 = v1.next(), b2 = v2.next();
    EXPECT_TRUE(torch::equal(b1->images, b2->images));
    EXPECT_TRUE(torch::equal(b1->labels, torch::tensor({0, 1, 1, 2}, torch::kInt64)));
    auto val_level =
        normalise(torch::tensor({10.0f, 240.0f, 128.0f}).view({3, 1, 1}).expand({3, 32, 32}));
    EXPECT_TRUE(torch::allclose(b1->images[3], val_level, 1e-5, 1e-5));
}

TEST_F(ImageFolderTest, CorruptImagesNameTheFile) {
    // Truncated JPEG (libjpeg would fill the rest with grey), truncated PNG, not an image.
    const fs::path jpeg = root_ / "train/ant/a3.jpeg", png = root_ / "train/cat/c2.png",
                   text = root_ / "train/bird/b0.png";
    auto jb = trainscope::testing::file_bytes(jpeg);
    write_bytes(jpeg, std::vector<std::uint8_t>(jb.begin(), jb.begin() + jb.size() / 2));
    auto pb = trainscope::testing::file_bytes(png);
    write_bytes(png, std::vector<std::uint8_t>(pb.begin(), pb.begin() + pb.size() / 2));
    std::ofstream(text) << "plain text with an image's name";
    auto message = [](const fs::path& p) -> std::string {
        try {
            data::decode_image_file(p.string());
        } catch (const core::InputError& e) {
            return e.what();
        }
        ADD_FAILURE() << p << " decoded";
        return "";
    };
    auto m = message(jpeg);
    EXPECT_CONTAINS(m, "image '" + jpeg.string() + "' is a corrupt or truncated JPEG file");
    m = message(png);
    EXPECT_CONTAINS(m, "image '" + png.string() + "' is a corrupt or truncated PNG file");
    EXPECT_CONTAINS(message(text), "is neither a JPEG nor a PNG file");
    EXPECT_CONTAINS(message(root_ / "missing.png"), "cannot open image");

    // Through the loader: the worker's error surfaces from next(), naming the file.
    auto s = open();
    auto train = data::make_batch_source(s, data::Split::Train, {3, 32, 0.5f, 0.5f},
                                         data::Preprocess::Host, 1);
    for (int workers : {0, 2}) {
        data::Loader loader(train, {0, 1, 2, 3}, 0, 2, workers, 2, false, false);
        EXPECT_TRUE(loader.next().has_value()); // a0, a1 are fine
        try {
            loader.next();
            FAIL() << "truncated JPEG accepted";
        } catch (const core::InputError& e) {
            EXPECT_CONTAINS(e.what(), jpeg.string());
        }
    }
}

// A chunk of a PNG stream: length, type, data, CRC over type and data.
void png_chunk(std::string& out, const char* type, const std::string& data) {
    auto be32 = [&](std::uint32_t v) {
        for (int shift : {24, 16, 8, 0})
            out.push_back(static_cast<char>((v >> shift) & 0xFF));
    };
    be32(static_cast<std::uint32_t>(data.size()));
    const std::string body = std::string(type, 4) + data;
    out += body;
    be32(static_cast<std::uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size()))));
}

TEST(ImageDecoder, EmptyFilesAndHugeDeclaredSizesAreRefusedBeforeDecoding) {
    auto message = [](const std::string& bytes) -> std::string {
        try {
            data::decode_image(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size(),
                               "x.img");
        } catch (const core::InputError& e) {
            return e.what();
        }
        ADD_FAILURE() << "decoded";
        return "";
    };
    EXPECT_CONTAINS(message(""), "image 'x.img' is empty (0 bytes");
    // PNG: IHDR 100000 x 100000, 8-bit RGB, and a 1-byte IDAT: 40 GB if allocated.
    std::string png = "\x89PNG\r\n\x1a\n";
    png_chunk(png, "IHDR", std::string("\x00\x01\x86\xa0\x00\x01\x86\xa0\x08\x02\x00\x00\x00", 13));
    png_chunk(png, "IDAT", std::string("\x78\x9c\x03\x00\x00\x00\x00\x01", 8));
    png_chunk(png, "IEND", "");
    EXPECT_CONTAINS(message(png), "is a PNG of 100000x100000 pixels, more than the 268435456");
    // JPEG: SOI, SOF0 declaring 60000 x 60000 (libjpeg reads up to 65500) with 3 components, SOS,
    // EOI.
    const std::string jpeg("\xff\xd8"
                           "\xff\xc0\x00\x11\x08\xea\x60\xea\x60\x03"
                           "\x01\x11\x00\x02\x11\x00\x03\x11\x00"
                           "\xff\xda\x00\x0c\x03\x01\x00\x02\x00\x03\x00\x00\x3f\x00"
                           "\xff\xd9",
                           37);
    EXPECT_CONTAINS(message(jpeg), "x.img' is a JPEG of 60000x60000 pixels");
}

TEST_F(ImageFolderTest, LayoutErrorsNamePathAndExpectedLayout) {
    fs::remove_all(root_ / "val");
    try {
        open();
        FAIL() << "missing val/ accepted";
    } catch (const core::InputError& e) {
        EXPECT_CONTAINS(e.what(), "'" + (root_ / "val").string() + "' not found");
        EXPECT_CONTAINS(e.what(), "expected data.path/train/<class>/<image> and "
                                  "data.path/val/<class>/<image>");
    }
    fs::create_directories(root_ / "val");
    try {
        open();
        FAIL() << "val/ without classes accepted";
    } catch (const core::InputError& e) {
        EXPECT_CONTAINS(e.what(),
                        "'" + (root_ / "val").string() + "' has no class sub-directories");
    }
    fs::create_directories(root_ / "val" / "ant");
    std::ofstream(root_ / "val" / "ant" / "labels.csv") << "x";
    try {
        open();
        FAIL() << "class without images accepted";
    } catch (const core::InputError& e) {
        EXPECT_CONTAINS(e.what(), "class directory '" + (root_ / "val" / "ant").string() +
                                      "' holds no .jpg/.jpeg/.png file");
    }
    write_png(root_ / "val" / "ant" / "x.png", pattern(8, 8, 3, 0));
    try {
        open();
        FAIL() << "different classes accepted";
    } catch (const core::InputError& e) {
        EXPECT_CONTAINS(e.what(), "has 3 classes and '" + (root_ / "val").string() + "' 1");
    }
}

TEST_F(ImageFolderTest, OptionCombinations) {
    try {
        data::data_options(
            data_config({{"data.dataset", "imagefolder"}, {"data.preprocess", "device"}}));
        FAIL() << "imagefolder with data.preprocess=device accepted";
    } catch (const core::ConfigError& e) {
        EXPECT_CONTAINS(e.what(), "data.preprocess=device cannot be used with "
                                  "data.dataset=imagefolder");
    }
    EXPECT_THROW(data::data_options(data_config({{"data.dataset", "imagefolder"},
                                                 {"data.path", root_.string()},
                                                 {"cv.channels", "1"}})),
                 core::ConfigError);
    auto s = open();
    EXPECT_THROW(data::make_batch_source(s, data::Split::Train, {3, 32, 0.5f, 0.5f},
                                         data::Preprocess::Device, 0),
                 core::ConfigError);
}
