// ZeRO data parallelism for full fine-tuning (Rajbhandari et al. 2020), stages 1 and 2, over the
// run's Communicator. The trainable parameters become views into one flat buffer (padded to a
// multiple of the world size) and their gradients views into a flat gradient buffer, so backward
// accumulates straight into it. Rank r owns the contiguous shard r of both.
//   step(): reduce-scatter the flat gradients (sum) into this rank's shard, average, scale, AdamW
//   on the shard (exactly torch.optim.AdamW's arithmetic, state only for the shard), all-gather
//   the updated shards into the flat parameters.
//   Stage 1 keeps the full gradient buffer between iterations; stage 2 releases it after the
//   reduce-scatter (gradients exist in full only during backward and the reduce-scatter; outside
//   it only the shard), and allocates it again before the next backward.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/fused_optim.hpp"
#include "trainscope/distributed/parallelism.hpp"

namespace trainscope::dist {

// One AdamW update of `param` in place, exactly torch.optim.AdamW's arithmetic (decoupled decay,
// then the moments, bias corrections from `step` = 1, 2, ...), one operation at a time: ZeRO and
// FSDP step their shards with it when h.fused is false, else with fused_adamw_update (the same
// arithmetic in one kernel), so sharding never changes the optimizer's arithmetic.
void adamw_update(torch::Tensor& param, const torch::Tensor& grad, torch::Tensor& exp_avg,
                  torch::Tensor& exp_avg_sq, std::int64_t step, double lr, const ZeroAdamW& h);

// `values` (1-D, contiguous) converted to `dtype`, in place where dtype is at most half as wide:
// the result is a view of the start of values' own storage, whose values are then gone; the
// transient is one temporary of at most kNarrowInPlaceFirst elements instead of a whole copy
// (ZeRO's 16-bit reduce-scatter input: 2 bytes per parameter less at the step's end). The same
// dtype: values itself; narrower by less than half (or not 1-D contiguous): a copy.
inline constexpr std::int64_t kNarrowInPlaceFirst = 4096;
torch::Tensor narrow_in_place(const torch::Tensor& values, torch::ScalarType dtype);

class ZeroOptimizer {
  public:
    // parameters: same dtype and device. Broadcasts rank 0's values first (all ranks start equal).
    // reduce_dtype (dist.compress=fp16/bf16, compressed_dtype): the gradients' reduce-scatter
    // travels in it: the flat gradients cast to it and divided by the world size, summed, the
    // shard cast back (FSDP2's reduce_dtype with PyTorch's fp16 hook's pre-division). The cast
    // overwrites the flat gradient (narrow_in_place), whose values stage 1 then no longer holds.
    ZeroOptimizer(Communicator& comm, std::vector<torch::Tensor> parameters, int stage,
                  ZeroAdamW hyper, std::optional<torch::ScalarType> reduce_dtype = std::nullopt);
    // Before the first backward of an iteration: zeroes the gradient buffer (stage 2: allocates
    // it) and points every parameter's .grad at its view.
    void zero_grad();
    // After the last backward: gradients are summed across ranks, divided by the world size and
    // multiplied by grad_scale (torchtune's token normalisation), then the shard steps. Returns
    // the host seconds of the reduce-scatter call (MPI: the collective, nothing overlaps it;
    // NCCL: only its launch, the host does not wait): account with reduce_work() instead.
    double reduce_gradients(double grad_scale = 1.0);
    // The last reduce-scatter's handle, for accounting: Work::seconds() is the collective's own
    // duration (MPI: the blocking call's host time; NCCL: CUDA events on its stream), resolved
    // late (it blocks until the collective finished on the device). Null before the first.
    std::shared_ptr<Work> reduce_work() const { return reduce_work_; }
    void step(double lr);
    double allgather_seconds() const { return allgather_s_; } // host time of the call
    // The last step's parameter all-gather, for accounting like reduce_work(): Work::seconds()
    // is the collective's own duration (NCCL: CUDA events on its stream). Null before a step.
    std::shared_ptr<Work> gather_work() const { return gather_work_; }
    // After reduce_gradients: a float64 marker of this rank's gradient shard on the device (NaN iff
    // an element is NaN/Inf, else 0: nonfinite_marker; undefined for an empty shard), for
    // nonfinite_flag. No host read.
    torch::Tensor shard_gradient_sum() const;
    // Checkpoints: this rank's shard of the optimizer state (moments, step count).
    void save(torch::serialize::OutputArchive& out) const;
    void load(torch::serialize::InputArchive& in);
    // Elastic resume: this rank's shard of the moments cut from the shards that another rank
    // count saved (the flat layout is the parameters' order, whatever the rank count).
    void load_resharded(ShardSource& saved);

    int stage() const { return stage_; }
    std::int64_t numel() const { return numel_; }       // trainable elements (unpadded)
    std::int64_t shard_numel() const { return shard_; } // elements per rank
    // Bytes held now: full parameters, gradients (full or shard), optimizer state (shard).
    double parameter_bytes() const;
    double gradient_bytes() const;
    double optimizer_state_bytes() const;
    double bytes_per_iteration() const; // reduce-scatter input + all-gather output payload
    double uncompressed_bytes_per_iteration() const; // the same without reduce_dtype

  private:
    Communicator& comm_;
    std::vector<torch::Tensor> params_;
    int stage_;
    ZeroAdamW hyper_;
    std::optional<torch::ScalarType> reduce_dtype_;
    int world_ = 1, rank_ = 0;
    std::int64_t numel_ = 0, padded_ = 0, shard_ = 0;
    torch::Tensor flat_param_, flat_grad_, shard_grad_, exp_avg_, exp_avg_sq_;
    torch::Tensor shard_low_; // [shard] in reduce_dtype_, the reduce-scatter's output
    std::int64_t step_count_ = 0;
    double allgather_s_ = 0;
    std::shared_ptr<Work> gather_work_;
    std::shared_ptr<Work> reduce_work_;
};

// ZeRO-1/2 as a DataParallelism (replicated weights, sharded optimizer state and gradients).
std::unique_ptr<DataParallelism> make_zero(Communicator& comm, TrainableSet trainable, int stage,
                                           ZeroAdamW hyper,
                                           std::optional<torch::ScalarType> reduce_dtype = {});

// The bytes a ZeroOptimizer (dist.zero=1/2) keeps per rank beyond the gradients and optimizer
// state for `numel` trainable elements on `world` ranks: with dist.compress=fp16/bf16 the
// reduce-scatter's 16-bit shard, ceil(numel / world) elements; 0 otherwise or at one rank. The
// memory plans' comm term under ZeRO.
double zero_buffer_bytes(std::int64_t numel, int world, const CompressionOptions& compression);

} // namespace trainscope::dist
