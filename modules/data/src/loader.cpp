// Loader (see loader.hpp): a ring of `prefetch` slots indexed by batch number. Workers claim batch
// numbers in order but may finish out of order; each result goes to its own slot, so next() always
// returns batch k after batch k-1, the same batches as with no worker at all.
#include "trainscope/data/loader.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <string>

#include "trainscope/core/error.hpp"

namespace trainscope::data {
namespace {

// Limits LibTorch's intra-op parallelism of the calling thread to one thread. at::set_num_threads
// cannot do this for one thread only: it also stores a process-wide count that threads created
// later adopt and resizes the shared pthreadpool. With LibTorch's OpenMP backend the count is the
// per-thread OpenMP ICV, which omp_set_num_threads changes for the caller alone. LibTorch's lazy
// per-thread initialisation runs first so that it cannot overwrite the value later.
void limit_intra_op_threads_of_this_thread() {
    (void)at::get_num_threads();
    using SetNumThreads = void (*)(int);
    static const auto omp_set_num_threads =
        reinterpret_cast<SetNumThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
    if (omp_set_num_threads) omp_set_num_threads(1);
}

} // namespace

Loader::Loader(const ImageSet& set, AdaptedTransform transform, std::vector<std::int64_t> indices,
               std::int64_t batch_size, int workers, int prefetch, bool pin_memory, bool drop_last)
    : set_(set), transform_(transform), indices_(std::move(indices)), batch_size_(batch_size),
      prefetch_(prefetch) {
    if (batch_size < 1 || workers < 0 || prefetch < 1)
        throw core::InternalError("Loader: batch_size " + std::to_string(batch_size) +
                                  ", workers " + std::to_string(workers) + ", prefetch " +
                                  std::to_string(prefetch) + " out of range");
    if (!set.images.defined() || !set.labels.defined() || set.images.size(0) != set.labels.size(0))
        throw core::InternalError("Loader: images and labels of the dataset do not match");
    const std::int64_t n = static_cast<std::int64_t>(indices_.size());
    for (std::int64_t i : indices_)
        if (i < 0 || i >= set.size())
            throw core::InternalError("Loader: sample index " + std::to_string(i) +
                                      " out of range for a dataset of " +
                                      std::to_string(set.size()));
    num_batches_ = drop_last ? n / batch_size : (n + batch_size - 1) / batch_size;
    pin_ = pin_memory && torch::cuda::is_available();
    ring_.resize(static_cast<std::size_t>(prefetch));
    const std::int64_t threads = std::min<std::int64_t>(workers, num_batches_);
    for (std::int64_t t = 0; t < threads; ++t)
        threads_.emplace_back([this] { work(); });
}

Loader::~Loader() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    work_cv_.notify_all();
    // A worker in the middle of build() finishes that one batch, then sees stop_.
    for (auto& t : threads_)
        t.join();
}

Batch Loader::build(std::int64_t k) const {
    const std::int64_t begin = k * batch_size_;
    const std::int64_t b =
        std::min<std::int64_t>(batch_size_, static_cast<std::int64_t>(indices_.size()) - begin);
    // A view of this batch's indices; index_select only reads it.
    torch::Tensor idx = torch::from_blob(const_cast<std::int64_t*>(indices_.data() + begin), {b},
                                         torch::kInt64); // [B]
    Batch out;
    out.size = b;
    out.images = transform_.apply(set_.images.index_select(0, idx), pin_); // [B, C, S, S]
    out.labels = set_.labels.index_select(0, idx);                         // [B]
    if (pin_) {
        torch::Tensor pinned =
            torch::empty({b}, torch::TensorOptions(torch::kInt64).pinned_memory(true));
        out.labels = pinned.copy_(out.labels);
    }
    return out;
}

void Loader::work() {
    limit_intra_op_threads_of_this_thread();
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
        // Claim the next batch once its ring slot is free (k < next_pop_ + prefetch).
        work_cv_.wait(lock, [this] {
            return stop_ || next_build_ >= num_batches_ || next_build_ < next_pop_ + prefetch_;
        });
        if (stop_ || next_build_ >= num_batches_) return;
        const std::int64_t k = next_build_++;
        lock.unlock();
        Slot result;
        try {
            result.batch = build(k);
        } catch (...) {
            result.error = std::current_exception();
        }
        lock.lock();
        result.ready = true;
        ring_[static_cast<std::size_t>(k % prefetch_)] = std::move(result);
        ready_cv_.notify_all();
    }
}

std::optional<Batch> Loader::next() {
    if (failed_) std::rethrow_exception(failed_);
    if (next_pop_ >= num_batches_) return std::nullopt;
    const std::int64_t k = next_pop_;
    if (threads_.empty()) {
        try {
            Batch b = build(k);
            ++next_pop_;
            return b;
        } catch (...) {
            failed_ = std::current_exception();
            throw;
        }
    }
    Slot slot;
    {
        std::unique_lock<std::mutex> lock(mutex_);
        Slot& s = ring_[static_cast<std::size_t>(k % prefetch_)];
        ready_cv_.wait(lock, [&s] { return s.ready; });
        slot = std::move(s);
        s = Slot{};
        ++next_pop_;
        if (slot.error) {
            // Stop building: the epoch cannot go on past a batch that failed.
            failed_ = slot.error;
            stop_ = true;
        }
    }
    work_cv_.notify_all();
    if (slot.error) std::rethrow_exception(slot.error);
    return std::move(slot.batch);
}

} // namespace trainscope::data
