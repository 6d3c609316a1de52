// The classification training loop. Phase boundaries follow DESIGN.md's data flow; the loss stays
// on the device until a flush or a progress line needs it, so GPU runs are not synchronised per
// iteration just to log.
#include "trainscope/train/classification_trainer.hpp"

#include <chrono>
#include <cmath>
#include <functional>
#include <iomanip>
#include <sstream>

#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/data/distributed_sampler.hpp"
#include "trainscope/data/loader.hpp"
#include "trainscope/dist/gradient_synchronizer.hpp"
#include "trainscope/prof/memory.hpp"
#include "trainscope/prof/profiler_window.hpp"

namespace trainscope::train {
namespace {

// Bytes of the tensors that make up the training state: parameters, their gradients, and the
// optimizer's per-parameter state (momentum buffers, Adam moments, step counters).
struct StateBytes {
    double parameters = 0, gradients = 0, optimizer = 0;
};
StateBytes state_bytes(const std::vector<torch::Tensor>& params, torch::optim::Optimizer& opt) {
    StateBytes b;
    for (const auto& p : params) {
        b.parameters += static_cast<double>(p.nbytes());
        if (p.grad().defined()) b.gradients += static_cast<double>(p.grad().nbytes());
    }
    for (const auto& [key, state] : opt.state()) {
        if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(state.get())) {
            if (sgd->momentum_buffer().defined())
                b.optimizer += static_cast<double>(sgd->momentum_buffer().nbytes());
        } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(state.get())) {
            for (const auto& t : {adamw->exp_avg(), adamw->exp_avg_sq(), adamw->max_exp_avg_sq()})
                if (t.defined()) b.optimizer += static_cast<double>(t.nbytes());
        }
    }
    return b;
}

std::string format_duration(double seconds) {
    if (!std::isfinite(seconds) || seconds < 0) return "?";
    auto s = static_cast<long long>(seconds + 0.5);
    std::ostringstream o;
    if (s >= 3600) o << s / 3600 << "h";
    if (s >= 60) o << (s % 3600) / 60 << "m";
    o << s % 60 << "s";
    return o.str();
}

} // namespace

struct ClassificationTrainer::State {
    TrainerOptions o;
    models::MobileNetV2 model;
    const data::DatasetSplits& data;
    data::AdaptedTransform transform;
    dist::Communicator& comm;
    MPI_Comm world;
    int rank = 0, size = 1;
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    std::unique_ptr<dist::GradientSynchronizer> sync;
    std::vector<torch::Tensor> params;
    std::vector<torch::Tensor> float_buffers; // batch-norm running statistics
    std::function<void(const dist::IterationComm&)> on_comm;
    std::int64_t per_epoch = 0;

    State(const TrainerOptions& opt, models::MobileNetV2 m, const data::DatasetSplits& d,
          data::AdaptedTransform t, dist::Communicator& c, MPI_Comm w)
        : o(opt), model(std::move(m)), data(d), transform(t), comm(c), world(w) {}

    std::size_t sampler_world() const { return o.strategy == "ddp-ds" ? size : 1; }

    data::DistributedSampler make_sampler() const {
        const auto n = static_cast<std::size_t>(data.train.labels.size(0));
        // ddp: every rank walks the whole training set, each in its own order (seed + rank), as
        // the studies' DDP baseline without a DistributedSampler; ddp-ds: disjoint 1/N shards.
        if (o.strategy == "ddp-ds")
            return data::DistributedSampler(n, rank, size, /*shuffle=*/true, o.seed, o.drop_last);
        return data::DistributedSampler(n, 0, 1, /*shuffle=*/true, o.seed + rank, o.drop_last);
    }

    // Like DDP's broadcast_buffers: every rank starts each forward with rank 0's batch-norm
    // statistics, so evaluation on any rank sees the same model. One flat broadcast.
    void sync_buffers() {
        if (size == 1 || float_buffers.empty()) return;
        torch::NoGradGuard g;
        std::vector<torch::Tensor> flat;
        for (auto& b : float_buffers)
            flat.push_back(b.reshape(-1));
        torch::Tensor all = torch::cat(flat);
        comm.broadcast(all, 0);
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
    for (auto& b : s.model->buffers())
        if (b.is_floating_point()) s.float_buffers.push_back(b);

    s.params = s.model->parameters();
    const std::vector<torch::Tensor>& params = s.params;
    if (s.o.optimizer == "sgd")
        s.optimizer =
            std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(s.o.lr)
                                                            .momentum(s.o.momentum)
                                                            .weight_decay(s.o.weight_decay)
                                                            .nesterov(s.o.nesterov));
    else
        s.optimizer = std::make_unique<torch::optim::AdamW>(
            params, torch::optim::AdamWOptions(s.o.lr).weight_decay(s.o.weight_decay));

