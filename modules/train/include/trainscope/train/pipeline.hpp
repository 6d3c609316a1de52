// run.strategy=pipeline: MobileNetV2 split into contiguous stages over ranks (model parallelism),
// micro-batches streamed GPipe-style (all forwards, then all backwards), activations sent forward
// and gradients backward between neighbouring stages, data-parallel replicas of the whole pipeline
// (the order of the two communicators' operations: pipeline.cpp).
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainscope/distributed/communicator.hpp"
#include "trainscope/models/mobilenet_v2.hpp"

namespace trainscope::core {
class Config;
class OptionRegistry;
} // namespace trainscope::core

namespace trainscope::train {

// pipeline.stages, pipeline.microbatches, pipeline.balance, pipeline.cuts
void declare_pipeline_options(core::OptionRegistry& registry);

enum class PipelineBalance { Params, Flops };
const char* to_string(PipelineBalance balance);

struct PipelineOptions {
    int stages = 2;
    int microbatches = 4;
    PipelineBalance balance = PipelineBalance::Flops;
    std::string cuts; // "" or comma-separated unit indices where stages 1..S-1 begin
    static PipelineOptions from_config(const core::Config& config);
};

// The units a pipeline splits: MobileNetV2's 19 feature units ("features.0" stem, "features.1" ..
// "features.17" inverted residuals, "features.18" last 1x1 conv) and "head" (average pool,
// flatten, classifier).
constexpr int kPipelineUnits = 20;

struct PipelineUnit {
    std::string name;                 // "features.<i>" or "head"
    std::int64_t params = 0;          // trainable parameter elements
    std::int64_t macs = 0;            // multiply-accumulates per sample (convolutions, linear)
    std::vector<std::int64_t> output; // per-sample output shape: [C, H, W] or [classes]
};

struct StagePlan {
    int first_unit = 0, last_unit = 0; // inclusive unit indices
    std::vector<std::string> unit_names;
    std::int64_t params = 0, macs = 0;
    std::vector<std::int64_t> input, output; // per-sample activation shapes received / sent
};

struct PipelinePlan {
    PipelineBalance balance = PipelineBalance::Flops;
    bool explicit_cuts = false; // pipeline.cuts given (balance not used)
    std::int64_t image_size = 0;
    std::vector<std::int64_t> input; // per-sample image shape [C, S, S]
    std::vector<PipelineUnit> units; // kPipelineUnits
    std::vector<StagePlan> stages;
    int num_stages() const { return static_cast<int>(stages.size()); }
};

// Splits MobileNetV2 into `stages` contiguous, non-empty stages. Without `cuts`, the partition
// minimises the largest stage cost (parameters or MACs per sample; exact). `cuts`: comma-separated
// unit indices where stages 1..S-1 begin, strictly increasing in [1, 19]. ConfigError for
// stages < 2 or > 20 and for a malformed `cuts`, naming the option. Builds the model once on the
// CPU to count parameters; the global random generator is left as it was.
PipelinePlan plan_pipeline(const models::MobileNetV2Options& model, std::int64_t image_size,
                           int stages, PipelineBalance balance, const std::string& cuts = "");

// The split as a table (units, parameters, GFLOPs = 2 x MACs per sample, activation sent), for
// --dry-run.
std::string describe(const PipelinePlan& plan);

// Data-parallel replicas of the pipeline: world_size / stages. ConfigError when the world size is
// not a multiple of pipeline.stages, saying which rank counts to launch instead.
int pipeline_replicas(int world_size, int stages);

// Rank layout: world rank = replica * stages + stage.
struct PipelineGroups {
    int stage = 0, stages = 1, replica = 0, replicas = 1;
    std::unique_ptr<dist::Communicator> pipe; // the ranks of this replica, rank() == stage
    std::unique_ptr<dist::Communicator> dp;   // this stage across replicas, rank() == replica
};
// Collective over `world`. backend/device/timeout_s/allreduce as for dist::make_communicator
// (dist.allreduce=auto is decided per group: a data-parallel group with one rank per node is flat).
PipelineGroups make_pipeline_groups(MPI_Comm world, int stages, const std::string& backend,
                                    torch::Device device, double timeout_s = 0,
                                    const dist::AllreduceOptions& allreduce = {});

// One stage of the network: the units [first_unit, last_unit] of a full MobileNetV2, shared with
// it (not copied), so every rank can build the full model with the run's seed and keep its own
// units with parameters identical to the unsplit model's. Parameter and buffer names are the full
// model's ("features.7.conv.0.conv.weight", "classifier.1.bias").
class PipelineStageImpl : public torch::nn::Module {
  public:
    PipelineStageImpl(const models::MobileNetV2& full, const PipelinePlan& plan, int stage);
    // Stage 0: images [B, C, S, S]; others: the previous stage's output. Last stage: logits.
    torch::Tensor forward(const torch::Tensor& x);
    int stage() const { return stage_; }
    const StagePlan& plan() const { return plan_; }
    bool has_head() const { return static_cast<bool>(classifier_); }

