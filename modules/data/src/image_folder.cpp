// Image folders (see image_folder.hpp): the directory scan that fixes labels and sample order, the
// torchvision ImageNet transforms with portable, per-sample random draws, and the batch source the
// loader's worker threads run.
#include "trainscope/data/image_folder.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>

#include "random_internal.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/text.hpp"
#include "trainscope/data/image_decoder.hpp"

namespace trainscope::data {
namespace {

namespace fs = std::filesystem;
using core::InputError;

const char* const kLayout =
    "expected data.path/train/<class>/<image> and data.path/val/<class>/<image>, one "
    "sub-directory per class holding .jpg/.jpeg/.png files (the ImageNet layout)";

bool is_image_file_name(const fs::path& p) {
    std::string ext = p.extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// Python's round() of a non-negative double: half to even (std::rint in the default rounding mode).
std::int64_t round_half_even(double x) {
    return static_cast<std::int64_t>(std::rint(x));
}

// uint8 [h, w, 3] → float32 [1, 3, h, w]
torch::Tensor to_nchw_float(const torch::Tensor& hwc) {
    return hwc.permute({2, 0, 1}).unsqueeze(0).to(torch::kFloat32).contiguous();
}

// Bilinear resize of [1, 3, h, w] to [1, 3, height, width] (antialiased when shrinking, as
// torchvision's Resize with antialias=True); the identity when the size already matches.
torch::Tensor resize(const torch::Tensor& x, std::int64_t height, std::int64_t width) {
    if (x.size(2) == height && x.size(3) == width) return x;
    namespace F = torch::nn::functional;
    return F::interpolate(x, F::InterpolateFuncOptions()
                                 .size(std::vector<std::int64_t>{height, width})
                                 .mode(torch::kBilinear)
                                 .align_corners(false)
                                 .antialias(true));
}

} // namespace

ImageFolder scan_image_folder(const std::string& split_dir) {
    ImageFolder folder;
    folder.root = split_dir;
    try {
        if (!fs::is_directory(split_dir))
            throw InputError("image folder '" + split_dir + "' " +
                             (fs::exists(split_dir)
                                  ? "is " + core::file_kind(split_dir) + ", not a directory"
                                  : std::string("does not exist")) +
                             ": " + kLayout);
        for (const auto& entry : fs::directory_iterator(split_dir))
            if (entry.is_directory()) folder.classes.push_back(entry.path().filename().string());
        if (folder.classes.empty())
            throw InputError("image folder '" + split_dir +
                             "' has no class sub-directories: " + kLayout);
        std::sort(folder.classes.begin(), folder.classes.end());
        for (std::size_t label = 0; label < folder.classes.size(); ++label) {
            const fs::path class_dir = fs::path(split_dir) / folder.classes[label];
            // (directory relative to the class, file name): torchvision's sorted(os.walk()) order.
            std::vector<std::pair<std::string, std::string>> found;
            for (const auto& entry : fs::recursive_directory_iterator(
                     class_dir, fs::directory_options::follow_directory_symlink))
                if (entry.is_regular_file() && is_image_file_name(entry.path())) {
                    std::string dir =
                        entry.path().parent_path().lexically_relative(class_dir).string();
                    if (dir == ".") dir.clear(); // the class directory itself sorts first
                    found.emplace_back(std::move(dir), entry.path().filename().string());
                }
            if (found.empty())
                throw InputError("class directory '" + class_dir.string() +
                                 "' holds no .jpg/.jpeg/.png file: add its images or remove it (" +
                                 kLayout + ")");
            std::sort(found.begin(), found.end());
            for (const auto& [dir, name] : found) {
                folder.files.push_back((class_dir / dir / name).lexically_normal().string());
                folder.labels.push_back(static_cast<std::int64_t>(label));
            }
        }
    } catch (const fs::filesystem_error& e) {
        throw InputError("cannot list image folder '" + split_dir + "': " + e.what());
    }
    return folder;
}

std::pair<ImageFolder, ImageFolder> open_image_folders(const std::string& root) {
    const std::string train_dir = (fs::path(root) / "train").string();
    const std::string val_dir = (fs::path(root) / "val").string();
    for (const std::string& dir : {train_dir, val_dir})
        if (std::error_code ec; !fs::is_directory(dir, ec))
            throw InputError("data.dataset=imagefolder: '" + dir + "' " +
                             (fs::exists(dir, ec)
                                  ? "is " + core::file_kind(dir) + ", not a directory"
                                  : std::string("not found")) +
                             " (data.path=" + root + "): " + kLayout);
    std::pair<ImageFolder, ImageFolder> folders{scan_image_folder(train_dir),
                                                scan_image_folder(val_dir)};
    if (folders.first.classes != folders.second.classes)
        throw InputError("data.dataset=imagefolder: '" + train_dir + "' has " +
                         std::to_string(folders.first.num_classes()) + " classes and '" + val_dir +
                         "' " + std::to_string(folders.second.num_classes()) +
                         ", not the same class directories: both splits need the same classes");
    return folders;
}

CropBox random_resized_crop_box(std::int64_t height, std::int64_t width, std::mt19937_64& rng) {
    constexpr double kMinScale = 0.08, kMaxScale = 1.0;
    const double log_min_ratio = std::log(3.0 / 4.0), log_max_ratio = std::log(4.0 / 3.0);
    const double area = static_cast<double>(height) * static_cast<double>(width);
    for (int attempt = 0; attempt < 10; ++attempt) {
        const double target_area = area * (kMinScale + (kMaxScale - kMinScale) * detail::unit(rng));
        const double aspect =
            std::exp(log_min_ratio + (log_max_ratio - log_min_ratio) * detail::unit(rng));
        const std::int64_t w = round_half_even(std::sqrt(target_area * aspect));
        const std::int64_t h = round_half_even(std::sqrt(target_area / aspect));
        if (0 < w && w <= width && 0 < h && h <= height) {
            CropBox box{0, 0, h, w};
            box.top = static_cast<std::int64_t>(
                detail::uniform_below(rng, static_cast<std::uint64_t>(height - h + 1)));
            box.left = static_cast<std::int64_t>(
                detail::uniform_below(rng, static_cast<std::uint64_t>(width - w + 1)));
            return box;
        }
    }
    // Centre crop with the aspect ratio clamped to [3/4, 4/3].
    const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
    CropBox box{0, 0, height, width};
    if (in_ratio < 3.0 / 4.0)
        box.height = round_half_even(static_cast<double>(width) / (3.0 / 4.0));
    else if (in_ratio > 4.0 / 3.0)
        box.width = round_half_even(static_cast<double>(height) * (4.0 / 3.0));
    box.top = (height - box.height) / 2;
    box.left = (width - box.width) / 2;
    return box;
}

TrainAugmentation draw_train_augmentation(std::int64_t height, std::int64_t width,
                                          std::uint64_t seed, std::int64_t epoch,
                                          std::int64_t index) {
    using detail::mix64;
    std::mt19937_64 rng(mix64(mix64(mix64(seed) ^ static_cast<std::uint64_t>(epoch)) ^
                              static_cast<std::uint64_t>(index)));
    TrainAugmentation a;
    a.box = random_resized_crop_box(height, width, rng);
    a.flip = detail::unit(rng) < 0.5;
    return a;
}

std::int64_t eval_resize_size(int image_size) {
    return round_half_even(image_size * 256.0 / 224.0);
}

void ImageFolderTransform::apply(const torch::Tensor& hwc, std::int64_t epoch, std::int64_t index,
                                 torch::Tensor out) const {
    if (hwc.dim() != 3 || hwc.size(2) != 3 || hwc.scalar_type() != torch::kUInt8 ||
        hwc.size(0) < 1 || hwc.size(1) < 1)
        throw core::InternalError("ImageFolderTransform expects a uint8 [H, W, 3] image");
    const std::int64_t h = hwc.size(0), w = hwc.size(1), s = image_size;
    torch::Tensor x; // float32 [1, 3, S, S], values in [0, 255]
    if (train) {
        const TrainAugmentation a = draw_train_augmentation(h, w, seed, epoch, index);
        x = resize(to_nchw_float(
                       hwc.narrow(0, a.box.top, a.box.height).narrow(1, a.box.left, a.box.width)),
                   s, s);
        if (a.flip) x = x.flip({3});
    } else {
        // torchvision Resize(int): shorter side → r, longer side → int(r * long / short).
        const std::int64_t r = eval_resize_size(image_size);
        const std::int64_t longer =
            static_cast<std::int64_t>(static_cast<double>(r) * static_cast<double>(std::max(h, w)) /
                                      static_cast<double>(std::min(h, w)));
        const std::int64_t nh = h <= w ? r : longer, nw = h <= w ? longer : r;
        x = resize(to_nchw_float(hwc), nh, nw); // [1, 3, nh, nw]
        const std::int64_t top = round_half_even(static_cast<double>(nh - s) / 2.0);
        const std::int64_t left = round_half_even(static_cast<double>(nw - s) / 2.0);
        x = x.narrow(2, top, s).narrow(3, left, s);
    }
    // ToTensor, then Normalize, in torchvision's order of operations.
    out.copy_(x[0]).div_(255.0);
    for (int c = 0; c < 3; ++c)
        out[c].sub_(kImageNetMean[c]).div_(kImageNetStd[c]);
}

torch::Tensor ImageFolderTransform::operator()(const torch::Tensor& hwc, std::int64_t epoch,
                                               std::int64_t index) const {
    torch::Tensor out = torch::empty({3, image_size, image_size}, torch::kFloat32); // [3, S, S]
    apply(hwc, epoch, index, out);
    return out;
}

ImageFolderSource::ImageFolderSource(std::shared_ptr<const ImageFolder> folder,
                                     ImageFolderTransform transform)
    : folder_(std::move(folder)), transform_(transform) {
    if (!folder_) throw core::InternalError("ImageFolderSource: no image folder");
}

Batch ImageFolderSource::build(std::span<const std::int64_t> rows, std::int64_t epoch,
                               bool pinned) const {
    const auto b = static_cast<std::int64_t>(rows.size());
    const std::int64_t s = transform_.image_size;
    Batch out;
    out.size = b;
    out.images = torch::empty(
        {b, 3, s, s}, torch::TensorOptions(torch::kFloat32).pinned_memory(pinned)); // [B,3,S,S]
    out.labels =
        torch::empty({b}, torch::TensorOptions(torch::kInt64).pinned_memory(pinned)); // [B]
    auto* labels = out.labels.data_ptr<std::int64_t>();
    for (std::int64_t i = 0; i < b; ++i) {
        const auto row = static_cast<std::size_t>(rows[static_cast<std::size_t>(i)]);
        DecodedImage img = decode_image_file(folder_->files[row]);
        torch::Tensor hwc =
            torch::from_blob(img.rgb.data(), {img.height, img.width, 3}, torch::kUInt8);
        transform_.apply(hwc, epoch, static_cast<std::int64_t>(row), out.images[i]);
        labels[i] = folder_->labels[row];
    }
    return out;
}

} // namespace trainscope::data
