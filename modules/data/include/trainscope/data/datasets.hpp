// Image datasets held in host memory as uint8 tensors (MNIST / Fashion-MNIST from IDX files, or a
// generated synthetic set), and the studies' "adapted MNIST" transform that turns a gathered uint8
// batch into the network input. Everything stays uint8 until a batch is built: 60000x28x28 is 47
// MB.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

#include "trainscope/data/options.hpp"

namespace trainscope::core {
class Config;
}

namespace trainscope::data {

struct ImageSet {
    torch::Tensor images; // uint8 [N, C, H, W] (C = 1 for the MNIST family)
    torch::Tensor labels; // int64 [N], values in [0, num_classes)
    int num_classes = 0;
    // Normalisation statistics of the pixel values scaled to [0, 1] (published values for
    // MNIST/Fashion-MNIST, so that results compare with the PyTorch studies).
    float mean = 0.5f;
    float std = 0.5f;

    std::int64_t size() const { return images.defined() ? images.size(0) : 0; }
};

// Images (IDX [N, H, W]) and labels (IDX [N]) files → ImageSet with images [N, 1, H, W] and
// `num_classes` classes (the dataset's, e.g. 10 for MNIST and Fashion-MNIST). Throws InputError
// when a file is bad (see read_idx), when the files are not an images/labels pair, when their
// counts differ, or when a label is >= num_classes (naming the file, the label, its index and the
// class count).
ImageSet load_idx_pair(const std::string& images_path, const std::string& labels_path,
                       int num_classes);

struct ImageFolder; // image_folder.hpp

enum class Split { Train, Test }; // Test = the evaluation split (val/ of an image folder)

// The two splits of a dataset: in memory (train, test) for IDX and synthetic sets, or as image
// folders (train_folder, test_folder; train/test then stay empty) decoded batch by batch.
struct DatasetSplits {
    ImageSet train, test;
    std::shared_ptr<const ImageFolder> train_folder, test_folder; // imagefolder only
    std::string name;        // "fashion-mnist", "mnist", "synthetic", "imagefolder"
    std::string description; // one line for the log and the run file

    bool is_image_folder() const { return train_folder != nullptr; }
    std::int64_t size(Split split) const; // samples of the split (for the sampler)
    int num_classes() const;
};

// The dataset selected by data.dataset:
//   fashion-mnist, mnist: {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] in data.path
//                         (InputError naming the missing file and the fix when absent);
//   synthetic:            make_synthetic() with data.synthetic_samples training and a quarter as
//                         many test images, 1x28x28 like MNIST, same data on every run;
//   imagefolder:          data.path/train and data.path/val scanned by scan_image_folder() (file
//                         names only; images are decoded by the loader), same classes in both.
// Checks the option combinations first (check_options: ConfigError).
DatasetSplits open_dataset(const core::Config& cfg);
DatasetSplits open_dataset(const DataOptions& options);

// n images uint8 [n, channels, height, width] with balanced labels: class c is a smooth
// class-specific wave pattern plus per-pixel noise, so a small network learns it well above chance
// but not instantly. Deterministic in (all arguments); no std:: distributions (they are not
// portable across standard libraries). mean/std are set to 0.5/0.5.
ImageSet make_synthetic(std::int64_t n, int channels, int height, int width, int num_classes,
                        std::uint64_t seed);

// The studies' adapted MNIST, applied per batch:
//   uint8 [B, c, H, W] → float32 [B, channels, image_size, image_size]
// scale to [0, 1], normalise with (mean, std), bilinear resize to image_size (align_corners=false,
// no antialiasing; done after normalising, which gives the same values because the resize is an
// affine combination, on 1 channel instead of 3), replicate a single channel to `channels`.
// c must be 1 or equal to `channels`. Throws InternalError for a non-uint8 or non-4-D batch.
struct AdaptedTransform {
    int channels = 3;
    int image_size = 32;
    float mean = 0.5f;
    float std = 0.5f;

    // Works on any device: on a CUDA batch (data.preprocess=device) the result stays there.
    torch::Tensor operator()(const torch::Tensor& uint8_batch) const {
        return apply(uint8_batch, /*pinned_output=*/false);
    }
    // pinned_output: allocate the result in page-locked host memory (needs CUDA at run time);
    // ignored for a batch that is not on the CPU.
    torch::Tensor apply(const torch::Tensor& uint8_batch, bool pinned_output) const;
};

// The transform for a dataset (its mean/std) and the configured input geometry.
AdaptedTransform adapted_transform(const ImageSet& set, const DataOptions& options);

} // namespace trainscope::data