  private:
    int stage_;
    StagePlan plan_;
    std::vector<torch::nn::AnyModule> units_; // the feature units in order
    torch::nn::Sequential classifier_{nullptr};
};
TORCH_MODULE(PipelineStage);

// GPipe schedule for one stage, driven identically on every stage of a pipe communicator (rank ==
// stage). A batch of B samples is split as torch::chunk(B, M) does (chunks of ceil(B/M), the last
// smaller, possibly fewer than M); receivers size their buffers from the plan's per-sample shapes,
// so stages exchange nothing but activations and gradients. Activations and gradients keep the
// stage's parameter dtype and device. Point-to-point goes in batches (Communicator::exchange):
// forward, per micro-batch {send output m to stage+1, receive input m+1 from stage-1}; backward
// mirrored. The engine communicates over `pipe` only; see pipeline.cpp for the order every rank
// keeps with the data-parallel communicator.
class PipelineEngine {
  public:
    // `batch_size`: samples per step on this replica, used by stages that are given neither images
    // nor labels (middle stages) unless step/forward_only are told otherwise.
    PipelineEngine(PipelineStage stage, const PipelinePlan& plan, dist::Communicator& pipe,
                   int microbatches, std::int64_t batch_size);

    // One training step's forward and backward (no optimizer step). images: used on stage 0
    // (elsewhere only its size(0) is read; may be undefined); labels: int64 [B], used on the last
    // stage (may be undefined elsewhere). Micro-batch losses are cross-entropy means weighted by
    // their share of the batch, so the gradients are those of the batch-mean loss. Backward runs
    // in reverse micro-batch order. Data parallelism: start the gradient allreduce only after
    // step() returned, on every rank (arm the GradientSynchronizer then and call its finish():
    // it launches every bucket in order), never from inside the step: on NCCL the two
    // communicators must be driven in one order on every rank (pipeline.cpp).
    // Returns the batch-mean loss (detached scalar) on the last stage, undefined elsewhere.
    // `batch_size` > 0 overrides the batch size where neither images nor labels are given.
    // `after_forward` (may be empty) runs between the forward and the backward passes (the
    // trainer's phase boundary).
    torch::Tensor step(const torch::Tensor& images, const torch::Tensor& labels,
                       std::int64_t batch_size = 0,
                       const std::function<void()>& after_forward = {});

    // Forward without autograd, micro-batch by micro-batch (call stage->eval() first for
    // evaluation). Returns the logits [B, classes] on the last stage, undefined elsewhere.
    torch::Tensor forward_only(const torch::Tensor& images, std::int64_t batch_size = 0);

    // Sizes of the micro-batches a batch of `batch` samples is split into (torch::chunk).
    std::vector<std::int64_t> microbatch_sizes(std::int64_t batch) const;

    const PipelineStage& stage() const { return stage_; }
    bool is_first() const { return stage_index_ == 0; }
    bool is_last() const { return stage_index_ == num_stages_ - 1; }

  private:
    std::int64_t resolve_batch(const torch::Tensor& images, const torch::Tensor& labels,
                               std::int64_t batch_size) const;
    // An uninitialised receive buffer for n samples of `per_sample` shape.
    torch::Tensor buffer(const std::vector<std::int64_t>& per_sample, std::int64_t n) const;

    PipelineStage stage_;
    dist::Communicator& pipe_;
    int stage_index_, num_stages_, microbatches_;
    std::int64_t batch_size_;
};

} // namespace trainscope::train
