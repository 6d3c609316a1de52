// run.workload=cv: MobileNetV2 image classification under dp, ddp, ddp-ds or pipeline. Owns the
// CV checks, the dataset, the model and the ClassificationTrainer (the TrainingLoop's step), the
// CV plan text and its /plan attributes.
#include <torch/torch.h>

#include <iomanip>
#include <sstream>

#include "trainscope/core/error.hpp"
#include "trainscope/data/datasets.hpp"
#include "trainscope/data/options.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/device.hpp"
#include "trainscope/distributed/gradient_synchronizer.hpp"
#include "trainscope/distributed/mpi_runtime.hpp"
#include "trainscope/distributed/zero.hpp"
#include "trainscope/models/mobilenet_v2.hpp"
#include "trainscope/train/classification_trainer.hpp"
#include "trainscope/train/pipeline.hpp"
#include "workloads_internal.hpp"

namespace trainscope::train {
namespace {

// Per-rank memory of a CV run by category, in bytes, by arithmetic before anything is allocated
// (the --dry-run plan; tests/e2e/test_memory_plan.py holds it against the measured tensors).
struct CvMemoryPlan {
    double weight_bytes = 0;
    // Gradients are views into the gradient synchronizer's buckets (DDP's gradient_as_bucket_view),
    // so buckets add nothing beyond them.
    double gradient_bytes = 0;
    double optimizer_state_bytes = 0; // SGD momentum (1 per weight) or AdamW moments (2)
    double activation_bytes = 0;      // the input batch and what autograd keeps for backward
    // DDP (dist.zero=0) over more than one rank: the synchronizer's buffers beside the gradients
    // (dist::synchronizer_buffer_bytes: MPI's float32 copy of 16-bit gradients, dist.compress).
    double comm_buffer_bytes = 0;
    double total_bytes() const {
        return weight_bytes + gradient_bytes + optimizer_state_bytes + activation_bytes +
               comm_buffer_bytes;
    }
};

class CvWorkload final : public Workload {
  public:
    explicit CvWorkload(const RunEnvironment& env) : Workload(env) {
        const core::Config& c = env.cfg;
        if (env.layout.strategy == Strategy::Pipeline) {
            pipeline_ = PipelineOptions::from_config(c);
            const std::string precision = c.get_string("run.precision");
            if (precision == "fp16-mixed" || precision == "bf16-mixed")
                throw core::ConfigError(
                    "run.precision=" + precision +
                    " is not supported with run.strategy=pipeline (autocast and loss scaling "
                    "live in the single-model step): use fp32, tf32, bf16 or fp64");
        }
        if (c.get_bool("cv.sync_bn") && env.layout.strategy != Strategy::Ddp &&
            env.layout.strategy != Strategy::DdpDs)
            throw core::ConfigError("cv.sync_bn=true needs run.strategy=ddp or ddp-ds (it "
                                    "synchronises batch statistics across data-parallel ranks), "
                                    "not run.strategy=" +
                                    std::string(to_string(env.layout.strategy)) +
                                    ": set cv.sync_bn=false");
        check_zero(env);
        data_options_ = data::data_options(c);
        channels_ = data_options_.channels;
    }

    // dist.zero for CV: ZeRO-1/2 (dist::make_zero) over the ranks of ddp or ddp-ds, which step
    // AdamW on their shard without a loss scaler, on contiguous flat weights.
    static void check_zero(const RunEnvironment& env) {
        const core::Config& c = env.cfg;
        const int zero = dist::to_int(env.layout.zero);
        if (zero == 0) return;
        const std::string set =
            "dist.zero=" + std::to_string(zero) + " (set at " + c.origin("dist.zero") + ")";
        const Strategy strategy = env.layout.strategy;
        if (zero == 3)
            throw core::ConfigError(set + " is FSDP, which shards LLM fine-tuning units; "
                                          "run.workload=cv shards the optimizer state and "
                                          "gradients only: use dist.zero=1 or 2 (or 0)");
        if (strategy != Strategy::Ddp && strategy != Strategy::DdpDs)
            throw core::ConfigError(
                set +
                " shards the optimizer state over the ranks of run.strategy=ddp or ddp-ds, "
                "not run.strategy=" +
                std::string(to_string(strategy)) +
                (strategy == Strategy::Dp ? " (one process, nothing to shard over)"
                                          : " (each stage's state lives on its own ranks)") +
                ": set dist.zero=0, or run.strategy=ddp-ds");
        if (c.get_string("train.optimizer") != "adamw")
            throw core::ConfigError(
                set + " implements AdamW, not train.optimizer=" + c.get_string("train.optimizer") +
                ": set train.optimizer=adamw, or dist.zero=0");
        if (c.get_string("run.precision") == "fp16-mixed")
            throw core::ConfigError(set + " has no loss scaler for run.precision=fp16-mixed: use "
                                          "bf16-mixed or fp32, or dist.zero=0");
        if (c.get_bool("cv.channels_last"))
            throw core::ConfigError(set + " keeps the weights in one contiguous flat buffer, so "
                                          "cv.channels_last=true cannot lay them out NHWC: set "
                                          "cv.channels_last=false, or dist.zero=0");
    }

