// LLM fine-tuning step. One iteration = llm.gradient_accumulation micro-batches of
// train.batch_size sequences on every rank, then one optimizer step:
//   data (the micro-batches, collated ahead by the prefetching loader's threads) -> per
//   micro-batch: h2d, forward, backward (the synchronizer armed before the last one, so its bucket
//   allreduces overlap that backward) -> comm_wait (finish the allreduces; the label-token count
//   is summed over ranks, host-side) -> [control, by the loop] -> optimizer. Losses and DPO rewards
//   stay on the device until the loop resolves them (one allreduce for all pending iterations).
// SFT loss (torchtune): the summed token cross-entropy of all micro-batches and ranks divided by
// their total label tokens. Each backward runs on the micro-batch's summed loss; after the
// allreduce (which averages over ranks) the gradients are multiplied by world / total tokens.
// DPO: per micro-batch loss = mean over its pairs, divided by the accumulation count (torchtune's
// DPO recipe), averaged over ranks by the allreduce.
#include "trainscope/train/llm_trainer.hpp"

#include "llm_trainer_state.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <optional>
#include <sstream>

#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/data/distributed_sampler.hpp"
#include "trainscope/data/prefetcher.hpp"
#include "trainscope/distributed/mpi_runtime.hpp"
#include "trainscope/models/fake_quant.hpp"
#include "trainscope/models/lora.hpp"
#include "trainscope/models/safetensors.hpp"
#include "trainscope/prof/memory.hpp"
#include "trainscope/prof/phase_timer.hpp"
#include "trainscope/prof/profiler_window.hpp"
#include "trainscope/train/host_sync.hpp"
#include "trainscope/train/llm_loss.hpp"

