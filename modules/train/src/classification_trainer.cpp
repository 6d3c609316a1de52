// The classification training step (see classification_trainer.hpp). Phase boundaries follow
// DESIGN.md's data flow; the TrainingLoop keeps the loss on the device until it resolves it.
#include "trainscope/train/classification_trainer.hpp"

#include "cv_execution.hpp"

#include <chrono>
#include <cmath>
#include <functional>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>

#include "trainscope/core/build_config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/data/distributed_sampler.hpp"
#include "trainscope/data/loader.hpp"
#include "trainscope/distributed/gradient_synchronizer.hpp"
#include "trainscope/distributed/mpi_runtime.hpp"
#include "trainscope/prof/memory.hpp"
#include "trainscope/prof/profiler_window.hpp"
#include "trainscope/train/comm_accounting.hpp"
#include "trainscope/train/host_sync.hpp"
#include "trainscope/train/optimizer.hpp"

#if TRAINSCOPE_HAVE_CUDA
#include "trainscope/core/numeric.hpp"
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace trainscope::train {
namespace {

// The checkpoint's shards of this rank's data-parallel group, numbered by replica: under a
// pipeline, replica r's archive is the file of rank r x stages + stage (ranks are stage-major);
// otherwise replicas are ranks. Pipelines never resume on another rank count, so reshard (ZeRO's
// elastic resume, ddp-ds only) is the checkpoint's own.
class ReplicaShards final : public dist::ShardSource {
  public:
    ReplicaShards(dist::ShardSource& all, const ParallelLayout& layout, int rank)
        : all_(all), stages_(layout.stages), stage_(layout.stage(rank)) {}
    int saved_world() const override { return all_.saved_world() / stages_; }
    const std::string& where() const override { return all_.where(); }
    torch::serialize::InputArchive& rank(int r) override { return all_.rank(r * stages_ + stage_); }
    torch::Tensor reshard(const std::string& sub, const std::string& name, std::int64_t numel,
                          int new_rank, int new_world) override {
        return all_.reshard(sub, name, numel, new_rank, new_world);
    }

  private:
    dist::ShardSource& all_;
    int stages_, stage_;
};

using core::kNaN;

} // namespace

struct ClassificationTrainer::State {
    TrainerOptions o;
    models::MobileNetV2 model;
    const data::DatasetSplits& data;
    data::AdaptedTransform transform;
    dist::Communicator& comm;
    MPI_Comm world;
    int rank = 0, size = 1;
    std::unique_ptr<GradScaler> scaler;
    // How the model runs (run.strategy); gradients and batch-norm buffers are averaged over its
    // data_comm().
    std::unique_ptr<CvExecution> exec;
    // The trained parameters' data parallelism over data_comm() (DDP or ZeRO-1/2, chosen once
    // from dist.zero): it owns the optimizer; the step never asks which kind it is.
    std::unique_ptr<dist::DataParallelism> parallel;
    std::vector<std::string> buffer_names; // the trained module's buffers, for checkpoints
    std::vector<torch::Tensor> buffers;
    std::vector<torch::Tensor> float_buffers; // batch-norm running statistics
    std::shared_ptr<const data::BatchSource> train_source, test_source;
    std::int64_t per_epoch = 0;
    std::int64_t start_iteration = 0; // > 0 after restore()
    // The epoch's loader and the batch the data phase fetched.
    std::unique_ptr<data::Loader> loader;
    std::optional<data::Batch> batch;
    prof::PhasePeak peak{-1, false};
    torch::Tensor loss; // this iteration's (undefined on pipeline stages without a loss)
    // Per recorded iteration, the collectives whose durations account() left open: resolved
    // and dropped by resolve_accounting.
    DeferredComm deferred_comm;

    // Replicated state (weights, optimizer, buffers, scaler) lives in one rank's checkpoint file.
    int state_source_rank() const { return o.layout.state_source_rank(rank); }
    int cuda_index() const { return o.device.is_cuda() ? o.device.index() : -1; }

    State(const TrainerOptions& opt, models::MobileNetV2 m, const data::DatasetSplits& d,
          data::AdaptedTransform t, dist::Communicator& c, MPI_Comm w)
        : o(opt), model(std::move(m)), data(d), transform(t), comm(c), world(w) {}

    void set_train(bool on) { exec->set_train(on); }

    // A host batch as the network's input: on the device, in the parameters' dtype, NHWC when
    // channels_last.
    // With pinned batches on CUDA the copies (and device preprocessing) run on a separate copy
    // stream; the compute stream waits for them through an event, never the host.
    std::pair<torch::Tensor, torch::Tensor> input(const data::Batch& batch) {
        torch::Tensor x, y;
#if TRAINSCOPE_HAVE_CUDA
        if (o.device.is_cuda() && o.pin_memory) {
            const auto index = o.device.index();
            if (!copy_stream) copy_stream = c10::cuda::getStreamFromPool(false, index);
            const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(index);
            at::cuda::CUDAEvent ready;
            {
                c10::cuda::CUDAStreamGuard guard(*copy_stream);
                x = to_network(batch);
                y = batch.labels.to(o.device, /*non_blocking=*/true);
                ready.record(*copy_stream);
            }
            ready.block(compute);
            // Allocated on the copy stream, used on the compute stream: tell the allocator.
            x.record_stream(compute);
            y.record_stream(compute);
            return {x, y};
        }
#endif
        x = to_network(batch);
        y = batch.labels.to(o.device, /*non_blocking=*/o.pin_memory);
        return {x, y};
    }
    torch::Tensor to_network(const data::Batch& batch) const {
        torch::Tensor x = data::network_input(batch, transform, o.device, o.dtype,
                                              /*non_blocking=*/o.pin_memory);
        if (o.channels_last) x = x.contiguous(torch::MemoryFormat::ChannelsLast);
        return x;
    }
#if TRAINSCOPE_HAVE_CUDA
    std::optional<c10::cuda::CUDAStream> copy_stream;
#endif

    data::DistributedSampler make_sampler() const {
        return exec->sampler(static_cast<std::size_t>(data.size(data::Split::Train)), o.seed,
                             o.drop_last);
    }

    // Like DDP's broadcast_buffers: every rank starts each forward with rank 0's batch-norm
    // statistics, so evaluation on any rank sees the same model. One flat broadcast.
    void sync_buffers() {
        if (exec->data_size() == 1 || float_buffers.empty()) return;
        torch::NoGradGuard g;
        std::vector<torch::Tensor> flat;
        for (auto& b : float_buffers)
            flat.push_back(b.reshape(-1));
        torch::Tensor all = torch::cat(flat);
        exec->data_comm().broadcast(all, 0);
        std::int64_t off = 0;
        for (auto& b : float_buffers) {
            b.copy_(all.narrow(0, off, b.numel()).view_as(b));
            off += b.numel();
        }
    }
};

ClassificationTrainer::ClassificationTrainer(const TrainerOptions& options,
                                             models::MobileNetV2 model,
                                             const data::DatasetSplits& data,
                                             data::AdaptedTransform transform,
                                             dist::Communicator& comm, MPI_Comm world)
    : s_(std::make_unique<State>(options, std::move(model), data, transform, comm, world)) {
    State& s = *s_;
    MPI_Comm_rank(world, &s.rank);
    MPI_Comm_size(world, &s.size);
    s.model->to(s.o.device, s.o.dtype);
    if (s.o.channels_last) {
        // NHWC: 4-D weights (convolutions) in channels-last strides; the inputs follow in run().
        torch::NoGradGuard no_grad;
        for (auto& p : s.model->parameters())
            if (p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
    }
    s.peak = prof::PhasePeak(s.cuda_index(), s.o.accounting);
    s.exec = make_cv_execution(s.o, s.model, comm, s.rank, s.size);
    torch::nn::Module& trained = s.exec->trained();
    for (auto& b : trained.named_buffers()) {
        s.buffer_names.push_back(b.key());
        s.buffers.push_back(b.value());
        if (b.value().is_floating_point()) s.float_buffers.push_back(b.value());
    }
    // Augmentation seeds (image folders): one stream per data shard, or per rank where ranks
    // read the same samples in their own order.
    const std::uint64_t aug_seed = s.exec->augmentation_seed(s.o.seed);
    s.train_source =
        data::make_batch_source(s.data, data::Split::Train, s.transform, s.o.preprocess, aug_seed);
    s.test_source =
        data::make_batch_source(s.data, data::Split::Test, s.transform, s.o.preprocess, s.o.seed);

    GradScaler::Options scaler_options;
    scaler_options.enabled = s.o.precision.loss_scaling;
    s.scaler = std::make_unique<GradScaler>(scaler_options, s.o.device);

    // Rank 0's parameters everywhere (the kinds broadcast them over the data-parallel group).
    dist::TrainableSet trainable;
    for (auto& p : trained.named_parameters()) {
        trainable.names.push_back(p.key());
        trainable.tensors.push_back(p.value());
    }
    s.parallel = make_data_parallelism(
        s.o.layout.zero, s.o.optimizer, /*with_momentum=*/true, s.o.precision.loss_scaling,
        s.exec->data_comm(), std::move(trainable), static_cast<std::size_t>(s.o.bucket_bytes),
        static_cast<std::size_t>(s.o.first_bucket_bytes), s.o.compression);
    s.sync_buffers();

    s.per_epoch = static_cast<std::int64_t>(s.make_sampler().num_samples()) / s.o.batch_size;
    if (!s.o.drop_last && s.make_sampler().num_samples() % s.o.batch_size) ++s.per_epoch;
}

ClassificationTrainer::~ClassificationTrainer() = default;

std::string ClassificationTrainer::save_checkpoint(Checkpointer& checkpointer,
                                                   std::int64_t next_iteration) {
    State& s = *s_;
    return checkpointer.save(next_iteration, [&](torch::serialize::OutputArchive& out) {
        if (s.rank == s.state_source_rank()) {
            torch::serialize::OutputArchive buffers, scaler;
            dist::save_tensors(buffers, s.buffer_names, s.buffers, /*buffers=*/true);
            s.scaler->save(scaler);
            out.write("buffers", buffers);
            out.write("scaler", scaler);
        }
        // Weights and optimizer from each stage's replica 0, ZeRO's shards and PowerSGD's error
        // feedback from every rank.
        s.parallel->save(out, s.o.layout.data_rank(s.rank));
        save_rng_state(out, s.cuda_index());
    });
}

void ClassificationTrainer::restore(const CheckpointManifest& m) {
    State& s = *s_;
    dist::agree_on_errors(s.world, [&] {
        // An elastic resume (another rank count; ddp-ds only, checked before) reads the replicated
        // state from the rank that wrote it and cuts ZeRO's shards again; a rank the checkpoint
        // did not have keeps its own RNG and starts with zero PowerSGD error feedback. The
        // source's file is read once per node (CheckpointShards), this rank's own by itself.
        CheckpointShards shards(m, s.o.device, s.world, {s.rank, s.state_source_rank()});
        torch::serialize::InputArchive& from = shards.rank(s.state_source_rank());
        torch::serialize::InputArchive buffers, scaler;
        if (!from.try_read("buffers", buffers))
            throw core::InputError("checkpoint " + m.path +
                                   " holds no batch-norm buffers: it was written by a trainscope "
                                   "before CV training went through dist::DataParallelism (its "
                                   "state is one 'model' archive); start the run afresh");
        from.read("scaler", scaler);
        dist::load_tensors(buffers, s.buffer_names, s.buffers, m.path, /*buffers=*/true);
        s.scaler->load(scaler);
        ReplicaShards replicas(shards, s.o.layout, s.rank);
        s.parallel->load(replicas, s.o.layout.data_rank(s.rank),
                         /*elastic=*/m.world_size != s.size);
        if (s.rank < m.world_size) load_rng_state(shards.rank(s.rank), s.cuda_index());
        s.start_iteration = read_int(from, "next_iteration");
    });
    s.exec->after_update();
}

std::int64_t ClassificationTrainer::iterations_per_epoch() const {
    return s_->per_epoch;
}

std::int64_t ClassificationTrainer::start_iteration() const {
    return s_->start_iteration;
}

const dist::GradientSynchronizer* ClassificationTrainer::synchronizer() const {
    return s_->parallel->synchronizer();
}

bool ClassificationTrainer::evaluates() const {
    return s_->o.eval;
}

void ClassificationTrainer::begin_epoch(std::int64_t epoch, std::int64_t skip) {
    State& s = *s_;
    s.loader.reset(); // stops the last epoch's workers first
    data::DistributedSampler sampler = s.make_sampler();
    sampler.set_epoch(epoch);
    std::vector<std::int64_t> order = sampler.indices();
    // A resumed run starts inside its epoch, after the batches the checkpoint had trained.
    const auto done = static_cast<std::size_t>(
        std::min<std::int64_t>(skip * s.o.batch_size, static_cast<std::int64_t>(order.size())));
    order.erase(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(done));
    s.loader =
        std::make_unique<data::Loader>(s.train_source, std::move(order), epoch, s.o.batch_size,
                                       s.o.workers, s.o.prefetch, s.o.pin_memory, s.o.drop_last);
    s.set_train(true);
}

bool ClassificationTrainer::next_batch() {
    State& s = *s_;
    s.batch = s.loader->next();
    return s.batch.has_value();
}

void ClassificationTrainer::set_lr(double lr) {
    s_->parallel->set_lr(lr);
}

StepResult ClassificationTrainer::step(std::int64_t iteration, prof::PhaseTimer& timer,
                                       RunControl* control) {
    State& s = *s_;
    StepResult r;
    s.parallel->begin_iteration(); // ZeRO: the gradient buffer zeroed (stage 2: allocated)
    torch::Tensor x, y;
    {
        prof::PhaseScope p(timer, prof::Phase::H2D);
        std::tie(x, y) = s.input(*s.batch); // [B,C,S,S], [B]; device preprocessing here
    }
    // Allocator peak of each phase: the CUDA caching allocator's, or on CPU the host tensor
    // counter's. Both counters are host-side, so reading them does not synchronise.
    CvStepHooks hooks{timer,
                      s.peak,
                      r,
                      [&] { s.sync_buffers(); },
                      [&] { s.parallel->before_last_backward(); },
                      [&](torch::Tensor& loss) {
                          if (control) inject_fault(*control, iteration, loss);
                      },
                      [&](const torch::Tensor& loss) { return s.scaler->scale(loss); }};
    const torch::Tensor loss = s.exec->forward_backward(x, y, hooks);
    // r.loss_scale (fp16-mixed): the scale this backward used, read with the scaler's verdict in
    // prepare_apply.
    {
        prof::PhaseScope p(timer, prof::Phase::CommWait);
        s.parallel->finish_gradients(/*grad_scale=*/1.0); // averaged over the replicas
    }
    s.loss = loss;
    // Pipeline: the loss exists on the last stage only.
    r.loss = loss.defined()
                 ? loss.detach().to(torch::kFloat64)
                 : torch::full({}, kNaN,
                               torch::TensorOptions().dtype(torch::kFloat64).device(s.o.device));
    r.samples = static_cast<double>(s.batch->size);
    return r;
}

torch::Tensor ClassificationTrainer::nonfinite_flag(const StepResult&) {
    State& s = *s_;
    // The loss scaler handles its own inf/NaN steps.
    if (s.scaler->enabled()) return {};
    return train::nonfinite_flag(s.loss, s.parallel->full_gradient_parameters(),
                                 s.parallel->gradient_shard_sums());
}

void ClassificationTrainer::prepare_apply(StepResult& r) {
    State& s = *s_;
    if (!s.scaler->enabled()) return;
    // fp16-mixed: the scaler's verdict, read once after a synchronize bounded by dist.timeout.
    s.scaler->unscale_on_device(s.parallel->full_gradient_parameters());
    s.comm.synchronize("the loss scaler's inf/NaN check");
    r.loss_scale = s.scaler->check_step().scale;
}

bool ClassificationTrainer::apply(bool skip, double& optimizer_peak) {
    State& s = *s_;
    s.peak.begin();
    bool stepped = false;
    if (skip) // run.nonfinite=skip: no rank steps
        s.parallel->skip_step();
    else
        // fp16-mixed (DDP only: ZeRO refuses it): gradients are averaged across ranks first, so an
        // inf/NaN on any rank reaches all of them and every rank skips the same steps.
        stepped = s.parallel->step(scaled_step(*s.scaler));
    s.exec->after_update();
    s.peak.end(optimizer_peak);
    s.loss = torch::Tensor();
    return stepped;
}

void ClassificationTrainer::account(IterationValues& v) {
    State& s = *s_;
    // Bytes now; the durations stay NaN until resolve_accounting (reading them here would wait
    // for the collectives' end events on NCCL).
    put_comm(s.deferred_comm.take(*s.parallel, v.iteration), v);
    v.memory = prof::sample_memory(s.cuda_index());
    // Parameters, their gradients (ZeRO-2: the shard) and the optimizer's state (ZeRO: the shard).
    const dist::HeldBytes held = s.parallel->held_bytes();
    v.parameter_bytes = held.trainable;
    v.gradient_bytes = held.gradients;
    v.optimizer_state_bytes = held.optimizer_state;
}

void ClassificationTrainer::resolve_accounting(std::int64_t iteration, IterationValues& v) {
    State& s = *s_;
    if (const auto c = s.deferred_comm.resolve(iteration)) put_comm(*c, v);
}

void ClassificationTrainer::resolve(std::vector<DeferredStep>& steps) {
    State& s = *s_;
    if (steps.empty()) return;
    std::vector<torch::Tensor> losses;
    for (const auto& d : steps)
        losses.push_back(d.loss.reshape({1}));
    const torch::Tensor mine =
        read_to_host(torch::cat(losses)); // [n]: one host read for all of them
    torch::Tensor shared = s.exec->shared_losses(torch::cat(losses));
    if (!shared.defined()) shared = mine;
    for (std::size_t i = 0; i < steps.size(); ++i) {
        const auto k = static_cast<std::int64_t>(i);
        steps[i].loss_value = mine[k].item<double>();
        steps[i].shared_loss = shared[k].item<double>();
    }
}

std::pair<double, double> ClassificationTrainer::evaluate() {
    State& s = *s_;
    torch::NoGradGuard no_grad;
    s.set_train(false);
    const std::int64_t n = s.data.size(data::Split::Test);
    // Exact shard without padding: rank r takes every size-th sample from r, so each test image
    // counts once however many ranks there are.
    std::vector<std::int64_t> mine;
    for (std::int64_t i = s.exec->data_rank(); i < n; i += s.exec->data_size())
        mine.push_back(i);
    data::Loader loader(s.test_source, mine, /*epoch=*/0, s.o.eval_batch_size, s.o.workers,
                        s.o.prefetch, s.o.pin_memory, /*drop_last=*/false);
    double sums[3] = {0, 0, 0}; // loss sum, correct, count
    while (auto batch = loader.next()) {
        auto [x, y] = s.input(*batch);
        AutocastScope autocast(s.o.precision, s.o.device);
        torch::Tensor logits = s.exec->eval_logits(x, batch->size);
        if (!logits.defined()) continue; // a pipeline stage before the last
        if (logits.scalar_type() == torch::kHalf || logits.scalar_type() == torch::kBFloat16)
            logits = logits.to(torch::kFloat32);
        sums[0] +=
            torch::nn::functional::cross_entropy(
                logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                .item<double>();
        sums[1] += logits.argmax(1).eq(y).sum().item<double>();
        sums[2] += static_cast<double>(batch->size);
    }
    std::vector<double> all(sums, sums + 3);
    s.comm.allreduce_host(all, dist::ReduceOp::Sum);
    s.set_train(true);
    if (all[2] == 0) return {std::nan(""), std::nan("")};
    sums[0] = all[0];
    sums[1] = all[1];
    sums[2] = all[2];
    return {sums[0] / sums[2], sums[1] / sums[2]};
}

} // namespace trainscope::train
