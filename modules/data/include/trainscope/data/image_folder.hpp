// data.dataset=imagefolder: a directory tree of JPEG/PNG images with one sub-directory per class
// (torchvision's ImageFolder, the ImageNet layout), and the ImageNet training/evaluation transforms
// applied while the loader's worker threads decode each batch. Only file names are held in memory:
// ImageNet does not fit.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "trainscope/data/loader.hpp"

namespace trainscope::data {

// torchvision's ImageNet normalisation (of pixel values scaled to [0, 1]), R, G, B.
inline constexpr std::array<float, 3> kImageNetMean{0.485f, 0.456f, 0.406f};
inline constexpr std::array<float, 3> kImageNetStd{0.229f, 0.224f, 0.225f};

struct ImageFolder {
    std::string root;                 // the split directory, e.g. <data.path>/train
    std::vector<std::string> classes; // class directory names, sorted; label = position
    std::vector<std::string> files;   // image paths, by class, then as torchvision walks a class
    std::vector<std::int64_t> labels; // label of files[i]

    std::int64_t size() const { return static_cast<std::int64_t>(files.size()); }
    int num_classes() const { return static_cast<int>(classes.size()); }
};

// Lists `split_dir`/<class>/**/<file> like torchvision's ImageFolder: classes are the
// sub-directories sorted by name (label ids in that order); inside a class, sub-directories are
// walked (symbolic links followed) in sorted order and files sorted by name. Only .jpg, .jpeg and
// .png files (any case) count; other files are ignored. InputError naming the path and the
// expected layout when `split_dir` is missing, has no class directory, or a class has no image.
ImageFolder scan_image_folder(const std::string& split_dir);

// <root>/train and <root>/val (both checked before either is scanned). InputError also when the
// two have different classes (labels would not mean the same).
std::pair<ImageFolder, ImageFolder> open_image_folders(const std::string& root);

struct CropBox {
    std::int64_t top = 0, left = 0, height = 0, width = 0;
};

// torchvision's RandomResizedCrop.get_params for scale (0.08, 1) and ratio (3/4, 4/3): up to 10
// draws of an area fraction (uniform) and a log-uniform aspect ratio w/h; the first box that fits
// gets a uniform position; otherwise the centre crop of the image clamped to the ratio range.
// Sizes are rounded half to even, as Python's round().
CropBox random_resized_crop_box(std::int64_t height, std::int64_t width, std::mt19937_64& rng);

// The training augmentation of sample `index` in `epoch`: its crop box and whether it is
// flipped horizontally (p = 0.5). Deterministic in (seed, epoch, index) only.
struct TrainAugmentation {
    CropBox box;
    bool flip = false;
};
TrainAugmentation draw_train_augmentation(std::int64_t height, std::int64_t width,
                                          std::uint64_t seed, std::int64_t epoch,
                                          std::int64_t index);

// Shorter side before the evaluation centre crop: round(image_size * 256 / 224) (256 for 224).
std::int64_t eval_resize_size(int image_size);

// The torchvision ImageNet transforms on one decoded RGB image, uint8 [H, W, 3] → float32
// [3, S, S], S = image_size:
//   train: RandomResizedCrop(S) (draw_train_augmentation), RandomHorizontalFlip;
//   eval:  Resize(eval_resize_size(S)) of the shorter side (longer side truncated as torchvision
//          does), CenterCrop(S) (offsets rounded half to even);
// then scaling to [0, 1] and normalisation with the ImageNet mean/std. Resampling is bilinear
// with antialiasing when shrinking (torchvision's default), computed in float without rounding
// to uint8 in between.
struct ImageFolderTransform {
    int image_size = 224;
    bool train = true;
    std::uint64_t seed = 0; // of the training augmentation

    // out: float32 [3, S, S], e.g. one row of a batch.
    void apply(const torch::Tensor& hwc_uint8, std::int64_t epoch, std::int64_t index,
               torch::Tensor out) const;
    torch::Tensor operator()(const torch::Tensor& hwc_uint8, std::int64_t epoch,
                             std::int64_t index) const;
};

// Batches of an image folder: each row's file is read and decoded (decode_image_file) and
// transformed in the building thread. images float32 [B, 3, S, S], labels int64 [B].
class ImageFolderSource : public BatchSource {
  public:
    ImageFolderSource(std::shared_ptr<const ImageFolder> folder, ImageFolderTransform transform);
    std::int64_t size() const override { return folder_->size(); }
    Batch build(std::span<const std::int64_t> rows, std::int64_t epoch, bool pinned) const override;

  private:
    std::shared_ptr<const ImageFolder> folder_;
    ImageFolderTransform transform_;
};

} // namespace trainscope::data
