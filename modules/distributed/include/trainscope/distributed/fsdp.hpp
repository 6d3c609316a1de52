// Fully sharded data parallelism (dist.zero=3; ZeRO stage 3, Rajbhandari et al. 2020; FSDP as
// torchtune's distributed recipes run it) for any model given as units (UnitModel: train adapts
// the Llama model, every fine-tuning method).
//
// Units (core::UnitHooks): for Llama the embedding, each decoder layer, the head (final norm +
// lm_head).
// A unit's tensors (parameters and buffers: dense, LoRA, NF4 codes and scales) are grouped by
// (dtype, trainable); each group is one flat buffer of N x shard elements (N ranks, zero padding at
// the end) of which rank r keeps elements [r * shard, (r + 1) * shard) permanently. The module's
// tensors are views of the group's full buffer, whose storage exists only while the unit is
// gathered: the engine swaps the storage's memory in and out, so every view (including those
// autograd saved for backward) sees the gathered values when they are there.
//
//   forward, unit u:   wait for u's all-gather (issue it if no prefetch did), issue u+1's
//                      (dist.prefetch), compute, free u (dist.reshard_after_forward; the head,
//                      needed by backward at once, is kept; without grad every unit is freed).
//   backward, unit u:  before: u gathered again (waits for its all-gather; issues u-1's); after:
//                      u's trainable gradients are copied into one flat buffer per group,
//                      reduce-scattered asynchronously (sum) into a buffer the shard gradient is
//                      accumulated from, and u is freed. The embedding's backward needs no weights
//                      (it is finished after backward()); with tied embeddings the embedding stays
//                      gathered from forward to the end of backward (the head uses it).
//   step:              AdamW on the local shard (torch.optim.AdamW's arithmetic); the next
//                      forward's all-gathers distribute the updated values.
// Gradient accumulation reduce-scatters every micro-batch (FSDP's default) and sums the shards.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/parallelism.hpp"
#include "trainscope/distributed/unit_model.hpp"
#include "trainscope/distributed/zero.hpp"

namespace trainscope::dist {

struct FsdpOptions {
    bool reshard_after_forward = true;
    bool prefetch = true;
    ZeroAdamW adamw;
    // dist.compress=fp16/bf16 (compressed_dtype): the gradient reduce-scatters travel in it
    // (FSDP2's reduce_dtype), each unit's flat gradient cast and divided by the world size before
    // the sum, the shard widened when it is accumulated.
    std::optional<torch::ScalarType> reduce_dtype;
    // Called with each unit's index before that unit is sharded, for models built on the meta
    // device (LlamaForCausalLMImpl::Materialize::PerUnit); empty when the model is materialised.
    std::function<void(int unit)> materialize;
};

// Communication of one iteration. *_s: the collectives' own durations (Work::seconds; MPI: on the
// progress thread; NCCL: GPU time between events on the communicator's stream); *_exposed_s:
// how long the computation waited for them (Work::exposed_seconds; MPI: the training thread's
// host wait; NCCL: how long the compute stream stalled at the wait, from CUDA events).
// overlapped = seconds - exposed.
struct FsdpIterationComm {
    double allgather_bytes = 0, allgather_s = 0, allgather_exposed_s = 0;
    double reduce_scatter_bytes = 0, reduce_scatter_s = 0, reduce_scatter_exposed_s = 0;
    double reduce_scatter_uncompressed_bytes = 0; // the same without reduce_dtype
    std::int64_t allgathers = 0, reduce_scatters = 0;
};

// One iteration's collectives before their durations are known: bytes and counts in `known`
// (seconds 0), and the handles, waited for in the iteration. resolve() reads the handles' seconds
// and exposed seconds, which blocks until they finished on the device (NCCL): call it late, at
// the training loop's resolution point.
struct FsdpPendingComm {
    FsdpIterationComm known;
    std::vector<std::shared_ptr<Work>> gathers, reduces;
    FsdpIterationComm resolve() const;
};

class FsdpModel final : public core::UnitHooks {
  public:
    // Collective. Shards `model` (built identically on every rank; rank 0's values are broadcast
    // first) and installs itself as the model's unit hooks. The model must outlive this object.
    FsdpModel(Communicator& comm, UnitModel& model, FsdpOptions options);
    ~FsdpModel() override;
    FsdpModel(const FsdpModel&) = delete;
    FsdpModel& operator=(const FsdpModel&) = delete;

