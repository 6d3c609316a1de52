// Loader (see loader.hpp): batch k of the sampler order built by a Prefetcher<Batch> (a ring of
// `prefetch` slots indexed by batch number), so next() returns the same batches in the same order
// whatever the worker count.
#include "trainscope/data/loader.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <string>

#include "trainscope/core/error.hpp"
#include "trainscope/data/image_folder.hpp"

namespace trainscope::data {
namespace detail {

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
} // namespace detail

ImageSetSource::ImageSetSource(ImageSet set, AdaptedTransform transform, Preprocess preprocess)
    : set_(std::move(set)), transform_(transform), preprocess_(preprocess) {
    if (!set_.images.defined() || !set_.labels.defined() ||
        set_.images.size(0) != set_.labels.size(0))
        throw core::InternalError("Loader: images and labels of the dataset do not match");
}

Batch ImageSetSource::build(std::span<const std::int64_t> rows, std::int64_t /*epoch*/,
                            bool pinned) const {
    const auto b = static_cast<std::int64_t>(rows.size());
    // A view of the rows; index_select only reads it.
    torch::Tensor idx = torch::from_blob(const_cast<std::int64_t*>(rows.data()), {b},
                                         torch::kInt64); // [B]
    Batch out;
    out.size = b;
    if (preprocess_ == Preprocess::Host) {
        out.images = transform_.apply(set_.images.index_select(0, idx), pinned); // [B, C, S, S]
    } else {
        out.raw = true;
        std::vector<std::int64_t> shape = set_.images.sizes().vec();
        shape[0] = b;
        out.images = torch::empty(shape, set_.images.options().pinned_memory(pinned));
        torch::index_select_out(out.images, set_.images, 0, idx); // uint8 [B, c, H, W]
    }
    out.labels = torch::empty({b}, set_.labels.options().pinned_memory(pinned));
    torch::index_select_out(out.labels, set_.labels, 0, idx); // [B]
    return out;
}

std::shared_ptr<const BatchSource> make_batch_source(const DatasetSplits& splits, Split split,
                                                     const AdaptedTransform& transform,
                                                     Preprocess preprocess, std::uint64_t seed) {
    if (splits.is_image_folder()) {
        if (preprocess == Preprocess::Device)
            throw core::ConfigError(
                "data.preprocess=device cannot be used with data.dataset=imagefolder: use "
                "data.preprocess=host");
        ImageFolderTransform t;
        t.image_size = transform.image_size;
        t.train = split == Split::Train;
        t.seed = seed;
        return std::make_shared<ImageFolderSource>(
            split == Split::Train ? splits.train_folder : splits.test_folder, t);
    }
    return std::make_shared<ImageSetSource>(split == Split::Train ? splits.train : splits.test,
                                            transform, preprocess);
}

torch::Tensor network_input(const Batch& batch, const AdaptedTransform& transform,
                            const torch::Device& device, torch::ScalarType dtype,
                            bool non_blocking) {
    if (!batch.raw) return batch.images.to(device, dtype, non_blocking); // [B, C, S, S]
    torch::Tensor raw = batch.images.to(device, non_blocking);           // uint8 [B, c, H, W]
    return transform(raw).to(dtype);                                     // [B, C, S, S]
}

Loader::Loader(std::shared_ptr<const BatchSource> source, std::vector<std::int64_t> indices,
               std::int64_t epoch, std::int64_t batch_size, int workers, int prefetch,
               bool pin_memory, bool drop_last)
    : source_(std::move(source)), indices_(std::move(indices)), epoch_(epoch),
      batch_size_(batch_size) {
    if (!source_) throw core::InternalError("Loader: no batch source");
    if (batch_size < 1 || workers < 0 || prefetch < 1)
        throw core::InternalError("Loader: batch_size " + std::to_string(batch_size) +
                                  ", workers " + std::to_string(workers) + ", prefetch " +
                                  std::to_string(prefetch) + " out of range");
    const std::int64_t n = static_cast<std::int64_t>(indices_.size());
    const std::int64_t rows = source_->size();
    for (std::int64_t i : indices_)
        if (i < 0 || i >= rows)
            throw core::InternalError("Loader: sample index " + std::to_string(i) +
                                      " out of range for a dataset of " + std::to_string(rows));
    num_batches_ = drop_last ? n / batch_size : (n + batch_size - 1) / batch_size;
    pin_ = pin_memory && torch::cuda::is_available();
    ring_ = std::make_unique<Prefetcher<Batch>>(num_batches_, workers, prefetch,
                                                [this](std::int64_t k) { return build(k); });
}

Loader::Loader(const ImageSet& set, AdaptedTransform transform, std::vector<std::int64_t> indices,
               std::int64_t batch_size, int workers, int prefetch, bool pin_memory, bool drop_last)
    : Loader(std::make_shared<ImageSetSource>(set, transform), std::move(indices), /*epoch=*/0,
             batch_size, workers, prefetch, pin_memory, drop_last) {}

Loader::~Loader() = default; // the Prefetcher joins its workers first

Batch Loader::build(std::int64_t k) const {
    const std::int64_t begin = k * batch_size_;
    const std::int64_t b =
        std::min<std::int64_t>(batch_size_, static_cast<std::int64_t>(indices_.size()) - begin);
    return source_->build(
        std::span<const std::int64_t>(indices_.data() + begin, static_cast<std::size_t>(b)), epoch_,
        pin_);
}

std::optional<Batch> Loader::next() {
    return ring_->next();
}

} // namespace trainscope::data
