// GradientSynchronizer: data-parallel gradient averaging as DDP does it. Parameters are packed into
// buckets (reverse registration order, one dtype per bucket, a small first bucket, then capped in
// bytes); each parameter's .grad is a view into its bucket's flat buffer (DDP's
// gradient_as_bucket_view), so backward accumulates straight into the bucket; a post-accumulate-
// grad hook per parameter launches a bucket's asynchronous in-place allreduce as soon as all its
// gradients exist, so communication overlaps the rest of backward; finish() waits for them.
#pragma once

#include <torch/serialize.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/options.hpp"
#include "trainscope/distributed/parallel_comm.hpp"

namespace trainscope::dist {

// Usage per iteration:   sync.begin_iteration(); loss.backward(); sync.finish(); optimizer.step();
// Gradient accumulation: run the first micro-batches' backward passes without begin_iteration()
// (hooks are idle then, gradients just accumulate locally), and call begin_iteration() before the
// last micro-batch's backward: the hooks then reduce the accumulated .grad.
// Running backward twice inside one iteration (between begin_iteration() and finish()) is an
// error: the second gradient of a parameter lands in a bucket that may already be in flight, so
// the hook throws core::InternalError, which surfaces from backward().
//
// Gradients as bucket views: the constructor points every parameter's .grad at its slice of the
// bucket buffer (copying a .grad that already existed), with the parameter's own strides (so a
// channels_last weight gets a channels_last gradient, as autograd would make it). The slices share
// the bucket's storage but are not autograd views, so LibTorch's Optimizer::zero_grad (which
// calls detach_() on every .grad) accepts them. Zero gradients
// in place (optimizer.zero_grad(/*set_to_none=*/false), LibTorch's default is true): that keeps
// the views and no gradient is ever copied. Anything that replaces a .grad (set_to_none=true,
// assigning .grad, backward with create_graph=true) detaches it from the bucket; the synchronizer
// notices when the parameter's gradient is ready (its data pointer is not its slice's), copies it
// into the bucket once and points .grad back at the slice, as DDP does; an undefined .grad counts
// as zeros and is re-pointed too. So set_to_none=true stays correct but costs one copy per
// parameter per iteration, the copy this design exists to avoid. Parameters that are not
// non-overlapping and dense (e.g. a strided slice made a leaf) cannot be viewed with their own
// strides: they keep the copy path (their .grad is separate, copied into the bucket at launch and
// back after the allreduce).
//
// Compression (dist.compress, CompressionOptions), per bucket, as PyTorch's DDP communication
// hooks: fp16/bf16 copy the bucket into a 16-bit buffer, divide it by the world size, allreduce
// the sum and copy it back (fp16_compress_hook / bf16_compress_hook); powersgd runs
// PowerSgd (powersgd.hpp) after start_iter plain iterations: the uncompressed members' and P's
// allreduces start when the bucket is ready, Q's in finish(). none is the plain allreduce above,
// unchanged. Nothing is compressed at world size 1 (nothing is communicated).

class GradientSynchronizer {
  public:
    // PyTorch's dist._DEFAULT_FIRST_BUCKET_BYTES.
    static constexpr std::size_t kDefaultFirstBucketBytes = std::size_t{1} << 20;

    // parameters: leaves that require grad, all on comm.device()'s device type. Keeps references
    // (the tensors share storage with the model's parameters) and sets their .grad to bucket views.
    // Caps in bytes: the first bucket of each dtype (the first reduced, holding the last-registered
    // parameters, whose gradients backward produces first) is capped at
    // min(first_bucket_cap_bytes, bucket_cap_bytes), so communication starts early in backward;
    // the others at bucket_cap_bytes. A bucket exceeds its cap only when one parameter does.
    // compression: dist.compress and its options (none: the plain allreduce).
    GradientSynchronizer(Communicator& comm, std::vector<torch::Tensor> parameters,
                         std::size_t bucket_cap_bytes,
                         std::size_t first_bucket_cap_bytes = kDefaultFirstBucketBytes,
                         const CompressionOptions& compression = {});
    ~GradientSynchronizer(); // removes its hooks
    GradientSynchronizer(const GradientSynchronizer&) = delete;
    GradientSynchronizer& operator=(const GradientSynchronizer&) = delete;

