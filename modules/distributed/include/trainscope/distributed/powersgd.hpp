// PowerSGD gradient compression (Vogels, Karimireddy, Jaggi 2019, "PowerSGD: Practical Low-Rank
// Gradient Compression for Distributed Optimization"), per DDP gradient bucket, as PyTorch's
// powerSGD_hook does it; the GradientSynchronizer drives it under dist.compress=powersgd.
//
// Per bucket and iteration, with W ranks and rank r = dist.powersgd_rank:
//   members of dimension <= 1, and matrices n x m (a member [d0, d1, ...] as d0 x d1*...) whose
//   compression would save less than min_compression_rate ((n + m) * r' * rate >= n * m, with
//   r' = min(n, m, r)), are copied into one flat buffer, allreduced (sum) and divided by W;
//   every other matrix M (its slice of the bucket, in memory order, so a channels-last weight's
//   columns are permuted, which a low-rank approximation does not care about):
//     M += e                       error feedback (e: this rank's residual, zero at first)
//     P = M Q                      [n, r'];  Q [m, r'] is replicated on every rank
//     allreduce(P) (sum), orthogonalize P (Gram-Schmidt, column by column)
//     Q = M^T P, allreduce(Q) (sum), Q /= W
//     M' = P Q^T                   the same on every rank: the averaged gradient's approximation
//     e = M - M'                   (M with the feedback added), and M is replaced by M'
// Q starts as torch::randn (on a CPU generator seeded with powersgd_q_seed(iteration, bucket), so
// every rank draws the same) orthogonalized; with warm start it is kept from one iteration to the
// next (orthogonalized again before use), without it drawn anew every iteration.
//
// Differences from PyTorch's hook: its error feedback covers the whole bucket, so uncompressed
// tensors carry "local minus average" residuals whose sum over ranks is zero; here only compressed
// matrices carry a residual (the averages are the same up to rounding, and the recorded error norm
// is the compression's alone). A column of P whose norm is 0 (a zero gradient matrix, e.g. LoRA's
// A while B is still zero) stays 0 instead of becoming NaN (PyTorch divides by the norm unguarded
// unless given an epsilon). Matrices are not batched by shape.
#pragma once

#include <torch/serialize.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/options.hpp"

namespace trainscope::dist {

// The seed of the CPU generator that draws bucket `bucket`'s initial Q at `iteration` (the
// synchronizer's iteration count): a fixed mix of both, the same on every rank.
std::uint64_t powersgd_q_seed(std::int64_t iteration, std::size_t bucket);
// Gram-Schmidt orthonormalization of the columns of `m` [n, k] in place (PyTorch's
// _orthogonalize_gram_schmidt with epsilon 0, except that a zero column stays zero).
void orthogonalize_columns(torch::Tensor& m);
// Whether PowerSGD compresses a gradient of these sizes (see above), and the rank r' it uses.
bool powersgd_compresses(torch::IntArrayRef sizes, std::int64_t rank, double min_compression_rate,
                         std::int64_t* used_rank = nullptr);

class PowerSgd {
  public:
    // A bucket member: its element offset in the bucket's flat buffer and its sizes.
    struct Member {
        std::int64_t offset = 0;
        std::vector<std::int64_t> sizes;
    };

    PowerSgd(Communicator& comm, const CompressionOptions& options);
    ~PowerSgd();
    PowerSgd(const PowerSgd&) = delete;
    PowerSgd& operator=(const PowerSgd&) = delete;

    // Registers the next bucket: `grads` [numel] is its flat buffer (the allreduce's data).
    void add_bucket(const torch::Tensor& grads, const std::vector<Member>& members);

    // Per compressed iteration and bucket k, in bucket order on every rank:
    //   launch(k)      (when its gradients are ready) error feedback, P = M Q; starts the
    //                  allreduces of the uncompressed members and of P. Returns the handle of
    //                  all the bucket's collectives (Q's joins it in exchange_q).
    //   exchange_q(k)  (every bucket, after all launches) waits for P, orthogonalizes it,
    //                  Q = M^T P, starts Q's allreduce.
    //   finish(k)      (after Q arrived: wait for the handle) the averaged uncompressed members
    //                  and M' = P Q^T into the bucket, the new error feedback.
    std::shared_ptr<Work> launch(std::size_t k, std::int64_t iteration);
    void exchange_q(std::size_t k);
    void finish(std::size_t k);

    // Payload per iteration of bucket k when compressed: uncompressed members + P + Q bytes.
    std::size_t compressed_bytes(std::size_t k) const;
    // Squared L2 norm of every bucket's error feedback after the last finish() (float64 scalar
    // on the device; undefined before the first compressed iteration): no host read here.
    torch::Tensor error_norm_squared() const;

    // Checkpoints: replicated state (each bucket's Q, once drawn) and this rank's error feedback,
    // under `out`'s keys "q<k>", "error<k>".
    void save(torch::serialize::OutputArchive& out) const;
    // Q from `replicated` (a rank of the saved job, rank 0's), error feedback from `own` (this
    // rank's file) or zeros when null (a rank the saved job did not have). A tensor of another
    // size (another model, bucket cap or rank) is an InputError naming `where`.
    void load(torch::serialize::InputArchive& replicated, torch::serialize::InputArchive* own,
              const std::string& where);

  private:
    struct Bucket;
    void draw_q(Bucket& b, std::size_t k, std::int64_t iteration);
    Communicator& comm_;
    CompressionOptions o_;
    std::vector<std::unique_ptr<Bucket>> buckets_;
};

} // namespace trainscope::dist
