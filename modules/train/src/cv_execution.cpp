#include "cv_execution.hpp"

#include "trainscope/core/error.hpp"
#include "trainscope/train/data_parallel.hpp"
#include "trainscope/train/host_sync.hpp"
#include "trainscope/train/pipeline.hpp"

namespace trainscope::train {

data::DistributedSampler CvExecution::sampler(std::size_t n, std::uint64_t seed,
                                              bool drop_last) const {
    return data::DistributedSampler(n, data_rank(), data_size(), /*shuffle=*/true, seed, drop_last);
}

namespace {

// ddp and ddp-ds: the whole model on this rank.
class LocalExecution : public CvExecution {
  public:
    // shard: disjoint 1/N shards of the data (ddp-ds). Otherwise every rank walks the whole
    // training set in its own order (seed + rank), as the studies' DDP baseline without a
    // DistributedSampler; rank_augmentation: such ranks also augment differently (ddp).
    LocalExecution(models::MobileNetV2 model, dist::Communicator& comm, int rank, int size,
                   bool shard, bool rank_augmentation, const PrecisionPolicy& precision,
                   torch::Device device)
        : model_(std::move(model)), comm_(comm), rank_(rank), size_(size), shard_(shard),
          rank_augmentation_(rank_augmentation), precision_(precision), device_(device) {}

    torch::nn::Module& trained() override { return *model_; }
    void set_train(bool on) override { model_->train(on); }
    dist::Communicator& data_comm() override { return comm_; }
    int data_rank() const override { return rank_; }
    int data_size() const override { return size_; }
    data::DistributedSampler sampler(std::size_t n, std::uint64_t seed,
                                     bool drop_last) const override {
        if (shard_) return CvExecution::sampler(n, seed, drop_last);
        return data::DistributedSampler(n, 0, 1, /*shuffle=*/true,
                                        seed + static_cast<std::uint64_t>(rank_), drop_last);
    }
    std::uint64_t augmentation_seed(std::uint64_t seed) const override {
        return seed + (rank_augmentation_ ? static_cast<std::uint64_t>(rank_) : 0);
    }

    torch::Tensor forward_backward(const torch::Tensor& x, const torch::Tensor& y,
                                   CvStepHooks& h) override {
        torch::Tensor loss;
        {
            prof::PhaseScope p(h.timer, prof::Phase::Forward);
            h.peak.begin();
            h.before_forward();
            AutocastScope autocast(precision_, device_);
            loss = torch::nn::functional::cross_entropy(forward(x), y); // logits [B, K]
            h.fault(loss);
            h.peak.end(h.result.forward_peak);
        }
        {
            prof::PhaseScope p(h.timer, prof::Phase::Backward);
            h.peak.begin();
            h.arm_gradients();
            h.scaled(loss).backward();
            after_backward();
            h.peak.end(h.result.backward_peak);
        }
        return loss;
    }
    torch::Tensor eval_logits(const torch::Tensor& x, std::int64_t) override {
        return model_->forward(x);
    }

  protected:
    virtual torch::Tensor forward(const torch::Tensor& x) { return model_->forward(x); }
    virtual void after_backward() {}

    models::MobileNetV2 model_;

  private:
    dist::Communicator& comm_;
    int rank_, size_;
    bool shard_, rank_augmentation_;
    PrecisionPolicy precision_;
    torch::Device device_;
};

// dp over several devices: nn.DataParallel's replicas; the master (replica 0) is optimised.
class ReplicatedExecution final : public LocalExecution {
  public:
    ReplicatedExecution(const TrainerOptions& o, models::MobileNetV2 model,
                        dist::Communicator& comm, int rank, int size)
        : LocalExecution(std::move(model), comm, rank, size, /*shard=*/false,
                         /*rank_augmentation=*/false, o.precision, o.device),
          dp_(model_, o.make_replica, o.dp_devices, o.dtype, o.channels_last) {}

