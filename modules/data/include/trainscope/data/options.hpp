// Options of the data module (data.* and the input geometry cv.image_size / cv.channels) and their
// resolved values as one struct, so that the trainer reads the configuration in one place.
// No LibTorch here: the app can declare options without pulling in torch headers.
#pragma once

#include <cstdint>
#include <string>

namespace trainscope::core {
class Config;
class OptionRegistry;
} // namespace trainscope::core

namespace trainscope::data {

// data.dataset, data.path, data.synthetic_samples, data.synthetic_classes, data.workers,
// data.prefetch, data.pin_memory, data.drop_last, data.preprocess, cv.image_size, cv.channels
void declare_options(core::OptionRegistry& registry);

// Where the per-batch transform runs (data.preprocess).
enum class Preprocess {
    Host,   // loader worker threads transform; batches arrive ready for the network
    Device, // the loader ships raw uint8 images; the trainer transforms them on the compute
            // device after the host-to-device copy (what NVIDIA DALI gives the studies)
};

struct DataOptions {
    std::string dataset;                // fashion-mnist | mnist | synthetic | imagefolder
    std::string path;                   // directory with the IDX files, or the image-folder root
    std::int64_t synthetic_samples = 0; // training samples of the synthetic set
    int synthetic_classes = 0;
    int workers = 0;  // loader threads; 0 = batches are built in the training thread
    int prefetch = 0; // batches built ahead of the training thread (>= 1)
    bool pin_memory = false;
    bool drop_last = true; // sampler and loader: drop the tail that does not fill a rank/batch
    int image_size = 0;    // side S of the square network input [B, C, S, S]
    int channels = 0;      // C: 1, or 3 (gray replicated, the studies' adapted MNIST)
    Preprocess preprocess = Preprocess::Host;
};

// Reads the options and checks their combinations (check_options).
DataOptions data_options(const core::Config& cfg);

// ConfigError naming the options and the fix for combinations no single option range catches:
// data.dataset=imagefolder with data.preprocess=device (images of different sizes cannot be
// stacked into one raw batch) or with cv.channels=1 (image folders are decoded to RGB).
void check_options(const DataOptions& options);

const char* to_string(Preprocess preprocess); // "host" | "device"

} // namespace trainscope::data
