// Datasets and the adapted-MNIST transform (see datasets.hpp): IDX pairs become uint8 tensors once
// at start-up; the transform runs per batch in the loader's worker threads.
#include "trainscope/data/datasets.hpp"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <sstream>

#include "random_internal.hpp"
#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/data/idx_reader.hpp"
#include "trainscope/data/image_folder.hpp"

namespace trainscope::data {
namespace {

using core::InputError;
using detail::unit;

// Published pixel statistics (after scaling to [0, 1]) used by the PyTorch studies.
constexpr float kFashionMnistMean = 0.2860f, kFashionMnistStd = 0.3530f;
constexpr float kMnistMean = 0.1307f, kMnistStd = 0.3081f;
// The synthetic set does not depend on run.seed: like a file, it is the same data on every run.
constexpr std::uint64_t kSyntheticSeed = 0x7ea15c09e5eedULL;
constexpr int kMnistSide = 28;
// MNIST (digits) and Fashion-MNIST (garment kinds) both have 10 classes, labels 0-9.
constexpr int kMnistClasses = 10;

std::string shape_text(const torch::Tensor& t) {
    std::ostringstream s;
    s << t.sizes();
    return s.str();
}

// "<dir>/<base>" or "<dir>/<base>.gz", whichever exists (uncompressed first).
std::string find_idx_file(const DataOptions& o, const std::string& base) {
    namespace fs = std::filesystem;
    const fs::path dir(o.path);
    for (const fs::path& p : {dir / base, dir / (base + ".gz")}) {
        std::error_code ec;
        if (fs::is_regular_file(p, ec)) return p.string();
    }
    // A directory (or device, FIFO) where the file belongs: name it rather than "not found".
    for (const fs::path& p : {dir / base, dir / (base + ".gz")})
        if (std::error_code ec; fs::exists(p, ec))
            throw InputError("data.dataset=" + o.dataset + ": '" + p.string() +
                             "' is not a regular file" +
                             (fs::is_directory(p, ec) ? " but a directory" : "") +
                             " (data.path=" + o.path + "): replace it by the IDX file");
    const std::string tried = (dir / base).string() + "(.gz)";
    std::string fix =
        o.dataset == "fashion-mnist"
            ? "install Debian's package dataset-fashion-mnist (scripts/setup does) or set "
              "data.path to the directory holding the Fashion-MNIST IDX files"
            : "set data.path to a directory holding the MNIST IDX files "
              "(train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-...)";
    throw InputError("data.dataset=" + o.dataset + ": '" + tried +
                     "' not found (data.path=" + o.path + "): " + fix);
}

} // namespace

ImageSet load_idx_pair(const std::string& images_path, const std::string& labels_path,
                       int num_classes) {
    IdxArray im = read_idx(images_path);
    IdxArray lb = read_idx(labels_path);
    if (im.dims.size() != 3)
        throw InputError("IDX file '" + images_path + "' holds a " + format_dims(im.dims) +
                         " array, not images (expected N x height x width, magic 0x00000803)");
    if (lb.dims.size() != 1)
        throw InputError("IDX file '" + labels_path + "' holds a " + format_dims(lb.dims) +
                         " array, not labels (expected N, magic 0x00000801)");
    if (im.dims[0] != lb.dims[0])
        throw InputError("'" + images_path + "' has " + std::to_string(im.dims[0]) +
                         " images but '" + labels_path + "' has " + std::to_string(lb.dims[0]) +
                         " labels: the files do not belong together");
    const std::int64_t n = im.dims[0], h = im.dims[1], w = im.dims[2];
    if (n == 0 || h == 0 || w == 0) // the header fits the file, but there is nothing to train on
        throw InputError("IDX file '" + images_path + "' holds " + format_dims(im.dims) +
                         " images: " + (n == 0 ? "no images" : "images without pixels") +
                         "; download or install the file again");

    ImageSet set;
    set.images = torch::empty({n, 1, h, w}, torch::kUInt8); // [N, 1, H, W]
    if (!im.data.empty())
        std::memcpy(set.images.data_ptr<std::uint8_t>(), im.data.data(), im.data.size());
    // A label outside the classes would train silently (cross-entropy over a head sized by the
    // largest label, validation accuracy near 0): refuse it, naming the first and the count.
    std::int64_t bad = 0, first_bad = -1;
    for (std::int64_t i = 0; i < n; ++i)
        if (lb.data[static_cast<std::size_t>(i)] >= num_classes && bad++ == 0) first_bad = i;
    if (bad > 0)
        throw InputError("IDX file '" + labels_path + "': label " +
                         std::to_string(lb.data[static_cast<std::size_t>(first_bad)]) +
                         " at index " + std::to_string(first_bad) +
                         " is not a class of this dataset (" + std::to_string(num_classes) +
                         " classes, labels 0 to " + std::to_string(num_classes - 1) + ")" +
                         (bad > 1 ? "; " + std::to_string(bad) + " of its " + std::to_string(n) +
                                        " labels are out of range"
                                  : std::string()) +
                         ": the file is corrupt or belongs to another dataset; download or "
                         "install it again");
    set.labels = torch::empty({n}, torch::kInt64); // [N]
    auto* labels = set.labels.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < n; ++i)
        labels[i] = lb.data[static_cast<std::size_t>(i)];
    set.num_classes = num_classes;
    return set;
}