    WorkloadKind kind() const override { return WorkloadKind::Cv; }
    int pipeline_stages() const override {
        return env_.layout.strategy == Strategy::Pipeline ? pipeline_.stages : 1;
    }
    bool sharded_data() const override {
        return env_.layout.strategy == Strategy::DdpDs ||
               env_.layout.strategy == Strategy::Pipeline;
    }

    void check(const RunEnvironment& env) override {
        const core::Config& c = env.cfg;
        if (env.layout.strategy == Strategy::Dp && env.topo.world_size > 1)
            throw core::ConfigError(
                "run.strategy=dp is single-process data parallelism (one process drives all of "
                "its devices) but " +
                std::to_string(env.topo.world_size) +
                " ranks were launched: launch 1 rank (mpirun -np 1), or use run.strategy=ddp or "
                "ddp-ds for several ranks");
        if (env.layout.strategy != Strategy::Dp) return;
        const std::int64_t want = c.get_int("dp.devices");
        if (env.device.device.is_cuda()) {
            const int gpus = dist::cuda_device_count();
            const int n = want == 0 ? gpus : static_cast<int>(want);
            if (n > gpus)
                throw core::ConfigError("dp.devices=" + std::to_string(want) + " but only " +
                                        std::to_string(gpus) +
                                        " CUDA devices are visible: use dp.devices=0 (all) or at "
                                        "most " +
                                        std::to_string(gpus));
            for (int i = 0; i < n; ++i)
                dp_devices_.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(i));
        } else {
            for (std::int64_t i = 0; i < std::max<std::int64_t>(1, want); ++i)
                dp_devices_.emplace_back(torch::kCPU);
        }
    }

    void build() override;
    std::string plan_text() const override;
    std::string gradients_text() const; // the plan's gradients line
    std::vector<io::Attribute> plan_attributes() const override;

  protected:
    TrainStep* train_step() override { return trainer_.get(); }
    dist::Communicator* communicator() override { return comm_.get(); }
    std::vector<dist::Communicator*> side_communicators() override {
        if (!t_.pipeline) return {};
        return {t_.pipeline->pipe.get(), t_.pipeline->dp.get()};
    }
    std::vector<std::size_t> bucket_bytes() const override {
        const dist::GradientSynchronizer* sync = trainer_->synchronizer();
        return sync ? sync->bucket_bytes() : std::vector<std::size_t>{};
    }
    void describe_run(Recorder::RunInfo& info) const override {
        info.global_batch = static_cast<double>(env_.layout.global_batch());
        info.macs_per_sample = static_cast<double>(macs_per_sample_);
    }
    std::string start_message(const std::string& file) const override {
        return "training " + std::to_string(total_iterations_) + " iterations on " +
               std::to_string(env_.topo.world_size) + " rank(s), global batch " +
               std::to_string(env_.layout.global_batch()) + ", writing " + file;
    }
    int ranks_per_replica() const override { return env_.layout.stages; }

