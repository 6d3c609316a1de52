// Declaration and reading of the data module's options (see options.hpp). Defaults reproduce the
// studies' setup: Fashion-MNIST from Debian's dataset-fashion-mnist, 32x32 inputs, 3 channels.
#include "trainscope/data/options.hpp"

#include "trainscope/core/config.hpp"

namespace trainscope::data {

void declare_options(core::OptionRegistry& r) {
    r.add_choice("data.dataset", "fashion-mnist", {"fashion-mnist", "mnist", "synthetic"},
                 "training data: IDX files from data.path, or generated images (no files needed)");
    r.add_string("data.path", "/usr/share/datasets/fashion-mnist",
                 "directory with train-images-idx3-ubyte(.gz), train-labels-idx1-ubyte(.gz), "
                 "t10k-images-idx3-ubyte(.gz), t10k-labels-idx1-ubyte(.gz)");
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
               "build batches in page-locked host memory (CUDA only; ignored on CPU)");
    r.add_bool("data.drop_last", true,
               "drop the samples that do not fill the last rank shard and the last batch");
    r.add_int("cv.image_size", 32,
              "side of the square network input; 28x28 images are resized bilinearly to it", 32,
              4096);
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
    return o;
}

} // namespace trainscope::data
