// Synchronised batch normalisation (cv.sync_bn): BatchNorm2d whose training-mode statistics are
// those of the JOINT batch of all ranks, as PyTorch's SyncBatchNorm. The models module knows
// nothing of MPI or NCCL: the cross-rank sum is a callback, normally Communicator::allreduce(t,
// Sum).
#pragma once

#include <torch/torch.h>

#include <functional>

namespace trainscope::models {

// Sums `t` in place over all ranks (collective: every rank calls it in the same order with a tensor
// of the same shape and dtype). Tensors are contiguous, on the input's device, float32 or float64.
using AllreduceSum = std::function<void(torch::Tensor&)>;

// Parameters and buffers are named, shaped and ordered exactly like torch::nn::BatchNorm2d's
// (weight, bias, running_mean, running_var, num_batches_tracked), so state dicts and optimizers
// see the same model with either. Options are BatchNorm2d's (eps, momentum incl. nullopt =
// cumulative average, affine, track_running_stats).
//
// Training mode (communicates; every rank must call forward and backward of every layer):
//   forward: one allreduce of a float64 [2C + 1] buffer (per-channel sum, sum of squares, and the
//     element count per channel) gives mean and biased variance over the joint batch, which
//     normalise the local input; running_mean / running_var move towards the joint mean and the
//     unbiased joint variance with `momentum`, as BatchNorm2d. Local batches may differ in size
//     (even be empty); the joint batch needs more than one value per channel.
//   backward: one allreduce of [2C] (per-channel sum(dy), sum(dy * (x - mean))) makes the input
//     gradient that of BatchNorm2d over the joint batch; weight and bias gradients are this rank's
//     LOCAL contributions.
// Gradient convention: the gradients computed are those of the SUM of the ranks' losses (the input
// gradient on rank r is d(sum_s L_s)/dx_r; weight/bias gradients summed over ranks give
// d(sum_s L_s)/dw). DDP then divides the summed parameter gradients by the world size R, so with
// each rank's loss the mean over its local batch and equal local batches, every parameter gradient
// equals that of one process over the joint batch with a mean loss (input gradients, which DDP
// does not average, are R times the joint-mean ones). With unequal local batches take
// L_r = sum_local(l) * R / B_joint to keep the same equality.
// Eval mode with running stats: BatchNorm2d's eval path, no communication.
class SyncBatchNorm2dImpl : public torch::nn::Cloneable<SyncBatchNorm2dImpl> {
  public:
    SyncBatchNorm2dImpl(const torch::nn::BatchNorm2dOptions& options, AllreduceSum allreduce_sum);
    torch::Tensor forward(const torch::Tensor& x); // [N, C, H, W] (any memory format) → same

    void reset() override;
    void reset_parameters();
    void reset_running_stats();
    void pretty_print(std::ostream& stream) const override;

    torch::nn::BatchNorm2dOptions options;
    torch::Tensor weight, bias;                                   // [C] (affine only)
    torch::Tensor running_mean, running_var, num_batches_tracked; // [C], [C], [] int64

  private:
    AllreduceSum allreduce_sum_;
};
TORCH_MODULE(SyncBatchNorm2d);

} // namespace trainscope::models