  private:
    PipelineOptions pipeline_;
    data::DataOptions data_options_; // data.* and the input geometry, read once
    std::int64_t channels_ = 1;
    std::vector<torch::Device> dp_devices_; // run.strategy=dp
    data::DatasetSplits data_;
    std::unique_ptr<dist::Communicator> comm_;
    std::unique_ptr<ClassificationTrainer> trainer_;
    TrainerOptions t_;
    // The plan.
    std::int64_t samples_per_shard_ = 0, iterations_per_epoch_ = 0, total_iterations_ = 0;
    std::int64_t parameters_ = 0, macs_per_sample_ = 0, num_classes_ = 0;
    CvMemoryPlan memory_;
    std::string pipeline_split_;
};

void CvWorkload::build() {
    const core::Config& c = env_.cfg;
    const ParallelLayout& layout = env_.layout;
    dist::agree_on_errors(env_.world, [&] { data_ = data::open_dataset(c); });
    num_classes_ = data_.num_classes();

    TrainerOptions& t = t_;
    t.layout = env_.layout;
    t.precision = env_.policy;
    t.dtype = env_.policy.param_dtype;
    t.channels_last = c.get_bool("cv.channels_last");
    const TrainConfig& train = env_.train;
    t.preprocess = data_options_.preprocess;
    t.accounting = train.accounting;
    t.dp_devices = dp_devices_;
    t.device = env_.device.device;
    t.batch_size = layout.batch_per_rank;
    t.eval_batch_size = train.eval_batch_size;
    t.eval = train.eval;
    t.optimizer = train.optimizer;
    t.drop_last = data_options_.drop_last;
    t.pin_memory = data_options_.pin_memory && t.device.is_cuda();
    t.seed = train.seed;
    t.workers = data_options_.workers;
    t.prefetch = data_options_.prefetch;
    t.bucket_bytes = static_cast<double>(env_.dist.bucket_cap_bytes);
    t.first_bucket_bytes = static_cast<double>(env_.dist.first_bucket_cap_bytes);
    t.compression = env_.dist.compression;

    const std::int64_t train_samples = data_.size(data::Split::Train);
    dist::agree_on_errors(env_.world, [&] {
        samples_per_shard_ = layout.samples_per_shard(train_samples, t.drop_last);
        // Fewer samples than shards: no batch size helps, and without drop_last the sampler's
        // padding would train several ranks on copies of the same samples.
        if (layout.sharded_data && train_samples < layout.replicas)
            throw core::ConfigError(
                "the training set has " + std::to_string(train_samples) + " sample" +
                (train_samples == 1 ? "" : "s") + " but " + std::to_string(layout.replicas) +
                " data-parallel " + layout.shard_unit() +
                " (run.strategy=" + to_string(env_.layout.strategy) +
                ") each need at least one of their own: launch at most " +
                std::to_string(train_samples) + " " + layout.shard_unit() +
                ", use more data, or run.strategy=ddp (every rank the whole set)");
        if (samples_per_shard_ < layout.batch_per_rank && t.drop_last)
            throw core::ConfigError("train.batch_size=" + std::to_string(layout.batch_per_rank) +
                                    " is larger than the " + std::to_string(samples_per_shard_) +
                                    " training samples each rank gets per epoch (" +
                                    std::to_string(train_samples) + " samples, strategy " +
                                    to_string(env_.layout.strategy) + ", " +
                                    std::to_string(layout.world_size) +
                                    " ranks): use a smaller batch or data.drop_last=false");
        comm_ = dist::make_communicator(env_.dist.backend, env_.world, env_.device.device,
                                        env_.dist.timeout_s, {env_.dist.allreduce});
    });
    if (env_.layout.strategy ==
        Strategy::Pipeline) // collective: splits the world into pipe and dp groups
        t.pipeline = std::shared_ptr<PipelineGroups>(new PipelineGroups(
            make_pipeline_groups(env_.world, layout.stages, env_.dist.backend, env_.device.device,
                                 env_.dist.timeout_s, {env_.dist.allreduce})));

    const std::int64_t image_size = data_options_.image_size;
    torch::manual_seed(static_cast<std::int64_t>(env_.train.seed));
    auto mopt = models::mobilenet_options_from_config(c, num_classes_, channels_);
    if (c.get_bool("cv.sync_bn")) {
        // Cross-rank batch statistics through the run's communicator (it outlives the trainer).
        dist::Communicator* comm = comm_.get();
        mopt.sync_bn_allreduce = [comm](torch::Tensor& x) {
            comm->allreduce(x, dist::ReduceOp::Sum);
        };
    }
    if (env_.layout.strategy == Strategy::Pipeline) {
        dist::agree_on_errors(env_.world, [&] {
            t.pipeline_plan = plan_pipeline(mopt, image_size, pipeline_.stages, pipeline_.balance,
                                            pipeline_.cuts);
            t.microbatches = pipeline_.microbatches;
        });
        pipeline_split_ = describe(t.pipeline_plan);
        // Planning must not shift the initialisation.
        torch::manual_seed(static_cast<std::int64_t>(env_.train.seed));
    }
    models::MobileNetV2 model(mopt);
    parameters_ = models::count_parameters(*model);
    const auto cost = models::mobilenet_v2_cost(mopt, image_size);
    macs_per_sample_ = cost.macs;
    const double elem = static_cast<double>(c10::elementSize(t.dtype));
    const double opt_states =
        t.optimizer.kind == "adamw" ? 2.0 : (t.optimizer.momentum > 0 ? 1.0 : 0.0);
    memory_.weight_bytes = static_cast<double>(parameters_) * elem;
    memory_.gradient_bytes = memory_.weight_bytes;
    memory_.optimizer_state_bytes = opt_states * memory_.weight_bytes;
    // ZeRO (dist::ZeroOptimizer): the moments of this rank's shard; ZeRO-1 keeps the full flat
    // gradients beside the reduced shard, ZeRO-2 only the shard between iterations.
    const double replicas = static_cast<double>(layout.replicas);
    if (layout.zero != dist::ZeroStage::None) memory_.optimizer_state_bytes /= replicas;
    if (layout.zero == dist::ZeroStage::OptimizerState)
        memory_.gradient_bytes *= 1.0 + 1.0 / replicas;
    if (layout.zero == dist::ZeroStage::Gradients) memory_.gradient_bytes /= replicas;
    if (layout.zero == dist::ZeroStage::None &&
        (layout.strategy == Strategy::Ddp || layout.strategy == Strategy::DdpDs)) {
        std::vector<std::vector<std::int64_t>> sizes;
        for (const torch::Tensor& p : model->parameters())
            if (p.requires_grad()) sizes.push_back(p.sizes().vec());
        memory_.comm_buffer_bytes = dist::synchronizer_buffer_bytes(
            sizes, t.dtype, env_.dist.backend, static_cast<int>(layout.replicas),
            env_.dist.compression);
    } else if (layout.zero != dist::ZeroStage::None) {
        memory_.comm_buffer_bytes = dist::zero_buffer_bytes(
            parameters_, static_cast<int>(layout.replicas), env_.dist.compression);
    }
    // Activations in the compute dtype (under autocast the convolutions' outputs are in it), the
    // input batch in the parameter dtype.
    const double act_elem = static_cast<double>(
        c10::elementSize(env_.policy.autocast_dtype.value_or(env_.policy.param_dtype)));
    memory_.activation_bytes = (static_cast<double>(cost.activation_elements) * act_elem +
                                static_cast<double>(channels_ * image_size * image_size) * elem) *
                               static_cast<double>(layout.batch_per_rank);

    t.make_replica = [mopt] { return models::MobileNetV2(mopt); };
    data::AdaptedTransform transform{static_cast<int>(channels_), static_cast<int>(image_size),
                                     data_.train.mean, data_.train.std};
    trainer_ =
        std::make_unique<ClassificationTrainer>(t, model, data_, transform, *comm_, env_.world);
    iterations_per_epoch_ = trainer_->iterations_per_epoch();
    total_iterations_ = env_.train.length.total_iterations(iterations_per_epoch_);
    if (env_.resumed) trainer_->restore(*env_.resumed);
}

std::string CvWorkload::plan_text() const {
    const ParallelLayout& l = env_.layout;
    const bool pipe = env_.layout.strategy == Strategy::Pipeline;
    const std::int64_t image_size = data_options_.image_size;
    std::ostringstream o;
    o << "trainscope plan (dry run: nothing is trained or written)\n"
      << "  workload      cv, strategy " << to_string(env_.layout.strategy) << ", precision "
      << env_.precision << "\n"
      << ranks_text();
    o << "  data          " << data_.description << "; network input " << channels_ << "x"
      << image_size << "x" << image_size << "; " << pinning_text(t_.pin_memory) << "\n"
      << "  batch         " << l.batch_per_rank << (pipe ? " per replica x " : " per rank x ")
      << l.replicas << " = " << l.global_batch() << " per iteration; " << samples_per_shard_
      << (pipe ? " samples per replica per epoch\n" : " samples per rank per epoch\n")
      << "  length        " << iterations_per_epoch_ << " iterations per epoch x "
      << env_.train.length.epochs << " epoch(s) -> " << total_iterations_ << " iterations\n"
      << "  model         MobileNetV2, " << num_classes_ << " classes, " << parameters_
      << " parameters, " << std::fixed << std::setprecision(1) << macs_per_sample_ / 1e6
      << " MMAC per sample (forward)\n"
      << "  gradients     " << gradients_text() << ", " << compression_text() << "\n"
      << "  memory/rank   ~" << mib(memory_.total_bytes()) << " (estimate): weights "
      << mib(memory_.weight_bytes) << ", gradients " << mib(memory_.gradient_bytes)
      << ", optimizer state " << mib(memory_.optimizer_state_bytes) << ", activations "
      << mib(memory_.activation_bytes)
      << (memory_.comm_buffer_bytes > 0
              ? ", gradient sync buffers " + mib(memory_.comm_buffer_bytes)
              : std::string())
      << "\n";
    if (pipe)
        o << "  pipeline      " << l.stages << " stages x " << l.replicas
          << " replica(s); rank = replica x stages + stage\n"
          << pipeline_split_;
    return o.str();
}

std::string CvWorkload::gradients_text() const {
    const std::string weights = mib(static_cast<double>(parameters_) *
                                    static_cast<double>(c10::elementSize(env_.policy.param_dtype)));
    std::ostringstream o;
    if (env_.layout.zero == dist::ZeroStage::None) {
        o << "buckets of " << env_.dist.bucket_mb << " MiB (the first "
          << std::min(env_.dist.first_bucket_mb, env_.dist.bucket_mb) << " MiB), allreduce of "
          << weights << " per iteration";
        return o.str();
    }
    o << "ZeRO-" << dist::to_int(env_.layout.zero) << " (dist.zero): reduce-scatter of " << weights
      << " and all-gather of the updated weights per iteration, AdamW state sharded over "
      << env_.layout.replicas << " rank(s)";
    return o.str();
}

std::vector<io::Attribute> CvWorkload::plan_attributes() const {
    const ParallelLayout& l = env_.layout;
    std::vector<io::Attribute> a = {
        {"strategy", std::string(to_string(env_.layout.strategy))},
        {"precision", env_.precision},
        {"device", env_.device.device.str()},
        {"backend", env_.dist.backend},
        // The communicator that reduces the gradients (a pipeline's: its data-parallel group).
        {"allreduce", (t_.pipeline ? *t_.pipeline->dp : *comm_).allreduce_algorithm()},
        {"dataset", data_.description},
        {"pin_memory", std::int64_t{t_.pin_memory}}, // what applied (data.pin_memory: requested)
        {"threads_per_rank", static_cast<std::int64_t>(env_.threads_per_rank)},
        {"batch_per_rank", l.batch_per_rank},
        {"global_batch", l.global_batch()},
        {"train_samples", data_.size(data::Split::Train)},
        {"test_samples", data_.size(data::Split::Test)},
        {"iterations_per_epoch", iterations_per_epoch_},
        {"total_iterations", total_iterations_},
        {"parameters", parameters_},
        {"macs_per_sample", macs_per_sample_},
        {"memory_estimate_bytes", memory_.total_bytes()},
        {"memory_plan_weight_bytes", memory_.weight_bytes},
        {"memory_plan_gradient_bytes", memory_.gradient_bytes},
        {"memory_plan_optimizer_state_bytes", memory_.optimizer_state_bytes},
        {"memory_plan_activation_bytes", memory_.activation_bytes},
        {"memory_plan_comm_buffer_bytes", memory_.comm_buffer_bytes},
        {"zero", std::int64_t{dist::to_int(l.zero)}}};
    // Over how many ranks each part of the state is divided (dist.zero), recorded like the
    // LLM's so readers scale both the same way.
    const dist::StateShards shards = dist::state_shards(l.zero, l.replicas);
    a.insert(a.end(), {{"memory_plan_weight_shards", shards.weight},
                       {"memory_plan_gradient_shards", shards.gradient},
                       {"memory_plan_optimizer_state_shards", shards.optimizer_state}});
    const std::vector<io::Attribute> compression = compression_attributes();
    a.insert(a.end(), compression.begin(), compression.end());
    if (env_.layout.strategy == Strategy::Pipeline) {
        std::string cuts;
        for (const auto& st : t_.pipeline_plan.stages)
            cuts += (cuts.empty() ? "" : ",") + std::to_string(st.first_unit);
        a.push_back({"pipeline_stages", std::int64_t{l.stages}});
        a.push_back({"pipeline_replicas", std::int64_t{l.replicas}});
        a.push_back({"pipeline_microbatches", std::int64_t{t_.microbatches}});
        a.push_back({"pipeline_stage_first_units", cuts});
    }
    return a;
}

} // namespace

std::unique_ptr<Workload> make_cv_workload(const RunEnvironment& env) {
    return std::make_unique<CvWorkload>(env);
}

} // namespace trainscope::train
