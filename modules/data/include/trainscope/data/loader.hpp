// Threaded batch loader: worker threads gather the rows of each batch and apply the transform into
// a prefetch ring while the training thread computes, so the "data" phase of an iteration is only
// the wait for an already built batch. Batches come out in sampler order whatever the worker count.
#pragma once

#include <torch/torch.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "trainscope/data/datasets.hpp"

namespace trainscope::data {

struct Batch {
    torch::Tensor images;  // float32 [B, C, S, S], pinned when the loader pins
    torch::Tensor labels;  // int64 [B]
    std::int64_t size = 0; // B
};

// One epoch over `indices` (usually DistributedSampler::indices()); make a new Loader per epoch.
//
// Batch k holds indices[k*batch_size, (k+1)*batch_size); the last partial batch is dropped when
// drop_last, else returned smaller. workers = 0 builds each batch inside next(); workers >= 1
// threads build batches ahead, at most `prefetch` of them not yet taken by next(). A worker limits
// its own LibTorch intra-op parallelism to one thread (so N workers plus the training thread do not
// oversubscribe the cores) without changing the process-wide setting the training thread uses.
// pin_memory allocates the batches in page-locked memory when CUDA is available at run time (for
// asynchronous host-to-device copies); otherwise it is ignored.
class Loader {
  public:
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
    struct Slot {
        std::optional<Batch> batch;
        std::exception_ptr error;
        bool ready = false;
    };

    Batch build(std::int64_t k) const; // gather + transform of batch k
    void work();                       // worker thread body

    ImageSet set_;
    AdaptedTransform transform_;
    std::vector<std::int64_t> indices_;
    std::int64_t batch_size_;
    std::int64_t num_batches_;
    int prefetch_;
    bool pin_;

    std::mutex mutex_;
    std::condition_variable work_cv_;  // workers: a slot became free, or stop
    std::condition_variable ready_cv_; // next(): a batch became ready
    std::vector<Slot> ring_;           // batch k lives in ring_[k % prefetch]
    std::int64_t next_build_ = 0;      // next batch index a worker claims
    std::int64_t next_pop_ = 0;        // next batch index next() returns
    bool stop_ = false;
    std::exception_ptr failed_; // sticky after the first error
    std::vector<std::thread> threads_;
};

} // namespace trainscope::data
