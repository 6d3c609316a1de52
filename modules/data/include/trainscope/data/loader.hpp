// Threaded batch loader: worker threads build each batch from a BatchSource (gather + transform of
// an in-memory set, or decoding + augmenting image files) into a prefetch ring while the training
// thread computes, so the "data" phase of an iteration is only the wait for an already built batch.
// Batches come out in sampler order and are the same whatever the worker count.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "trainscope/data/datasets.hpp"
#include "trainscope/data/prefetcher.hpp"

namespace trainscope::data {

struct Batch {
    // raw = false: float32 [B, C, S, S], ready for the network.
    // raw = true (data.preprocess=device): the gathered uint8 [B, c, H, W] images; the trainer
    //            copies them to the device and transforms them there (network_input()).
    torch::Tensor images;  // pinned when the loader pins
    torch::Tensor labels;  // int64 [B]
    std::int64_t size = 0; // B
    bool raw = false;
};

// What a Loader draws batches from: a dataset plus the transform that turns its rows into a batch.
class BatchSource {
  public:
    virtual ~BatchSource() = default;
    virtual std::int64_t size() const = 0; // valid rows are 0..size()-1
    // The batch of `rows` in that order. epoch and the row numbers are the only inputs of random
    // augmentations, so a batch does not depend on which thread builds it or when. pinned:
    // allocate images and labels in page-locked memory. Called concurrently by worker threads.
    virtual Batch build(std::span<const std::int64_t> rows, std::int64_t epoch,
                        bool pinned) const = 0;
};

// An in-memory ImageSet (IDX, synthetic) with the adapted transform applied in the loader
// (Preprocess::Host), or left to the device (Preprocess::Device: raw uint8 batches).
class ImageSetSource : public BatchSource {
  public:
    // InternalError when images and labels do not match.
    ImageSetSource(ImageSet set, AdaptedTransform transform,
                   Preprocess preprocess = Preprocess::Host);
    std::int64_t size() const override { return set_.size(); }
    Batch build(std::span<const std::int64_t> rows, std::int64_t epoch, bool pinned) const override;

  private:
    ImageSet set_;
    AdaptedTransform transform_;
    Preprocess preprocess_;
};

// The batch source of one split of a dataset, as the trainer uses it: image folders decode and
// augment in the loader threads (Split::Train: random resized crop + flip drawn from
// (seed, epoch, row); Split::Test: resize + centre crop) at transform.image_size; in-memory sets
// use `transform` on the host or, with Preprocess::Device, ship raw batches. Make it once per run
// and one Loader per epoch from it.
std::shared_ptr<const BatchSource> make_batch_source(const DatasetSplits& splits, Split split,
                                                     const AdaptedTransform& transform,
                                                     Preprocess preprocess, std::uint64_t seed);

// The network input of `batch` on `device` as `dtype`, float32 [B, C, S, S] before the cast:
// copies the images (non_blocking: asynchronously from pinned memory) and, for a raw batch, then
// applies `transform` on the device. Equal (to float rounding) to the host-transformed batch.
torch::Tensor network_input(const Batch& batch, const AdaptedTransform& transform,
                            const torch::Device& device, torch::ScalarType dtype,
                            bool non_blocking);

class Loader {
  public:
    // Batches of the rows `indices` of `source` in `epoch` (the epoch only seeds augmentations).
    Loader(std::shared_ptr<const BatchSource> source, std::vector<std::int64_t> indices,
           std::int64_t epoch, std::int64_t batch_size, int workers, int prefetch, bool pin_memory,
           bool drop_last);
    // An ImageSet transformed on the host: Loader(ImageSetSource(set, transform), ..., epoch 0).
    Loader(const ImageSet& set, AdaptedTransform transform, std::vector<std::int64_t> indices,
           std::int64_t batch_size, int workers, int prefetch, bool pin_memory, bool drop_last);
    ~Loader(); // stops and joins the workers, also in the middle of an epoch
    Loader(const Loader&) = delete;
    Loader& operator=(const Loader&) = delete;

    // The next batch in order; nullopt after the last one. An exception thrown while building a
    // batch (in a worker or here) is rethrown by the next() that would have returned that batch,
    // and by every later call.
    std::optional<Batch> next();

    std::int64_t num_batches() const { return num_batches_; }
    bool pinned() const { return pin_; }

  private:
    Batch build(std::int64_t k) const; // batch k from the source

    std::shared_ptr<const BatchSource> source_;
    std::vector<std::int64_t> indices_;
    std::int64_t epoch_;
    std::int64_t batch_size_;
    std::int64_t num_batches_ = 0;
    bool pin_ = false;
    std::unique_ptr<Prefetcher<Batch>> ring_; // last member: its workers stop first
};

} // namespace trainscope::data