namespace trainscope::train {
LlmTrainer::LlmTrainer(const LlmTrainerOptions& options, LlmModel model,
                       const data::TextDataset& data, const data::Tokenizer& tokenizer,
                       dist::Communicator& comm, MPI_Comm world, LlmSplit split)
    : s_(std::make_unique<State>(options, std::move(model), data, tokenizer, comm, world,
                                 std::move(split))) {
    s_->peak = prof::PhasePeak(s_->cuda_index(), s_->o.accounting);
    State& s = *s_;
    s.rank = comm.rank();
    s.size = comm.size();
    const LlmOptions& l = s.o.llm;
    if (l.packed) {
        std::vector<const data::TokenizedSample*> all;
        const std::int64_t n =
            s.split.train.empty() ? data.size() : static_cast<std::int64_t>(s.split.train.size());
        for (std::int64_t i = 0; i < n; ++i)
            all.push_back(&data.sample(s.sample_of(i)));
        const std::int64_t pad = tokenizer.specials().pad >= 0 ? tokenizer.specials().pad : 0;
        s.packs = data::pack_samples(all, l.dataset.max_seq_len, pad);
    }
    // Under dist.zero=3 the model is materialised unit by unit here.
    s.parallel = parallelize_llm(l, s.o.optimizer, s.o.precision.loss_scaling, comm, s.m,
                                 static_cast<std::size_t>(s.o.bucket_bytes),
                                 static_cast<std::size_t>(s.o.first_bucket_bytes), s.o.compression);
    // Frozen state for the memory columns: dense base weights and NF4 buffers.
    for (const auto& p : s.m.model->parameters())
        if (!p.requires_grad()) s.frozen_bytes += bytes_of(p);
    for (const auto& b : s.m.model->named_buffers())
        s.nf4_bytes += bytes_of(b.value());
    // Per rank: what the kind holds of the frozen tensors (FSDP: the shards).
    s.parallel->frozen_bytes(s.frozen_bytes, s.nf4_bytes);
    GradScaler::Options so;
    so.enabled = s.o.precision.loss_scaling;
    s.scaler = std::make_unique<GradScaler>(so, s.o.device);

    const std::int64_t n = static_cast<std::int64_t>(s.make_sampler().num_samples());
    s.per_epoch = n / (s.o.batch_size * l.gradient_accumulation);
    if (s.per_epoch == 0)
        throw core::ConfigError(
            "each rank gets " + std::to_string(n) + " " + (l.packed ? "packs" : "samples") +
            " per epoch but one iteration needs train.batch_size x llm.gradient_accumulation = " +
            std::to_string(s.o.batch_size * l.gradient_accumulation) +
            ": use a smaller batch or accumulation, fewer ranks, or more data");
}

LlmTrainer::~LlmTrainer() = default;

std::int64_t LlmTrainer::iterations_per_epoch() const {
    return s_->per_epoch;
}
std::int64_t LlmTrainer::start_iteration() const {
    return s_->start_iteration;
}
const dist::GradientSynchronizer* LlmTrainer::synchronizer() const {
    return s_->parallel->synchronizer();
}
const LlmModel& LlmTrainer::model() const {
    return s_->m;
}
std::vector<torch::Tensor> LlmTrainer::trainable_values() {
    return s_->parallel->full_trainable();
}

void LlmTrainer::begin_epoch(std::int64_t epoch, std::int64_t skip) {
    State& s = *s_;
    s.loader.reset(); // stops the last epoch's workers first
    data::DistributedSampler sampler = s.make_sampler();
    sampler.set_epoch(epoch);
    s.order = sampler.indices();
    const std::int64_t accum = s.o.llm.gradient_accumulation, batch = s.o.batch_size;
    const State* state = &s;
    // On a GPU the token tensors are pinned by the loader's workers, so that the h2d copies are
    // asynchronous: a copy from pageable memory makes the host wait for the device.
    const bool pin = s.o.device.is_cuda();
    // Item j = iteration (skip + j) of the epoch: its accumulation micro-batches, collated.
    s.loader = std::make_unique<data::Prefetcher<std::vector<data::TextBatch>>>(
        std::max<std::int64_t>(0, s.per_epoch - skip), s.o.workers, s.o.prefetch,
        [state, skip, accum, batch, pin](std::int64_t j) {
            const std::int64_t k = skip + j;
            std::vector<data::TextBatch> micro;
            for (std::int64_t a = 0; a < accum; ++a) {
                const auto first = state->order.begin() + (k * accum + a) * batch;
                data::TextBatch b = state->collate({first, first + batch});
                if (pin) {
                    b.input_ids = b.input_ids.pin_memory();
                    b.labels = b.labels.pin_memory();
                    b.position_ids = b.position_ids.pin_memory();
                    if (b.segment_ids.defined()) b.segment_ids = b.segment_ids.pin_memory();
                }
                micro.push_back(std::move(b));
            }
            return micro;
        });
    s.m.model->train();
}

bool LlmTrainer::next_batch() {
    State& s = *s_;
    std::optional<std::vector<data::TextBatch>> item = s.loader->next();
    if (!item) return false;
    s.micro = std::move(*item);
    return true;
}

void LlmTrainer::set_lr(double lr) {
    s_->parallel->set_lr(lr);
}

StepResult LlmTrainer::step(std::int64_t iteration, prof::PhaseTimer& timer, RunControl* control) {
    State& s = *s_;
    const LlmOptions& l = s.o.llm;
    const bool dpo = l.method == LlmMethod::Dpo;
    const std::int64_t accum = l.gradient_accumulation;
    auto& model = *s.m.model;
    if (l.method == LlmMethod::Qat && l.qat_start_step > 0 && iteration == l.qat_start_step)
        models::set_qat_enabled(model, true);

    StepResult r;
    double tokens = 0, label_tokens = 0, padded = 0, cells = 0;
    double len_max = 0, len_min = std::numeric_limits<double>::infinity(), sequences = 0;
    for (const auto& b : s.micro) {
        tokens += static_cast<double>(b.tokens);
        label_tokens += static_cast<double>(b.label_tokens);
        padded += static_cast<double>(b.padded_tokens);
        cells += static_cast<double>(b.input_ids.numel());
        len_max = std::max(len_max, static_cast<double>(b.max_len));
        len_min = std::min(len_min, static_cast<double>(b.min_len));
        sequences += static_cast<double>(b.input_ids.size(0));
    }

    // Allocator peak per phase (CUDA caching allocator, or the host tensor counter on CPU);
    // forward and backward repeat per micro-batch and keep their largest peak.
    s.parallel->begin_iteration();
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(s.o.device);
    torch::Tensor loss_acc = torch::zeros({}, f64);
    // DPO, summed over micro-batches: chosen and rejected rewards, margin, accuracy.
    torch::Tensor dpo_vals = dpo ? torch::zeros({4}, f64) : torch::Tensor();
    for (std::int64_t a = 0; a < accum; ++a) {
        data::TextBatch& b = s.micro[static_cast<std::size_t>(a)];
        torch::Tensor ids, labels, pos, seg;
        {
            prof::PhaseScope p(timer, prof::Phase::H2D);
            // Pinned on a GPU (begin_epoch): asynchronous copies, no host wait.
            const bool async = s.o.device.is_cuda();
            ids = b.input_ids.to(s.o.device, async);
            labels = b.labels.to(s.o.device, async);
            pos = b.position_ids.to(s.o.device, async);
            if (b.segment_ids.defined()) seg = b.segment_ids.to(s.o.device, async);
        }
        torch::Tensor loss;
        {
            prof::PhaseScope p(timer, prof::Phase::Forward);
            s.peak.begin();
            if (dpo) {
                const std::int64_t pairs = ids.size(0) / 2;
                torch::Tensor ref_c, ref_r;
                {
                    // The reference: the same model with its adapters switched off.
                    torch::NoGradGuard no_grad;
                    models::set_adapters_enabled(model, false);
                    AutocastScope autocast(s.o.precision, s.o.device);
                    const torch::Tensor logp =
                        head_score(model, model.hidden_states(ids, pos), labels,
                                   LmScore::SequenceLogProbs, l.loss_chunks);
                    models::set_adapters_enabled(model, true);
                    ref_c = logp.narrow(0, 0, pairs);
                    ref_r = logp.narrow(0, pairs, pairs);
                }
                AutocastScope autocast(s.o.precision, s.o.device);
                const torch::Tensor logp = head_score(model, model.hidden_states(ids, pos), labels,
                                                      LmScore::SequenceLogProbs, l.loss_chunks);
                DpoLoss d = dpo_loss(logp.narrow(0, 0, pairs), logp.narrow(0, pairs, pairs), ref_c,
                                     ref_r, l.dpo_beta, l.dpo_label_smoothing);
                loss = d.loss / static_cast<double>(accum);
                if (control) inject_fault(*control, iteration, loss);
                {
                    torch::NoGradGuard no_grad;
                    const torch::Tensor c = d.chosen_rewards.detach().to(torch::kFloat64);
                    const torch::Tensor rj = d.rejected_rewards.detach().to(torch::kFloat64);
                    dpo_vals += torch::stack({c.mean(), rj.mean(), (c - rj).mean(),
                                              (c > rj).to(torch::kFloat64).mean()});
                }
            } else {
                AutocastScope autocast(s.o.precision, s.o.device);
                loss = head_score(model, model.hidden_states(ids, pos, seg), labels,
                                  LmScore::TokenLossSum, l.loss_chunks);
                if (control) inject_fault(*control, iteration, loss);
            }
            loss_acc += loss.detach().to(torch::kFloat64);
            s.peak.end(r.forward_peak);
        }
        {
            prof::PhaseScope p(timer, prof::Phase::Backward);
            s.peak.begin();
            if (a == accum - 1) s.parallel->before_last_backward();
            s.scaler->scale(loss).backward();
            s.parallel->after_backward();
            s.peak.end(r.backward_peak);
        }
    }

    // Exposed communication: finish the gradients' collectives and, for SFT, sum the label-token
    // count of the global batch (host-side: the collated batches know their counts, so no device
    // value is read).
    double global_label_tokens = label_tokens;
    {
        prof::PhaseScope p(timer, prof::Phase::CommWait);
        // Collectives still in flight (FSDP's reduce-scatters) first, so their wait is counted as
        // theirs (the host allreduce below would otherwise wait for them on MPI's queue).
        s.parallel->wait_in_flight();
        if (!dpo) {
            std::vector<double> n = {label_tokens};
            s.comm.allreduce_host(n, dist::ReduceOp::Sum);
            global_label_tokens = n[0];
        }
        // torchtune's normalisation: sum over all tokens / all label tokens. The gradients are
        // averaged over ranks, hence the factor world / tokens.
        s.parallel->finish_gradients(
            dpo ? 1.0 : (global_label_tokens > 0 ? s.size / global_label_tokens : 0.0));
    }
    // r.loss_scale (fp16-mixed): read with the scaler's verdict in prepare_apply.
    s.loss_acc = loss_acc;
    // Resolved later: SFT = summed token loss / global label tokens (the count rides along);
    // DPO = this rank's mean over micro-batches averaged over ranks, plus this rank's rewards.
    r.loss = loss_acc;
    r.metrics =
        dpo ? dpo_vals / static_cast<double>(accum) : torch::full({1}, global_label_tokens, f64);
    r.samples = dpo ? sequences / 2 : sequences;
    r.tokens = tokens;
    r.label_tokens = label_tokens;
    r.extra.assign(kExtraCount, kNaN);
    r.extra[kPaddingFraction] = cells > 0 ? padded / cells : 0.0;
    r.extra[kSeqLenMax] = len_max;
    r.extra[kSeqLenMin] = len_min;
    r.extra[kSequences] = sequences;
    r.extra[kQatEnabled] =
        l.method == LlmMethod::Qat ? (iteration >= l.qat_start_step ? 1.0 : 0.0) : kNaN;
    return r;
}

torch::Tensor LlmTrainer::nonfinite_flag(const StepResult&) {
    State& s = *s_;
    // The loss scaler handles its own inf/NaN steps.
    if (s.scaler->enabled()) return {};
    return train::nonfinite_flag(s.loss_acc, s.parallel->full_gradient_parameters(),
                                 s.parallel->gradient_shard_sums());
}

void LlmTrainer::prepare_apply(StepResult& r) {
    State& s = *s_;
    if (!s.scaler->enabled()) return;
    // fp16-mixed (DDP only: the sharded kinds refuse it): the step is taken or skipped on the
    // host, so the scaler's verdict is read here, once, after a synchronize bounded by
    // dist.timeout (a stalled peer is named instead of blocking the read in the CUDA driver).
    s.scaler->unscale_on_device(s.parallel->full_gradient_parameters());
    s.comm.synchronize("the loss scaler's inf/NaN check");
    r.loss_scale = s.scaler->check_step().scale;
}

bool LlmTrainer::apply(bool skip, double& optimizer_peak) {
    State& s = *s_;
    s.peak.begin();
    bool stepped = false;
    if (skip) // run.nonfinite=skip: no rank steps
        s.parallel->skip_step();
    else
        stepped = s.parallel->step(scaled_step(*s.scaler));
    s.peak.end(optimizer_peak);
    return stepped;
}

namespace {

// The iteration's communication into its columns (durations NaN until resolved): the common
// ones, and the sharded kinds' all-gathers and reduce-scatters.
void put_llm_comm(const dist::ParallelComm& c, IterationValues& v) {
    put_comm(c, v);
    v.extra[kAllgatherBytes] = c.allgather_bytes;
    v.extra[kAllgatherS] = c.allgather_s;
    v.extra[kAllgatherExposedS] = c.allgather_exposed_s;
    v.extra[kReduceScatterBytes] = c.reduce_scatter_bytes;
    v.extra[kReduceScatterS] = c.reduce_scatter_s;
    v.extra[kReduceScatterExposedS] = c.reduce_scatter_exposed_s;
}

} // namespace

void LlmTrainer::account(IterationValues& v) {
    State& s = *s_;
    // Bytes now; the collectives' durations stay NaN until resolve_accounting, from the handles
    // kept here.
    put_llm_comm(s.deferred_comm.take(*s.parallel, v.iteration), v);
    v.memory = prof::sample_memory(s.cuda_index());
    const dist::HeldBytes held = s.parallel->held_bytes();
    v.extra[kGatheredWeightBytes] = held.gathered;
    v.parameter_bytes = held.trainable + s.frozen_bytes + s.nf4_bytes;
    v.gradient_bytes = held.gradients;
    v.optimizer_state_bytes = held.optimizer_state;
    v.extra[kFrozenWeightBytes] = s.frozen_bytes;
    v.extra[kNf4WeightBytes] = s.nf4_bytes;
    v.extra[kTrainableWeightBytes] = held.trainable;
}

void LlmTrainer::resolve_accounting(std::int64_t iteration, IterationValues& v) {
    State& s = *s_;
    if (const auto c = s.deferred_comm.resolve(iteration)) put_llm_comm(*c, v);
}

std::string LlmTrainer::save_checkpoint(Checkpointer& checkpointer, std::int64_t next_iteration) {
    State& s = *s_;
    const int cuda_index = s.cuda_index();
    return checkpointer.save(next_iteration, [&](torch::serialize::OutputArchive& out) {
        // Replicated state (the scaler; the kind's weights and optimizer) from rank 0, the kind's
        // shards from every rank.
        if (s.rank == 0) {
            torch::serialize::OutputArchive scaler;
            s.scaler->save(scaler);
            out.write("scaler", scaler);
        }
        s.parallel->save(out, s.rank);
        save_rng_state(out, cuda_index);
    });
}

void LlmTrainer::restore(const CheckpointManifest& m) {
    State& s = *s_;
    const int cuda_index = s.o.device.is_cuda() ? s.o.device.index() : -1;
    dist::agree_on_errors(s.world, [&] {
        // Elastic resume (another rank count): replicated state from rank 0's file, shards cut
        // again from the saved ranks' shards that overlap this rank's; a rank the checkpoint did
        // not have keeps its own RNG.
        // Rank 0's file (replicated state) once per node, this rank's own by itself.
        CheckpointShards shards(m, s.o.device, s.world, {0, s.rank});
        torch::serialize::InputArchive scaler;
        shards.rank(0).read("scaler", scaler);
        s.scaler->load(scaler);
        s.parallel->load(shards, s.rank, /*elastic=*/m.world_size != s.size);
        if (s.rank < m.world_size) load_rng_state(shards.rank(s.rank), cuda_index);
        s.start_iteration = read_int(shards.rank(0), "next_iteration");
    });
    const LlmOptions& l = s.o.llm;
    if (l.method == LlmMethod::Qat && l.qat_start_step > 0 && s.start_iteration >= l.qat_start_step)
        models::set_qat_enabled(*s.m.model, true); // the run had switched it on before the stop
}

std::string LlmTrainer::save_adapters(const std::string& path) {
    State& s = *s_;
    if (path.empty() || models::lora_parameters(*s.m.model).empty()) return "";
    auto write = [&] {
        // The weights the adapters were trained on; none when they were initialised at random
        // (no base model on disk reproduces them).
        const LlmOptions& l = s.o.llm;
        const std::string base =
            l.checkpoint.empty()
                ? std::string()
                : std::filesystem::absolute(l.checkpoint).lexically_normal().string();
        models::save_peft_adapter(path, *s.m.model, l.lora, base);
    };
    // Under sharding the full adapters are gathered on every rank (collective); rank 0 writes.
    s.parallel->with_full_trainable([&] {
        if (s.rank == 0) write();
    });
    return path;
}

} // namespace trainscope::train