    void set_train(bool on) override {
        LocalExecution::set_train(on);
        dp_.train(on);
    }
    void after_update() override { dp_.refresh(); }

  private:
    torch::Tensor forward(const torch::Tensor& x) override { return dp_.forward(x); }
    void after_backward() override { dp_.reduce_gradients(); }

    DataParallel dp_;
};

// pipeline: this rank's stage; GPipe runs all micro-batch forwards, then all backwards.
class PipelineExecution final : public CvExecution {
  public:
    PipelineExecution(const TrainerOptions& o, models::MobileNetV2 model)
        : model_(std::move(model)), groups_(*o.pipeline),
          stage_(model_, o.pipeline_plan, groups_.stage), // shares the model's layers
          engine_(stage_, o.pipeline_plan, *groups_.pipe, o.microbatches, o.batch_size) {}

    torch::nn::Module& trained() override { return *stage_; }
    void set_train(bool on) override {
        model_->train(on);
        stage_->train(on);
    }
    dist::Communicator& data_comm() override { return *groups_.dp; }
    int data_rank() const override { return groups_.replica; }
    int data_size() const override { return groups_.replicas; }

    torch::Tensor forward_backward(const torch::Tensor& x, const torch::Tensor& y,
                                   CvStepHooks& h) override {
        // The data-parallel allreduce starts only once every point-to-point operation of the
        // step was issued (one order of the two communicators on every rank, see pipeline.cpp):
        // DDP's buckets are armed after the step and finish_gradients launches them all.
        h.before_forward();
        h.timer.start(prof::Phase::Forward);
        bool in_backward = false;
        torch::Tensor loss = engine_.step(x, y, 0, [&] {
            h.timer.stop(prof::Phase::Forward);
            h.timer.start(prof::Phase::Backward);
            in_backward = true;
        });
        h.timer.stop(in_backward ? prof::Phase::Backward : prof::Phase::Forward);
        h.arm_gradients();
        return loss;
    }
    torch::Tensor eval_logits(const torch::Tensor& x, std::int64_t n) override {
        // Every stage of a replica walks the same batches; the last one scores them.
        return engine_.forward_only(x, n);
    }
    torch::Tensor shared_losses(const torch::Tensor& losses) override {
        // The loss exists on the last stage only: every stage shows and averages that one.
        torch::Tensor shared = losses.clone();
        groups_.pipe->broadcast(shared, groups_.stages - 1);
        // NCCL: the broadcast started after the loop's bounded synchronize; without its own, a
        // stage that stalled now would block the read in the CUDA driver until the watchdog.
        groups_.pipe->synchronize("the pipeline's shared-loss broadcast");
        return read_to_host(shared);
    }

  private:
    models::MobileNetV2 model_;
    const PipelineGroups& groups_;
    PipelineStage stage_;
    PipelineEngine engine_;
};

} // namespace

std::unique_ptr<CvExecution> make_cv_execution(const TrainerOptions& o, models::MobileNetV2 model,
                                               dist::Communicator& comm, int rank, int size) {
    switch (o.layout.strategy) {
    case Strategy::Pipeline:
        if (!o.pipeline)
            throw core::InternalError("ClassificationTrainer: pipeline without its groups");
        return std::make_unique<PipelineExecution>(o, std::move(model));
    case Strategy::Dp:
        if (o.dp_devices.size() > 1) {
            if (!o.make_replica)
                throw core::InternalError("ClassificationTrainer: dp over several devices needs "
                                          "TrainerOptions::make_replica");
            return std::make_unique<ReplicatedExecution>(o, std::move(model), comm, rank, size);
        }
        break;
    default:
        break;
    }
    return std::make_unique<LocalExecution>(
        std::move(model), comm, rank, size,
        /*shard=*/o.layout.sharded_data,
        /*rank_augmentation=*/o.layout.strategy == Strategy::Ddp, o.precision, o.device);
}

} // namespace trainscope::train
