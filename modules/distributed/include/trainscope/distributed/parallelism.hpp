// Data parallelism as one component, for both workloads. A model's trainable tensors are
// parallelised once (train's make_data_parallelism picks DDP or ZeRO-1/2 from dist.zero for the CV
// and LLM trainers, parallelize_llm adds FSDP) and the training step drives the result through
// this interface without knowing which kind it is:
//
//   begin_iteration()                    before the first micro-batch
//   per micro-batch: forward, before_last_backward() (last micro-batch only), backward,
//                    after_backward()
//   finish_gradients(scale)              gradients summed over ranks, / world, x scale
//   [finite check: full_gradient_parameters() and gradient_shard_sums()]
//   set_lr(lr), step(via) or skip_step()
//   take_iteration_comm(), held_bytes()  accounting (one ParallelComm record, durations resolved
//                                        later)
//   save(), load()                       checkpoints (replicated parts on rank 0, shards per rank)
//
// Implementations: DDP (dist::DdpParallelism: bucketed allreduce overlapping backward, a local
// optimizer), ZeRO-1/2 (ZeroParallelism over ZeroOptimizer) and FSDP (FsdpParallelism over
// FsdpModel, dist.zero=3). They differ only behind this interface.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainscope/distributed/options.hpp"
#include "trainscope/distributed/parallel_comm.hpp"

namespace trainscope::dist {

class GradientSynchronizer;

// The shards of a checkpoint, for loading them at the same or another rank count (train's
// CheckpointShards reads them from the checkpoint directory).
class ShardSource {
  public:
    virtual ~ShardSource() = default;
    virtual int saved_world() const = 0;
    virtual const std::string& where() const = 0; // the checkpoint, for messages
    // Old rank r's archive (read once).
    virtual torch::serialize::InputArchive& rank(int r) = 0;
    // This rank's shard for `new_world` ranks of the flat tensor `name` inside the sub-archive
    // `sub`, assembled from the saved ranks' shards: [ceil(numel / new_world)], zero-padded.
    virtual torch::Tensor reshard(const std::string& sub, const std::string& name,
                                  std::int64_t numel, int new_rank, int new_world) = 0;
};

// Bytes this rank holds for the trainable tensors (parameters, gradients, optimizer state), and
// gathered full weights (NaN where the kind never gathers).
struct HeldBytes {
    double trainable = 0, gradients = 0, optimizer_state = 0;
    double gathered = ParallelComm::kNaN;
};

// Steps a local optimizer (the trainer's loss scaler may skip it): returns whether it stepped.
using OptimizerStep = std::function<bool(torch::optim::Optimizer&)>;

class DataParallelism {
  public:
    virtual ~DataParallelism() = default;
    virtual std::string name() const = 0; // "ddp", "zero1", "zero2", "fsdp"

    virtual void begin_iteration() {}
    virtual void before_last_backward() {}
    virtual void after_backward() {}
    // Waits for gradient collectives already in flight (so that their wait is counted as theirs
    // before other host collectives queue behind them).
    virtual void wait_in_flight() {}
    // After the last backward: every trainable gradient summed over ranks, divided by the world
    // size and multiplied by grad_scale (a sharded kind keeps only this rank's shard).
    virtual void finish_gradients(double grad_scale) = 0;
    // The parameters whose full gradients this rank holds after finish_gradients (for the
    // finite check and the loss scaler), and float64 device sums of gradient shards (NaN/Inf iff
    // an element is) for the kinds that keep only a shard.
    virtual std::vector<torch::Tensor> full_gradient_parameters() const { return {}; }
    virtual std::vector<torch::Tensor> gradient_shard_sums() const { return {}; }

    virtual void set_lr(double lr) = 0;
    // Steps the optimizer (a local one through `via`). Returns whether it stepped.
    virtual bool step(const OptimizerStep& via) = 0;
    // run.nonfinite=skip: no step; gradients cleared for the next iteration.
    virtual void skip_step() {}

    // The iteration's communication (after finish_gradients); the next begin_iteration() starts
    // counting anew.
    virtual PendingParallelComm take_iteration_comm() = 0;
    virtual HeldBytes held_bytes() const = 0;
    // The frozen tensors this rank holds (dense weights, NF4 buffers), given the model's full
    // counts: unchanged unless the kind shards them.
    virtual void frozen_bytes(double& dense, double& nf4) const {
        (void)dense;
        (void)nf4;
    }

    // Checkpoints. save: rank 0 writes the replicated state, every rank its shard. load: from
    // the same rank count, or (elastic) from another one's shards.
    virtual void save(torch::serialize::OutputArchive& out, int rank) const = 0;
    virtual void load(ShardSource& saved, int rank, bool elastic) = 0;

    // Collective under sharding: the full values of the trainable tensors (CPU clones, in the
    // order the kind was built with).
    virtual std::vector<torch::Tensor> full_trainable() = 0;
    // Collective under sharding: runs fn with the full trainable tensors in the model.
    virtual void with_full_trainable(const std::function<void()>& fn) { fn(); }

    // DDP's bucketed synchronizer (bucket layout for the run file); null for other kinds.
    virtual const GradientSynchronizer* synchronizer() const { return nullptr; }
};

// Bytes of a tensor (0 when undefined), and of an optimizer's per-parameter state (AdamW moments,
// SGD momentum buffers).
inline double bytes_of(const torch::Tensor& t) {
    return t.defined() ? static_cast<double>(t.nbytes()) : 0.0;
}
double optimizer_state_bytes(torch::optim::Optimizer& optimizer);

// Named tensors in checkpoints: written under their names, loaded in place (views and strides
// stay) with a missing tensor or a shape mismatch named as an InputError on `where`.
void save_tensors(torch::serialize::OutputArchive& out, const std::vector<std::string>& names,
                  const std::vector<torch::Tensor>& tensors, bool buffers = false);
void load_tensors(torch::serialize::InputArchive& in, const std::vector<std::string>& names,
                  std::vector<torch::Tensor>& tensors, const std::string& where,
                  bool buffers = false);

class Communicator;

// The trainable tensors a data-parallel kind works on: names and values (same order).
struct TrainableSet {
    std::vector<std::string> names;
    std::vector<torch::Tensor> tensors;
};

// Replicated trainable weights in a checkpoint: the sub-archive "weights" of rank 0's file.
void save_weights(torch::serialize::OutputArchive& out, const TrainableSet& trainable);
void load_weights(ShardSource& saved, TrainableSet& trainable);
std::vector<torch::Tensor> cpu_clones(const std::vector<torch::Tensor>& tensors);

// dist.compress=fp16/bf16: the 16-bit dtype gradients travel in (DDP's buckets, the ZeRO/FSDP
// reduce-scatters' reduce dtype); nullopt for none and powersgd.
std::optional<torch::ScalarType> compressed_dtype(CompressionKind kind);

// DDP: the GradientSynchronizer (rank 0's values broadcast first; `compression`: dist.compress)
// and a local optimizer. Checkpoints carry PowerSGD's state (GradientSynchronizer::
// save_compression_state): every rank's file its error feedback, Q from rank 0's.
std::unique_ptr<DataParallelism> make_ddp(Communicator& comm, TrainableSet trainable,
                                          std::unique_ptr<torch::optim::Optimizer> optimizer,
                                          std::size_t bucket_bytes, std::size_t first_bucket_bytes,
                                          const CompressionOptions& compression = {});

} // namespace trainscope::dist