    s.sync = std::make_unique<dist::GradientSynchronizer>(
        comm, params, static_cast<std::size_t>(s.o.bucket_bytes));
    s.sync->broadcast_parameters(0);
    s.sync_buffers();

    s.per_epoch = static_cast<std::int64_t>(s.make_sampler().num_samples()) / s.o.batch_size;
    if (!s.o.drop_last && s.make_sampler().num_samples() % s.o.batch_size) ++s.per_epoch;
}

ClassificationTrainer::~ClassificationTrainer() = default;

std::int64_t ClassificationTrainer::iterations_per_epoch() const {
    return s_->per_epoch;
}

void ClassificationTrainer::set_schedule(const LrSchedule& schedule) {
    s_->o.schedule = schedule;
}

std::int64_t ClassificationTrainer::total_iterations() const {
    const std::int64_t all = s_->per_epoch * s_->o.epochs;
    return s_->o.max_iters > 0 ? std::min(all, s_->o.max_iters) : all;
}

void ClassificationTrainer::on_iteration_comm(
    std::function<void(const dist::IterationComm&)> callback) {
    s_->on_comm = std::move(callback);
}

const dist::GradientSynchronizer& ClassificationTrainer::synchronizer() const {
    return *s_->sync;
}

void ClassificationTrainer::run(Recorder* recorder, prof::PhaseTimer& timer,
                                prof::ProfilerWindow* window) {
    State& s = *s_;
    const std::int64_t total = total_iterations();
    const bool on_cuda = s.o.device.is_cuda();
    const int cuda_index = on_cuda ? s.o.device.index() : -1;
    const double global_batch = static_cast<double>(s.o.batch_size) * s.size;
    std::vector<std::pair<std::int64_t, torch::Tensor>> deferred_losses; // resolved at flush

    auto flush = [&] {
        if (!recorder) return;
        for (auto& [it, loss] : deferred_losses)
            recorder->set_loss(it, loss.item<double>());
        deferred_losses.clear();
        recorder->flush();
    };

    std::int64_t iteration = 0;
    auto t_log = std::chrono::steady_clock::now();
    const auto t_begin = t_log;
    std::int64_t logged_at = 0;
    for (std::int64_t epoch = 0; epoch < s.o.epochs && iteration < total; ++epoch) {
        const auto t_epoch = std::chrono::steady_clock::now();
        data::DistributedSampler sampler = s.make_sampler();
        sampler.set_epoch(epoch);
        data::Loader loader(s.data.train, s.transform, sampler.indices(), s.o.batch_size,
                            s.o.workers, s.o.prefetch, s.o.pin_memory, s.o.drop_last);
        s.model->train();
        torch::Tensor loss_sum =
            torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(s.o.device));
        std::int64_t epoch_iters = 0;
        double epoch_samples = 0;

        while (iteration < total) {
            timer.begin_iteration(iteration);
            if (window) window->begin_iteration(iteration);
            std::optional<data::Batch> batch;
            {
                prof::PhaseScope p(timer, prof::Phase::Data);
                batch = loader.next();
            }
            if (!batch) {
                timer.cancel_iteration(); // end of epoch: nothing was trained
                if (window) window->cancel_iteration();
                break;
            }
            const double lr = s.o.schedule.at(iteration);
            for (auto& group : s.optimizer->param_groups())
                group.options().set_lr(lr);

            torch::Tensor x, y;
            {
                prof::PhaseScope p(timer, prof::Phase::H2D);
                x = batch->images.to(s.o.device, s.o.dtype,
                                     /*non_blocking=*/s.o.pin_memory);             // [B,C,S,S]
                y = batch->labels.to(s.o.device, /*non_blocking=*/s.o.pin_memory); // [B]
            }
            torch::Tensor loss;
            {
                prof::PhaseScope p(timer, prof::Phase::Forward);
                s.sync_buffers();
                torch::Tensor logits = s.model->forward(x); // [B, classes]
                loss = torch::nn::functional::cross_entropy(logits, y);
            }
            {
                prof::PhaseScope p(timer, prof::Phase::Backward);
                s.sync->begin_iteration();
                loss.backward();
            }
            {
                prof::PhaseScope p(timer, prof::Phase::CommWait);
                s.sync->finish();
            }
            {
                prof::PhaseScope p(timer, prof::Phase::Optimizer);
                s.optimizer->step();
                s.optimizer->zero_grad(/*set_to_none=*/false);
            }
            timer.end_iteration();
            if (window) window->end_iteration(iteration);

            torch::Tensor loss_d = loss.detach().to(torch::kFloat64);
            loss_sum += loss_d;
            epoch_samples += static_cast<double>(batch->size);
            ++epoch_iters;
            if (recorder) {
                IterationValues v;
                v.iteration = iteration;
                v.epoch = epoch;
                v.samples = static_cast<double>(batch->size);
                v.lr = lr;
                // Read late in the iteration: on NCCL it waits for the collectives' end events.
                const dist::IterationComm c = s.sync->last_iteration();
                v.comm_bytes = c.bytes;
                v.comm_collective_s = c.collective_s;
                if (s.on_comm) s.on_comm(c);
                v.memory = prof::sample_memory(cuda_index);
                const StateBytes sb = state_bytes(s.params, *s.optimizer);
                v.parameter_bytes = sb.parameters;
                v.gradient_bytes = sb.gradients;
                v.optimizer_state_bytes = sb.optimizer;
                recorder->record_iteration(v);
                deferred_losses.emplace_back(iteration, loss_d);
                if (recorder->flush_due()) flush();
            }
            ++iteration;

            if (s.o.log_every > 0 && (iteration % s.o.log_every == 0 || iteration == total)) {
                const auto now = std::chrono::steady_clock::now();
                const double dt = std::chrono::duration<double>(now - t_log).count();
                const double rate = dt > 0 ? global_batch * (iteration - logged_at) / dt : 0;
                const double elapsed = std::chrono::duration<double>(now - t_begin).count();
                const double eta = elapsed / iteration * (total - iteration);
                std::ostringstream line;
                line << "iter " << iteration << "/" << total << "  epoch " << epoch + 1 << "/"
                     << s.o.epochs << "  loss " << std::fixed << std::setprecision(4)
                     << loss_d.item<double>() << "  " << std::setprecision(1) << rate
                     << " samples/s  ETA " << format_duration(eta);
                core::log::info() << line.str();
                t_log = now;
                logged_at = iteration;
            }
        }

        EpochValues ev;
        ev.epoch = epoch;
        ev.samples = epoch_samples;
        ev.train_loss =
            epoch_iters ? loss_sum.item<double>() / static_cast<double>(epoch_iters) : std::nan("");
        if (s.o.eval) {
            auto [vl, va] = evaluate();
            ev.val_loss = vl;
            ev.val_accuracy = va;
            core::log::info() << "epoch " << epoch + 1 << "/" << s.o.epochs << "  train_loss "
                              << ev.train_loss << "  val_loss " << vl << "  val_accuracy "
                              << std::setprecision(4) << 100.0 * va << "%";
        } else {
            ev.val_loss = ev.val_accuracy = std::nan("");
        }
        ev.epoch_s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t_epoch).count();
        if (recorder) recorder->record_epoch(ev);
    }
    flush();
}