DatasetSplits open_dataset(const core::Config& cfg) {
    return open_dataset(data_options(cfg));
}

std::int64_t DatasetSplits::size(Split split) const {
    if (is_image_folder()) return (split == Split::Train ? train_folder : test_folder)->size();
    return (split == Split::Train ? train : test).size();
}

int DatasetSplits::num_classes() const {
    return is_image_folder() ? train_folder->num_classes() : train.num_classes;
}

DatasetSplits open_dataset(const DataOptions& o) {
    check_options(o);
    DatasetSplits s;
    s.name = o.dataset;
    if (o.dataset == "imagefolder") {
        auto folders = open_image_folders(o.path);
        s.train_folder = std::make_shared<const ImageFolder>(std::move(folders.first));
        s.test_folder = std::make_shared<const ImageFolder>(std::move(folders.second));
        s.description = "image folder " + o.path + ": " + std::to_string(s.train_folder->size()) +
                        " train + " + std::to_string(s.test_folder->size()) +
                        " val images (JPEG/PNG, decoded per batch), " +
                        std::to_string(s.num_classes()) + " classes";
        return s;
    }
    if (o.dataset == "synthetic") {
        const std::int64_t n_train = o.synthetic_samples;
        const std::int64_t n_test = std::max<std::int64_t>(1, n_train / 4);
        // One call, then split: train and test share the class patterns.
        ImageSet all = make_synthetic(n_train + n_test, 1, kMnistSide, kMnistSide,
                                      o.synthetic_classes, kSyntheticSeed);
        s.train = all;
        s.train.images = all.images.narrow(0, 0, n_train);
        s.train.labels = all.labels.narrow(0, 0, n_train);
        s.test = all;
        s.test.images = all.images.narrow(0, n_train, n_test);
        s.test.labels = all.labels.narrow(0, n_train, n_test);
        s.description = "synthetic: " + std::to_string(n_train) + " train + " +
                        std::to_string(n_test) + " test images 1x28x28, " +
                        std::to_string(o.synthetic_classes) + " classes";
        return s;
    }
    if (o.dataset != "fashion-mnist" && o.dataset != "mnist")
        throw core::ConfigError("data.dataset = '" + o.dataset +
                                "' is invalid: expected fashion-mnist, mnist, synthetic or "
                                "imagefolder");
    // Look every file up before reading any, in a fixed order (argument evaluation order is not).
    const std::string train_images = find_idx_file(o, "train-images-idx3-ubyte");
    const std::string train_labels = find_idx_file(o, "train-labels-idx1-ubyte");
    const std::string test_images = find_idx_file(o, "t10k-images-idx3-ubyte");
    const std::string test_labels = find_idx_file(o, "t10k-labels-idx1-ubyte");
    s.train = load_idx_pair(train_images, train_labels, kMnistClasses);
    s.test = load_idx_pair(test_images, test_labels, kMnistClasses);
    if (!s.train.images.sizes().slice(1).equals(s.test.images.sizes().slice(1)))
        throw InputError("data.path=" + o.path + ": training images are " +
                         shape_text(s.train.images) + " but test images are " +
                         shape_text(s.test.images) + ": the files come from different datasets");
    const int classes = kMnistClasses;
    const bool fashion = o.dataset == "fashion-mnist";
    for (ImageSet* set : {&s.train, &s.test}) {
        set->num_classes = classes;
        set->mean = fashion ? kFashionMnistMean : kMnistMean;
        set->std = fashion ? kFashionMnistStd : kMnistStd;
    }
    s.description = std::string(fashion ? "Fashion-MNIST" : "MNIST") + " from " + o.path + ": " +
                    std::to_string(s.train.size()) + " train + " + std::to_string(s.test.size()) +
                    " test images 1x" + std::to_string(s.train.images.size(2)) + "x" +
                    std::to_string(s.train.images.size(3)) + ", " + std::to_string(classes) +
                    " classes";
    return s;
}

