// How the CV model runs over this rank's devices and the ranks, behind one interface, so that the
// ClassificationTrainer never asks which run.strategy it runs under. make_cv_execution is the one
// place that knows the strategies:
//   ddp, ddp-ds  the whole model on this rank (ddp-ds shards the data; ddp lets every rank read
//                all of it in its own order);
//   dp           replicas of the model on several devices of one process (DataParallel);
//   pipeline     this rank's stage of a GPipe schedule, data sharded over the pipeline replicas.
// Gradients are averaged by the trainer's dist::DataParallelism over data_comm() in every case.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "trainscope/data/distributed_sampler.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/prof/memory.hpp"
#include "trainscope/prof/phase_timer.hpp"
#include "trainscope/train/classification_trainer.hpp"

namespace trainscope::train {

// What an execution needs from the trainer while it runs one step's forward and backward.
struct CvStepHooks {
    prof::PhaseTimer& timer;
    prof::PhasePeak& peak;
    StepResult& result;                                        // forward/backward peaks
    std::function<void()> before_forward;                      // rank 0's batch-norm buffers
    std::function<void()> arm_gradients;                       // before_last_backward
    std::function<void(torch::Tensor&)> fault;                 // TRAINSCOPE_FAULT (forward)
    std::function<torch::Tensor(const torch::Tensor&)> scaled; // the loss scaler's loss
};

class CvExecution {
  public:
    virtual ~CvExecution() = default;
    // The module this rank trains (the model, or its pipeline stage).
    virtual torch::nn::Module& trained() = 0;
    virtual void set_train(bool on) = 0;
    // Data parallelism: the communicator gradients and buffers are averaged over, and this
    // rank's data shard.
    virtual dist::Communicator& data_comm() = 0;
    virtual int data_rank() const = 0;
    virtual int data_size() const = 0;
    virtual data::DistributedSampler sampler(std::size_t n, std::uint64_t seed,
                                             bool drop_last) const;
    virtual std::uint64_t augmentation_seed(std::uint64_t seed) const { return seed; }
    // Forward and backward of one batch, timed as the Forward and Backward phases. Returns the
    // loss, undefined on ranks that compute none (pipeline stages before the last).
    virtual torch::Tensor forward_backward(const torch::Tensor& x, const torch::Tensor& y,
                                           CvStepHooks& hooks) = 0;
    // After the master parameters changed (an optimizer step, a restore).
    virtual void after_update() {}
    // Evaluation logits of a batch of n samples; undefined where this rank scores nothing.
    virtual torch::Tensor eval_logits(const torch::Tensor& x, std::int64_t n) = 0;
    // The losses every rank shows (host, float64), from this rank's `losses` on the device;
    // undefined: this rank's own.
    virtual torch::Tensor shared_losses(const torch::Tensor& losses) {
        (void)losses;
        return {};
    }
};

// `model` is on its device in its final dtype and layout.
std::unique_ptr<CvExecution> make_cv_execution(const TrainerOptions& options,
                                               models::MobileNetV2 model, dist::Communicator& comm,
                                               int rank, int size);

} // namespace trainscope::train