std::pair<double, double> ClassificationTrainer::evaluate() {
    State& s = *s_;
    torch::NoGradGuard no_grad;
    s.model->eval();
    const std::int64_t n = s.data.test.labels.size(0);
    // Exact shard without padding: rank r takes every size-th sample from r, so each test image
    // counts once however many ranks there are.
    std::vector<std::int64_t> mine;
    for (std::int64_t i = s.rank; i < n; i += s.size)
        mine.push_back(i);
    data::Loader loader(s.data.test, s.transform, mine, s.o.eval_batch_size, s.o.workers,
                        s.o.prefetch, s.o.pin_memory, /*drop_last=*/false);
    double sums[3] = {0, 0, 0}; // loss sum, correct, count
    while (auto batch = loader.next()) {
        torch::Tensor x = batch->images.to(s.o.device, s.o.dtype);
        torch::Tensor y = batch->labels.to(s.o.device);
        torch::Tensor logits = s.model->forward(x);
        sums[0] +=
            torch::nn::functional::cross_entropy(
                logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                .item<double>();
        sums[1] += logits.argmax(1).eq(y).sum().item<double>();
        sums[2] += static_cast<double>(batch->size);
    }
    MPI_Allreduce(MPI_IN_PLACE, sums, 3, MPI_DOUBLE, MPI_SUM, s.world);
    s.model->train();
    if (sums[2] == 0) return {std::nan(""), std::nan("")};
    return {sums[0] / sums[2], sums[1] / sums[2]};
}

} // namespace trainscope::train
