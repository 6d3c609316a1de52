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
// data.prefetch, data.pin_memory, data.drop_last, cv.image_size, cv.channels
void declare_options(core::OptionRegistry& registry);

struct DataOptions {
    std::string dataset;                // fashion-mnist | mnist | synthetic
    std::string path;                   // directory with the IDX files
    std::int64_t synthetic_samples = 0; // training samples of the synthetic set
    int synthetic_classes = 0;
    int workers = 0;  // loader threads; 0 = batches are built in the training thread
    int prefetch = 0; // batches built ahead of the training thread (>= 1)
    bool pin_memory = false;
    bool drop_last = true; // sampler and loader: drop the tail that does not fill a rank/batch
    int image_size = 0;    // side S of the square network input [B, C, S, S]
    int channels = 0;      // C: 1, or 3 (gray replicated, the studies' adapted MNIST)
};

DataOptions data_options(const core::Config& cfg);

} // namespace trainscope::data
