// Declaration and reading of the data module's options (see options.hpp). Defaults reproduce the
// studies' setup: Fashion-MNIST from Debian's dataset-fashion-mnist, 32x32 inputs, 3 channels.
#include "trainscope/data/options.hpp"

#include <string>

#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"

namespace trainscope::data {

void declare_options(core::OptionRegistry& r) {
    r.add_choice("data.dataset", "fashion-mnist",
                 {"fashion-mnist", "mnist", "synthetic", "imagefolder"},
                 "training data: IDX files from data.path, generated images (no files needed), "
                 "or JPEG/PNG files in data.path/{train,val}/<class>/ (ImageNet layout)");
    r.add_input_path("data.path", "/usr/share/datasets/fashion-mnist",
                     "directory with train-images-idx3-ubyte(.gz), train-labels-idx1-ubyte(.gz), "
                     "t10k-images-idx3-ubyte(.gz), t10k-labels-idx1-ubyte(.gz); for imagefolder "
                     "the root holding train/ and val/ (in an INI file: relative to the file)");
    r.add_int(
        "data.synthetic_samples", 4096,
        "training images of data.dataset=synthetic (28x28 gray; plus 1/4 as many test images)", 1,
        1e8);
    r.add_int("data.synthetic_classes", 10, "classes of data.dataset=synthetic", 2, 1000);
    r.add_int("data.workers", 1,
              "loader threads building batches ahead; 0 = build them in the training thread", 0,
              64);
    r.add_int("data.prefetch", 2, "batches the loader keeps ready ahead of the training step", 1,
              64);
    r.add_bool("data.pin_memory", false,
               "build CV batches in page-locked host memory (CUDA only: on a CPU device it is "
               "dropped with a warning; /plan pin_memory says what applied)");
    r.add_bool("data.drop_last", true,
               "drop the samples that do not fill the last rank shard and the last batch");
    r.add_choice("data.preprocess", "host", {"host", "device"},
                 "where batches are transformed: host = loader threads; device = raw uint8 "
                 "batches are copied and transformed on the compute device (IDX/synthetic only)");
    r.add_int("cv.image_size", 32,
              "side of the square network input; 28x28 images are resized bilinearly to it, "
              "image folders are cropped to it",
              32, 512);
    r.add_choice("cv.channels", "3", {"1", "3"},
                 "input channels: 3 replicates the gray channel (the studies' adapted MNIST)");
}

DataOptions data_options(const core::Config& cfg) {
    DataOptions o;
    o.dataset = cfg.get_string("data.dataset");
    o.path = cfg.get_string("data.path");
    o.synthetic_samples = cfg.get_int("data.synthetic_samples");
    o.synthetic_classes = static_cast<int>(cfg.get_int("data.synthetic_classes"));
    o.workers = static_cast<int>(cfg.get_int("data.workers"));
    o.prefetch = static_cast<int>(cfg.get_int("data.prefetch"));
    o.pin_memory = cfg.get_bool("data.pin_memory");
    o.drop_last = cfg.get_bool("data.drop_last");
    o.image_size = static_cast<int>(cfg.get_int("cv.image_size"));
    o.channels = std::stoi(cfg.get_string("cv.channels"));
    o.preprocess =
        cfg.get_string("data.preprocess") == "device" ? Preprocess::Device : Preprocess::Host;
    check_options(o);
    return o;
}

void check_options(const DataOptions& o) {
    if (o.dataset != "imagefolder") return;
    if (o.preprocess == Preprocess::Device)
        throw core::ConfigError(
            "data.preprocess=device cannot be used with data.dataset=imagefolder: its images "
            "have different sizes, so raw batches cannot be stacked; use data.preprocess=host "
            "(decoding and cropping run in the data.workers loader threads)");
    if (o.channels != 3)
        throw core::ConfigError("cv.channels=" + std::to_string(o.channels) +
                                " but data.dataset=imagefolder decodes RGB images: use "
                                "cv.channels=3");
}

const char* to_string(Preprocess p) {
    return p == Preprocess::Device ? "device" : "host";
}

} // namespace trainscope::data