    // Copies root's parameters (and buffers, e.g. batch-norm statistics) to every rank, so that all
    // ranks start equal. Collective.
    void broadcast_parameters(int root = 0, const std::vector<torch::Tensor>& buffers = {});

    void begin_iteration(); // before backward: arms the hooks
    // After backward: launches the buckets not yet launched (a parameter without .grad contributes
    // zeros; afterwards every parameter has a .grad), waits for all; the averages are then in the
    // bucket buffers, i.e. in .grad (copy-path parameters get them copied). Returns the seconds
    // spent waiting (exposed communication; with NCCL the wait is stream-ordered, so this is only
    // host overhead and the GPU wait shows in the CUDA timeline).
    double finish();

    std::size_t num_buckets() const;
    // Payload per bucket, launch order (compressed: what a compressed iteration sends).
    std::vector<std::size_t> bucket_bytes() const;
    std::vector<std::vector<std::size_t>> bucket_parameters() const; // parameter indices per bucket
    // Bucket k's flat gradient buffer [numel] in the parameters' dtype (launch order); the .grad
    // of its members are views into it. For tests and memory accounting; do not resize it.
    const torch::Tensor& bucket_buffer(std::size_t k) const;
    // Whether parameter i's .grad is meant to be a view into its bucket (false: copy path, see
    // above).
    bool gradient_is_bucket_view(std::size_t i) const;
    // Bytes allreduced per iteration (sum of bucket_bytes(); 0 when world size is 1: no traffic).
    // Under compression the compressed payload (powersgd: once it started).
    std::uint64_t bytes_per_iteration() const;
    // Of the last finished iteration: buckets launched from hooks during backward vs in finish().
    std::size_t buckets_launched_in_backward() const;
    std::size_t buckets_launched_in_finish() const;
    // Of the last finished iteration, as ParallelComm (parallel_comm.hpp): bytes, uncompressed
    // bytes, exposed_s (what finish() waited), bucket_bytes, bucket_s and collective_s (their
    // sum), error_norm (powersgd); all zeros, one entry per bucket, before the first finish().
    // bucket_s is measured where the collective ran: on the MPI backend's progress thread from
    // start to end (so it excludes time queued behind earlier buckets); on NCCL between CUDA
    // events on the communicator's stream, resolved here, which blocks until the GPU finished the
    // last bucket: read it late, or take last_iteration_pending() and resolve it later. Results
    // are cached; a later finish() replaces them.
    ParallelComm last_iteration() const;
    // The last finished iteration without waiting for anything: `known` holds the bytes, the
    // exposed wait and one NaN duration per bucket; resolve() gives last_iteration()'s figures of
    // that iteration, however many iterations later it is called.
    PendingParallelComm last_iteration_pending() const;

    const CompressionOptions& compression() const;
    // Iterations finished so far (with the count a checkpoint carried); powersgd starts at
    // compression().start_iter.
    std::int64_t iterations() const;
    // Checkpoints of the compression's state, under dist.compress=powersgd at world size > 1
    // (otherwise nothing is written and loading is a no-op): every rank writes the sub-archive
    // "grad_compression" (the iteration count, Q replicated, its own error feedback). load:
    // `replicated` is a saved rank's archive holding the replicated part (rank 0's), `own` this
    // rank's own archive, or null where the saved job had no such rank (elastic resume: its error
    // feedback starts at zero). Archives without the sub-archive (saved without powersgd) leave
    // the state fresh (count 0, no Q).
    void save_compression_state(torch::serialize::OutputArchive& out) const;
    void load_compression_state(torch::serialize::InputArchive& replicated,
                                torch::serialize::InputArchive* own, const std::string& where);
    bool has_compression_state() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// The bytes a GradientSynchronizer keeps per rank beside the gradients themselves (its buckets
// are the gradients), for trainable tensors of these sizes, all in `dtype`, on `world` ranks of
// `backend`: none at one rank (nothing travels); on MPI, a float32 copy of 16-bit gradients (what
// the allreduce runs on); with dist.compress=fp16/bf16, a 16-bit copy; with powersgd, the
// uncompressed tensors, the error feedback of the compressed ones (together one element per
// gradient element) and their P and Q. The memory plans count it (dist.zero=0).
double synchronizer_buffer_bytes(const std::vector<std::vector<std::int64_t>>& sizes,
                                 torch::ScalarType dtype, const std::string& backend, int world,
                                 const CompressionOptions& compression);

} // namespace trainscope::dist
