// Image-classification training step (MobileNetV2 on IDX, image folders or synthetic images) under
// the dp, ddp, ddp-ds and pipeline strategies: h2d → forward → backward (bucketed allreduce
// overlapping it) → comm_wait, then the optimizer; the TrainingLoop drives it and times the data
// and control phases. Test-set loss and accuracy each epoch, reduced across ranks. Gradients and
// the optimizer go through one dist::DataParallelism (DDP, or ZeRO-1/2 with dist.zero=1|2),
// built once from the configuration, like the LLM trainer's.
#pragma once

#include <mpi.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "trainscope/data/datasets.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/gradient_synchronizer.hpp"
#include "trainscope/distributed/parallelism.hpp"
#include "trainscope/models/mobilenet_v2.hpp"
#include "trainscope/train/checkpoint.hpp"
#include "trainscope/train/options.hpp"
#include "trainscope/train/parallel_layout.hpp"
#include "trainscope/train/pipeline.hpp"
#include "trainscope/train/precision.hpp"
#include "trainscope/train/recorder.hpp"
#include "trainscope/train/run_control.hpp"
#include "trainscope/train/training_loop.hpp"
#include "trainscope/train/workload.hpp"

namespace trainscope::train {

struct TrainerOptions {
    // The parallel plan: run.strategy (ddp-ds: sharded sampler; ddp: every rank reads all),
    // dist.zero, pipeline stages, each rank's replica and state source.
    ParallelLayout layout;
    torch::Dtype dtype = torch::kFloat32; // parameters (and inputs): precision.param_dtype
    PrecisionPolicy precision;            // autocast and loss scaling (fp16-mixed)
    bool channels_last = false;           // NHWC parameters and inputs
    data::Preprocess preprocess = data::Preprocess::Host; // device: transform after the copy
    // Per-iteration accounting (memory counters, state bytes, per-bucket traffic); off only to
    // measure what it costs.
    bool accounting = true;
    torch::Device device{torch::kCPU};
    // run.strategy=dp with more than one device: the devices (device is the first) and a factory
    // of replicas of the model's architecture.
    std::vector<torch::Device> dp_devices;
    std::function<models::MobileNetV2()> make_replica;
    // run.strategy=pipeline: this rank's groups (pipe and data-parallel communicators), the split
    // and the micro-batch count. Data are sharded over replicas, gradients averaged over the
    // data-parallel communicator; the loss exists on the last stage only (NaN elsewhere).
    std::shared_ptr<PipelineGroups> pipeline;
    PipelinePlan pipeline_plan;
    int microbatches = 1;
    std::int64_t batch_size = 64, eval_batch_size = 256;
    OptimizerConfig optimizer;
    bool eval = true, drop_last = true, pin_memory = false;
    std::uint64_t seed = 42;
    int workers = 1, prefetch = 2;
    double bucket_bytes = 25.0 * 1024 * 1024;
    double first_bucket_bytes = 1.0 * 1024 * 1024;
    dist::CompressionOptions compression; // dist.compress: DDP's buckets, ZeRO's reduce dtype
};

class ClassificationTrainer final : public TrainStep {
  public:
    ClassificationTrainer(const TrainerOptions& options, models::MobileNetV2 model,
                          const data::DatasetSplits& data, data::AdaptedTransform transform,
                          dist::Communicator& comm, MPI_Comm world);
    ~ClassificationTrainer() override;
    const dist::GradientSynchronizer* synchronizer() const; // DDP's buckets; null under ZeRO
    // Collective: loads checkpoint m (weights and optimizer through the DataParallelism, batch-norm
    // buffers, loss scaler, RNG; under ZeRO at another rank count the shards are cut again: an
    // elastic resume of ddp-ds); the loop then starts at
    // its next_iteration, at the same place in the same epoch's sample order.
    void restore(const CheckpointManifest& m);

    // TrainStep
    std::int64_t iterations_per_epoch() const override;
    std::int64_t start_iteration() const override;
    void begin_epoch(std::int64_t epoch, std::int64_t skip) override;
    bool next_batch() override;
    void set_lr(double lr) override;
    StepResult step(std::int64_t iteration, prof::PhaseTimer& timer, RunControl* control) override;
    torch::Tensor nonfinite_flag(const StepResult& r) override;
    void prepare_apply(StepResult& r) override;
    bool apply(bool skip, double& optimizer_peak) override;
    void account(IterationValues& v) override;
    void resolve_accounting(std::int64_t iteration, IterationValues& v) override;
    void resolve(std::vector<DeferredStep>& steps) override;
    // Loss and accuracy on the test split, sharded across ranks and reduced.
    std::pair<double, double> evaluate() override;
    bool evaluates() const override;
    std::string save_checkpoint(Checkpointer& checkpointer, std::int64_t next_iteration) override;

  private:
    struct State;
    std::unique_ptr<State> s_;
};

} // namespace trainscope::train