    void before_forward(int unit) override;
    void after_forward(int unit) override;
    void before_backward(int unit) override;
    void after_backward(int unit) override;

    // Iteration protocol: begin_iteration() (zero the gradient shards), then per micro-batch
    // forward + backward() + end_backward() (finishes units autograd did not, frees everything),
    // then finish_gradients(scale) (waits for the reduce-scatters; shard gradients summed over
    // ranks x scale / N), then step(lr).
    void begin_iteration();
    void end_backward();
    void finish_gradients(double grad_scale);
    void wait_reduces(); // the gradient reduce-scatters in flight (finish_gradients waits too)
    // A float64 marker of this rank's trainable gradient shards on the device (NaN iff an element
    // is NaN/Inf, else 0: nonfinite_marker; undefined when there are none), for nonfinite_flag.
    // No host read.
    torch::Tensor shard_gradient_sum() const;
    void step(double lr);
    // The iteration's collectives, without waiting (call after finish_gradients); the next
    // begin_iteration() starts counting anew.
    FsdpPendingComm take_iteration_comm();
    FsdpIterationComm iteration_comm(); // take_iteration_comm().resolve()

    // Collective: the full values of the trainable tensors, in `names` order (CPU clones).
    std::vector<torch::Tensor> gather_trainable(const std::vector<std::string>& names);
    // Collective: gathers every unit's trainable groups into the module (frozen ones stay
    // sharded), runs fn, frees them. For exporting adapters.
    void with_trainable_gathered(const std::function<void()>& fn);

    // Checkpoints: this rank's shards of the trainable tensors and their optimizer state.
    void save(torch::serialize::OutputArchive& out) const;
    void load(torch::serialize::InputArchive& in);
    // Elastic resume: every trainable group's parameter and moment shards cut again from the
    // shards another rank count saved (a group's flat layout does not depend on the rank count).
    void load_resharded(ShardSource& saved);

    // Bytes this rank holds outside gathered units (shards), by kind; and now gathered.
    double trainable_shard_bytes() const;
    double frozen_shard_bytes() const; // dense frozen weights and NF4 buffers
    double nf4_shard_bytes() const;
    double gradient_bytes() const; // shard gradients (+ flat gradients still in flight)
    double optimizer_state_bytes() const;
    double gathered_bytes() const;
    double largest_unit_bytes() const; // one unit's full (gathered) tensors
    int num_units() const { return static_cast<int>(units_.size()); }

  private:
    struct Group;
    struct Unit;
    struct PendingReduce;
    void gather(Unit& u); // issues the all-gathers (async)
    void wait_gathered(Unit& u);
    void free(Unit& u);
    void reduce_gradients(Unit& u);
    void retire_reduce(); // waits for the oldest reduce-scatter and accumulates it
    bool keep_after_forward(int unit) const;
    double sum_groups(const std::function<double(const Group&)>& bytes) const;

    Communicator& comm_;
    // The all-gathers' own communicator where the backend has one (Communicator::make_lane:
    // NCCL), else null and they share comm_ with the reduce-scatters.
    std::unique_ptr<Communicator> gather_lane_;
    UnitModel& model_;
    FsdpOptions o_;
    int rank_ = 0, world_ = 1;
    std::vector<std::unique_ptr<Unit>> units_;
    std::deque<PendingReduce> reduces_;
    std::vector<std::shared_ptr<Work>> gathers_done_, reduces_done_;
    FsdpIterationComm comm_now_;
    std::int64_t step_count_ = 0;
};

// FSDP as a DataParallelism. `trainable_names`: the model's trainable parameters in the order
// full_trainable() returns them; empty = those that require grad once every unit is materialised,
// in the model's order. The result keeps `model` (the adapter) alive; the model it adapts must
// outlive the result.
std::unique_ptr<DataParallelism> make_fsdp(Communicator& comm, std::shared_ptr<UnitModel> model,
                                           FsdpOptions options,
                                           std::vector<std::string> trainable_names);

} // namespace trainscope::dist