ImageSet make_synthetic(std::int64_t n, int channels, int height, int width, int num_classes,
                        std::uint64_t seed) {
    if (n < 1 || channels < 1 || height < 1 || width < 1 || num_classes < 2)
        throw core::InternalError("make_synthetic: bad arguments");
    constexpr double kTwoPi = 6.283185307179586;
    const std::int64_t plane = static_cast<std::int64_t>(height) * width;

    // Class templates in [-1, 1]: a plane wave whose direction, frequency and phase the class
    // fixes; channel k shifts the phase so colour images are not just replicated gray.
    std::mt19937_64 rng(seed);
    std::vector<float> templates(static_cast<std::size_t>(num_classes) * channels * plane);
    for (int c = 0; c < num_classes; ++c) {
        const double fx = 0.5 + 2.5 * unit(rng), fy = 0.5 + 2.5 * unit(rng);
        const double sx = unit(rng) < 0.5 ? -1 : 1, phase = kTwoPi * unit(rng);
        for (int k = 0; k < channels; ++k) {
            float* tpl = &templates[(static_cast<std::size_t>(c) * channels + k) * plane];
            for (int y = 0; y < height; ++y)
                for (int x = 0; x < width; ++x)
                    tpl[y * width + x] = static_cast<float>(std::sin(
                        kTwoPi * (sx * fx * x / width + fy * y / height) + phase + k * 2.0));
        }
    }

    ImageSet set;
    set.images = torch::empty({n, channels, height, width}, torch::kUInt8); // [N, C, H, W]
    set.labels = torch::empty({n}, torch::kInt64);                          // [N]
    auto* img = set.images.data_ptr<std::uint8_t>();
    auto* lab = set.labels.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < n; ++i) {
        const int c = static_cast<int>(i % num_classes); // balanced; the sampler shuffles
        lab[i] = c;
        const double contrast = 40.0 + 50.0 * unit(rng); // per-image amplitude
        const float* t = &templates[static_cast<std::size_t>(c) * channels * plane];
        std::uint8_t* out = img + i * channels * plane;
        for (std::int64_t p = 0; p < channels * plane; ++p) {
            // Noise: sum of three uniforms, roughly Gaussian with std 30 grey levels.
            const double noise = 60.0 * (unit(rng) + unit(rng) + unit(rng) - 1.5);
            const double v = 128.0 + contrast * t[p] + noise;
            out[p] = static_cast<std::uint8_t>(std::lround(std::clamp(v, 0.0, 255.0)));
        }
    }
    set.num_classes = num_classes;
    set.mean = 0.5f;
    set.std = 0.5f;
    return set;
}

torch::Tensor AdaptedTransform::apply(const torch::Tensor& batch, bool pinned_output) const {
    if (!batch.defined() || batch.dim() != 4 || batch.scalar_type() != torch::kUInt8)
        throw core::InternalError(
            "AdaptedTransform expects a uint8 [B, C, H, W] batch, got " +
            (batch.defined()
                 ? std::string(c10::toString(batch.scalar_type())) + " " + shape_text(batch)
                 : std::string("an undefined tensor")));
    const std::int64_t b = batch.size(0), c = batch.size(1);
    if (c != 1 && c != channels)
        throw core::InternalError("AdaptedTransform: a batch with " + std::to_string(c) +
                                  " channels cannot become " + std::to_string(channels));
    // (v/255 - mean)/std as one multiply-add on the small image.
    torch::Tensor x = batch.to(torch::kFloat32)
                          .mul_(1.0 / (255.0 * std))
                          .add_(-static_cast<double>(mean) / std); // [B, c, H, W]
    if (x.size(2) != image_size || x.size(3) != image_size) {
        namespace F = torch::nn::functional;
        x = F::interpolate(x, F::InterpolateFuncOptions()
                                  .size(std::vector<std::int64_t>{image_size, image_size})
                                  .mode(torch::kBilinear)
                                  .align_corners(false)
                                  .antialias(false)); // [B, c, S, S]
    }
    const bool pin = pinned_output && batch.is_cpu(); // page-locked memory is host memory
    if (c == channels && !pin) return x;
    torch::Tensor out = torch::empty({b, channels, image_size, image_size},
                                     torch::TensorOptions(torch::kFloat32)
                                         .device(batch.device())
                                         .pinned_memory(pin)); // [B, C, S, S]
    out.copy_(x.expand({b, channels, image_size, image_size}));
    return out;
}

AdaptedTransform adapted_transform(const ImageSet& set, const DataOptions& o) {
    const std::int64_t c = set.images.size(1);
    if (c != 1 && c != o.channels)
        throw core::ConfigError("cv.channels=" + std::to_string(o.channels) +
                                " but the dataset has " + std::to_string(c) +
                                " channels: use cv.channels=" + std::to_string(c));
    return AdaptedTransform{o.channels, o.image_size, set.mean, set.std};
}

} // namespace trainscope::data
