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

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>

#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/data/distributed_sampler.hpp"
#include "trainscope/data/prefetcher.hpp"
#include "trainscope/dist/mpi_runtime.hpp"
#include "trainscope/models/fake_quant.hpp"
#include "trainscope/models/lora.hpp"
#include "trainscope/models/nf4.hpp"
#include "trainscope/models/safetensors.hpp"
#include "trainscope/prof/memory.hpp"
#include "trainscope/prof/phase_timer.hpp"
#include "trainscope/prof/profiler_window.hpp"
#include "trainscope/train/fsdp.hpp"
#include "trainscope/train/host_sync.hpp"
#include "trainscope/train/llm_loss.hpp"
#include "trainscope/train/zero.hpp"

namespace trainscope::train {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Extra /iterations columns of the LLM workload, in this order.
enum Extra {
    kPaddingFraction,
    kSeqLenMax,
    kSeqLenMin,
    kSequences,
    kDpoRewardChosen,
    kDpoRewardRejected,
    kDpoRewardMargin,
    kDpoRewardAccuracy,
    kQatEnabled,
    kFrozenWeightBytes,
    kNf4WeightBytes,
    kTrainableWeightBytes,
    kAllgatherBytes,
    kAllgatherS,
    kAllgatherExposedS,
    kReduceScatterBytes,
    kReduceScatterS,
    kReduceScatterExposedS,
    kGatheredWeightBytes,
    kExtraCount
};

double bytes_of(const torch::Tensor& t) {
    return t.defined() ? static_cast<double>(t.nbytes()) : 0.0;
}

} // namespace

std::string LlmModel::describe() const {
    std::ostringstream o;
    o << parameters << " parameters, " << trainable_parameters << " trainable";
    if (!projections.empty()) {
        o << "; projections:";
        for (const auto& [kind, n] : projections)
            o << " " << n << " " << kind;
    }
    return o.str();
}

LlmModel build_llm_model(const LlmOptions& o, const models::LlamaConfig& config,
                         const PrecisionPolicy& policy, torch::Device device) {
    LlmModel m;
    const auto options = torch::TensorOptions().dtype(policy.param_dtype).device(device);
    m.model = models::LlamaForCausalLM(config, options);
    if (!o.checkpoint.empty()) {
        const models::LoadReport r = models::load_hf_weights(*m.model, o.checkpoint);
        core::log::info() << "loaded " << r.tensors_loaded << " tensors ("
                          << r.bytes_read / (1024.0 * 1024.0) << " MiB) from " << o.checkpoint
                          << (r.tensors_derived ? ", skipped " + std::to_string(r.tensors_derived) +
                                                      " derivable (rotary caches, a tied head)"
                                                : std::string());
    }
    m.model->set_activation_checkpointing(o.activation_checkpointing);
    m.parameters = config.num_parameters();
    switch (o.method) {
    case LlmMethod::Full:
        break;
    case LlmMethod::Lora:
    case LlmMethod::Dpo:
        models::apply_lora(*m.model, o.lora);
        break;
    case LlmMethod::Qlora:
        models::quantize_nf4(*m.model, policy.param_dtype);
        models::apply_lora(*m.model, o.lora);
        break;
    case LlmMethod::Qat:
        models::apply_qat(*m.model, o.qat_group_size);
        if (o.qat_lora) models::apply_lora(*m.model, o.lora);
        models::set_qat_enabled(*m.model, o.qat_start_step == 0);
        break;
    }
    for (const auto& item : m.model->named_parameters(/*recurse=*/true))
        if (item.value().requires_grad()) {
            m.trainable_names.push_back(item.key());
            m.trainable.push_back(item.value());
            m.trainable_parameters += item.value().numel();
        }
    models::for_each_projection(
        *m.model, [&](torch::nn::Module&, const std::string&, const std::string&,
                      std::shared_ptr<models::ProjectionImpl> p) { ++m.projections[p->kind()]; });
    // Building and quantising freed large temporaries (the dense weights before NF4, the
    // checkpoint's mapped pages): hand them back to the OS so RSS shows what training holds.
    ::malloc_trim(0);
    if (m.trainable.empty())
        throw core::ConfigError("llm.method=" + std::string(to_string(o.method)) +
                                " left nothing to train (llm.lora.targets matched no projection?)");
    return m;
}

LlmSplit split_validation(std::int64_t n, std::int64_t n_val, std::uint64_t seed) {
    // Fisher-Yates with the engine's raw output (std::shuffle and the standard distributions may
    // differ between library versions; mt19937_64's sequence is fixed by the standard). The
    // modulo bias is far below anything a split could show.
    std::vector<std::int64_t> perm(static_cast<std::size_t>(n));
    std::iota(perm.begin(), perm.end(), std::int64_t{0});
    std::mt19937_64 rng(seed ^ 0x76616c5f73706c74ULL); // "val_splt": not the sampler's stream
    for (std::int64_t i = n - 1; i > 0; --i)
        std::swap(perm[static_cast<std::size_t>(i)],
                  perm[static_cast<std::size_t>(rng() % static_cast<std::uint64_t>(i + 1))]);
    LlmSplit out;
    out.val.assign(perm.begin(), perm.begin() + n_val);
    out.train.assign(perm.begin() + n_val, perm.end());
    std::sort(out.val.begin(), out.val.end());
    std::sort(out.train.begin(), out.train.end());
    return out;
}

struct LlmTrainer::State {
    LlmTrainerOptions o;
    LlmModel m;
    const data::TextDataset& data;
    const data::Tokenizer& tokenizer;
    dist::Communicator& comm;
    MPI_Comm world;
    LlmSplit split;
    int rank = 0, size = 1;
    std::vector<data::PackedSample> packs; // llm.packed (of the training samples)
    std::unique_ptr<dist::GradientSynchronizer> sync;
    std::unique_ptr<ZeroOptimizer> zero;
    std::unique_ptr<FsdpModel> fsdp; // dist.zero=3
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    std::unique_ptr<GradScaler> scaler;
    std::int64_t per_epoch = 0;
    double frozen_bytes = 0, nf4_bytes = 0; // fixed for the run
    std::int64_t start_iteration = 0;       // > 0 after restore()
    // The epoch's prefetching loader (one item = one iteration's micro-batches) and the item the
    // data phase fetched.
    std::vector<std::int64_t> order;
    std::unique_ptr<data::Prefetcher<std::vector<data::TextBatch>>> loader;
    std::vector<data::TextBatch> micro;
    prof::PhasePeak peak{-1, false};
    torch::Tensor loss_acc;            // this iteration's, on the device
    double comm_bytes = 0, comm_s = 0; // ZeRO's, of this iteration
    // Per recorded iteration, the collectives whose durations account() left open (reading them
    // there would wait for the device on NCCL): resolved and dropped by resolve_accounting.
    struct DeferredComm {
        std::shared_ptr<dist::Work> zero;               // ZeRO-1/2: the gradient reduce-scatter
        std::optional<dist::PendingIterationComm> sync; // DDP: the bucket allreduces
        std::optional<FsdpPendingComm> fsdp;            // dist.zero=3: all-gathers, reduce-scatters
    };
    std::map<std::int64_t, DeferredComm> deferred_comm;
    double lr = 0;
    int cuda_index() const { return o.device.is_cuda() ? o.device.index() : -1; }

    std::size_t num_items() const {
        if (o.llm.packed) return packs.size();
        if (!split.train.empty()) return split.train.size();
        return static_cast<std::size_t>(data.size());
    }
    // The dataset index of training item i (packs are built from the training samples only).
    std::int64_t sample_of(std::int64_t i) const {
        return split.train.empty() ? i : split.train[static_cast<std::size_t>(i)];
    }
    data::DistributedSampler make_sampler() const {
        return data::DistributedSampler(num_items(), rank, size, /*shuffle=*/true, o.seed,
                                        /*drop_last=*/true);
    }
    data::TextBatch collate(const std::vector<std::int64_t>& idx) const {
        const std::int64_t pad = tokenizer.specials().pad >= 0 ? tokenizer.specials().pad : 0;
        if (o.llm.packed) {
            std::vector<const data::PackedSample*> v;
            for (auto i : idx)
                v.push_back(&packs[static_cast<std::size_t>(i)]);
            return data::collate_packed(v, pad);
        }
        if (data.is_preference()) {
            std::vector<const data::PreferenceSample*> v;
            for (auto i : idx)
                v.push_back(&data.preference(sample_of(i)));
            return data::collate_preference(v, pad);
        }
        std::vector<const data::TokenizedSample*> v;
        for (auto i : idx)
            v.push_back(&data.sample(sample_of(i)));
        return data::collate_samples(v, pad);
    }
    // Validation samples (dataset indices of *split.val_data), never packed: the loss per token
    // is the same either way (packed attention is per sample).
    data::TextBatch collate_val(const std::vector<std::int64_t>& idx) const {
        const std::int64_t pad = tokenizer.specials().pad >= 0 ? tokenizer.specials().pad : 0;
        const data::TextDataset& d = *split.val_data;
        if (d.is_preference()) {
            std::vector<const data::PreferenceSample*> v;
            for (auto i : idx)
                v.push_back(&d.preference(i));
            return data::collate_preference(v, pad);
        }
        std::vector<const data::TokenizedSample*> v;
        for (auto i : idx)
            v.push_back(&d.sample(i));
        return data::collate_samples(v, pad);
    }
};

LlmTrainer::LlmTrainer(const LlmTrainerOptions& options, LlmModel model,
                       const data::TextDataset& data, const data::Tokenizer& tokenizer,
                       dist::Communicator& comm, MPI_Comm world, LlmSplit split)
    : s_(std::make_unique<State>(
          State{options, std::move(model), data, tokenizer, comm, world, std::move(split)})) {
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
    // Frozen state for the memory columns: dense base weights and NF4 buffers.
    for (const auto& p : s.m.model->parameters())
        if (!p.requires_grad()) s.frozen_bytes += bytes_of(p);
    for (const auto& b : s.m.model->named_buffers())
        s.nf4_bytes += bytes_of(b.value());

    if (l.zero > 0) {
        ZeroAdamW h;
        h.lr = l.lr;
        h.weight_decay = l.weight_decay;
        // LlmOptions::from_config refused other optimizers and fp16-mixed's loss scaling.
        if (l.optimizer != "adamw" || s.o.precision.loss_scaling)
            throw core::InternalError("dist.zero > 0 without AdamW or with loss scaling");
        if (l.zero == 3) {
            FsdpOptions fo;
            fo.reshard_after_forward = l.reshard_after_forward;
            fo.prefetch = l.prefetch;
            fo.adamw = h;
            s.fsdp = std::make_unique<FsdpModel>(comm, *s.m.model, fo);
            // Per rank: the shards (the gathered units come and go within an iteration).
            s.frozen_bytes = s.fsdp->frozen_shard_bytes();
            s.nf4_bytes = s.fsdp->nf4_shard_bytes();
            ::malloc_trim(0); // the full weights built on every rank are gone
        } else {
            s.zero = std::make_unique<ZeroOptimizer>(comm, s.m.trainable, l.zero, h);
        }
    } else {
        if (l.optimizer == "adamw")
            s.optimizer = std::make_unique<torch::optim::AdamW>(
                s.m.trainable, torch::optim::AdamWOptions(l.lr).weight_decay(l.weight_decay));
        else
            s.optimizer = std::make_unique<torch::optim::SGD>(
                s.m.trainable, torch::optim::SGDOptions(l.lr).weight_decay(l.weight_decay));
        s.sync = std::make_unique<dist::GradientSynchronizer>(
            comm, s.m.trainable, static_cast<std::size_t>(s.o.bucket_bytes),
            static_cast<std::size_t>(s.o.first_bucket_bytes));
        s.sync->broadcast_parameters(0);
    }
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
std::int64_t LlmTrainer::total_iterations() const {
    const std::int64_t all = s_->per_epoch * s_->o.epochs;
    return s_->o.max_iters > 0 ? std::min(all, s_->o.max_iters) : all;
}
std::int64_t LlmTrainer::epochs() const {
    return s_->o.epochs;
}
std::int64_t LlmTrainer::start_iteration() const {
    return s_->start_iteration;
}
void LlmTrainer::set_schedule(const LrSchedule& schedule) {
    s_->o.schedule = schedule;
}
const LrSchedule& LlmTrainer::schedule() const {
    return s_->o.schedule;
}
const dist::GradientSynchronizer* LlmTrainer::synchronizer() const {
    return s_->sync.get();
}
const LlmModel& LlmTrainer::model() const {
    return s_->m;
}
std::vector<torch::Tensor> LlmTrainer::trainable_values() {
    State& s = *s_;
    if (s.fsdp) return s.fsdp->gather_trainable(s.m.trainable_names);
    std::vector<torch::Tensor> out;
    for (const auto& t : s.m.trainable)
        out.push_back(t.detach().to(torch::kCPU).clone());
    return out;
}

std::vector<io::Column> LlmTrainer::extra_columns() {
    return {{"padding_fraction", "1"},     {"seq_len_max", "tokens"},
            {"seq_len_min", "tokens"},     {"sequences", "1"},
            {"dpo_reward_chosen", "nats"}, {"dpo_reward_rejected", "nats"},
            {"dpo_reward_margin", "nats"}, {"dpo_reward_accuracy", "1"},
            {"qat_enabled", "1"},          {"frozen_weight_bytes", "B"},
            {"nf4_weight_bytes", "B"},     {"trainable_weight_bytes", "B"},
            {"allgather_bytes", "B"},      {"allgather_s", "s"},
            {"allgather_exposed_s", "s"},  {"reduce_scatter_bytes", "B"},
            {"reduce_scatter_s", "s"},     {"reduce_scatter_exposed_s", "s"},
            {"gathered_weight_bytes", "B"}};
}

double LlmTrainer::flops_per_token() const {
    // Per token: 2 FLOPs per weight in forward, 2 in backward for the input gradients (they flow
    // through frozen weights too), 2 per trainable weight for the weight gradients; attention
    // scores and values add 2 * 2 * layers * seq * heads * head_dim forward (x3 with backward).
    // Embedding lookups are not matmuls: the embedding table is excluded unless tied to the head.
    const models::LlamaConfig& c = s_->m.model->config();
    const double n_matmul =
        static_cast<double>(c.num_parameters() - c.embedding_parameters() +
                            (c.tie_word_embeddings ? c.embedding_parameters() : 0));
    const double n_train = static_cast<double>(s_->m.trainable_parameters);
    const double seq = static_cast<double>(s_->o.llm.dataset.max_seq_len);
    const double attn = 4.0 * static_cast<double>(c.num_hidden_layers) * seq *
                        static_cast<double>(c.num_attention_heads * c.head_dim);
    return 4.0 * n_matmul + 2.0 * std::min(n_train, n_matmul) + 3.0 * attn;
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
    State& s = *s_;
    if (s.optimizer)
        for (auto& group : s.optimizer->param_groups())
            group.options().set_lr(lr);
    s.lr = lr;
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
    if (s.zero) s.zero->zero_grad();
    if (s.fsdp) s.fsdp->begin_iteration();
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
                    const torch::Tensor logp = sequence_log_probs(model.forward(ids, pos), labels);
                    models::set_adapters_enabled(model, true);
                    ref_c = logp.narrow(0, 0, pairs);
                    ref_r = logp.narrow(0, pairs, pairs);
                }
                AutocastScope autocast(s.o.precision, s.o.device);
                const torch::Tensor logp = sequence_log_probs(model.forward(ids, pos), labels);
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
                loss = causal_lm_loss_sum(model.forward(ids, pos, seg), labels);
                if (control) inject_fault(*control, iteration, loss);
            }
            loss_acc += loss.detach().to(torch::kFloat64);
            s.peak.end(r.forward_peak);
        }
        {
            prof::PhaseScope p(timer, prof::Phase::Backward);
            s.peak.begin();
            if (a == accum - 1 && s.sync) s.sync->begin_iteration();
            s.scaler->scale(loss).backward();
            if (s.fsdp) s.fsdp->end_backward();
            s.peak.end(r.backward_peak);
        }
    }

    // Exposed communication: finish the gradient allreduce (or ZeRO's reduce-scatter) and, for
    // SFT, sum the label-token count of the global batch (host-side: the collated batches know
    // their counts, so no device value is read).
    double global_label_tokens = label_tokens;
    s.comm_bytes = s.comm_s = 0;
    {
        prof::PhaseScope p(timer, prof::Phase::CommWait);
        // FSDP: the gradient reduce-scatters still in flight first, so their wait is counted as
        // theirs (the host allreduce below would otherwise wait for them on MPI's queue).
        if (s.fsdp) s.fsdp->wait_reduces();
        if (!dpo) {
            std::vector<double> n = {label_tokens};
            s.comm.allreduce_host(n, dist::ReduceOp::Sum);
            global_label_tokens = n[0];
        }
        // torchtune's normalisation: sum over all tokens / all label tokens. The synchronizer
        // averaged over ranks, hence the factor world / tokens.
        const double scale =
            dpo ? 1.0 : (global_label_tokens > 0 ? s.size / global_label_tokens : 0.0);
        if (s.sync) {
            s.sync->finish();
            if (scale != 1.0) {
                torch::NoGradGuard no_grad;
                for (auto& t : s.m.trainable)
                    if (t.grad().defined()) t.mutable_grad().mul_(scale);
            }
        } else if (s.fsdp) {
            s.fsdp->finish_gradients(scale);
        } else {
            s.comm_s = s.zero->reduce_gradients(scale);
            s.comm_bytes = s.zero->bytes_per_iteration();
        }
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
    if (s.zero) return train::nonfinite_flag(s.loss_acc, {}, {s.zero->shard_gradient_sum()});
    if (s.fsdp) return train::nonfinite_flag(s.loss_acc, {}, {s.fsdp->shard_gradient_sum()});
    return train::nonfinite_flag(s.loss_acc, s.m.trainable);
}

void LlmTrainer::prepare_apply(StepResult& r) {
    State& s = *s_;
    if (!s.scaler->enabled() || !s.optimizer) return;
    // fp16-mixed: the step is taken or skipped on the host, so the scaler's verdict is read
    // here, once, after a synchronize bounded by dist.timeout (a stalled peer is named instead
    // of blocking the read in the CUDA driver).
    s.scaler->unscale_on_device(optimizer_parameters(*s.optimizer));
    s.comm.synchronize("the loss scaler's inf/NaN check");
    r.loss_scale = s.scaler->check_step().scale;
}

bool LlmTrainer::apply(bool skip, double& optimizer_peak) {
    State& s = *s_;
    s.peak.begin();
    bool stepped = true;
    if (skip) { // run.nonfinite=skip: no rank steps
        stepped = false;
        if (s.optimizer) s.optimizer->zero_grad(/*set_to_none=*/false);
    } else if (s.zero) {
        s.zero->step(s.lr);
    } else if (s.fsdp) {
        s.fsdp->step(s.lr);
    } else {
        if (s.scaler->enabled()) {
            stepped = s.scaler->step(*s.optimizer);
            s.scaler->update();
        } else {
            s.optimizer->step();
        }
        s.optimizer->zero_grad(/*set_to_none=*/false);
    }
    s.peak.end(optimizer_peak);
    return stepped;
}

void LlmTrainer::account(IterationValues& v) {
    State& s = *s_;
    // Bytes now; the collectives' durations (and FSDP's exposed waits) stay NaN until
    // resolve_accounting, from the handles kept here.
    State::DeferredComm d;
    v.comm_bytes = s.comm_bytes;
    v.comm_collective_s = s.comm_s;
    if (s.zero && s.zero->reduce_work()) {
        d.zero = s.zero->reduce_work();
        v.comm_collective_s = kNaN;
    }
    if (s.sync) {
        d.sync = s.sync->last_iteration_pending();
        v.comm_bytes = d.sync->bytes();
        v.comm_collective_s = kNaN;
        v.bucket_s.assign(d.sync->works.size(), kNaN);
    }
    v.memory = prof::sample_memory(s.cuda_index());
    double params = 0, grads = 0, state = 0;
    if (s.fsdp) {
        d.fsdp = s.fsdp->take_iteration_comm();
        const FsdpIterationComm& c = d.fsdp->known;
        v.comm_bytes = c.allgather_bytes + c.reduce_scatter_bytes;
        v.comm_collective_s = kNaN;
        v.extra[kAllgatherBytes] = c.allgather_bytes;
        v.extra[kReduceScatterBytes] = c.reduce_scatter_bytes;
        for (int k : {kAllgatherS, kAllgatherExposedS, kReduceScatterS, kReduceScatterExposedS})
            v.extra[k] = kNaN;
        v.extra[kGatheredWeightBytes] = s.fsdp->gathered_bytes();
        params = s.fsdp->trainable_shard_bytes();
        grads = s.fsdp->gradient_bytes();
        state = s.fsdp->optimizer_state_bytes();
    } else {
        for (const auto& t : s.m.trainable) {
            params += bytes_of(t);
            grads += bytes_of(t.grad());
        }
    }
    if (s.zero) {
        grads = s.zero->gradient_bytes();
        state = s.zero->optimizer_state_bytes();
    } else if (s.optimizer) {
        for (const auto& [key, st] : s.optimizer->state())
            if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(st.get()))
                state += bytes_of(w->exp_avg()) + bytes_of(w->exp_avg_sq());
            else if (auto* g = dynamic_cast<torch::optim::SGDParamState*>(st.get()))
                state += bytes_of(g->momentum_buffer());
    }
    v.parameter_bytes = params + s.frozen_bytes + s.nf4_bytes;
    v.gradient_bytes = grads;
    v.optimizer_state_bytes = state;
    v.extra[kFrozenWeightBytes] = s.frozen_bytes;
    v.extra[kNf4WeightBytes] = s.nf4_bytes;
    v.extra[kTrainableWeightBytes] = params;
    if (d.zero || d.sync || d.fsdp) s.deferred_comm[v.iteration] = std::move(d);
}

void LlmTrainer::resolve_accounting(std::int64_t iteration, IterationValues& v) {
    State& s = *s_;
    const auto it = s.deferred_comm.find(iteration);
    if (it == s.deferred_comm.end()) return;
    const State::DeferredComm& d = it->second;
    if (d.zero) v.comm_collective_s = d.zero->seconds();
    if (d.sync) {
        const dist::IterationComm c = d.sync->resolve();
        v.comm_collective_s = c.collective_s;
        v.bucket_s = c.bucket_s;
    }
    if (d.fsdp) {
        const FsdpIterationComm c = d.fsdp->resolve();
        v.comm_collective_s = c.allgather_s + c.reduce_scatter_s;
        v.extra[kAllgatherS] = c.allgather_s;
        v.extra[kAllgatherExposedS] = c.allgather_exposed_s;
        v.extra[kReduceScatterS] = c.reduce_scatter_s;
        v.extra[kReduceScatterExposedS] = c.reduce_scatter_exposed_s;
    }
    // Older entries belong to iterations the recorder no longer holds: their handles go too.
    s.deferred_comm.erase(s.deferred_comm.begin(), std::next(it));
}

void LlmTrainer::resolve(std::vector<DeferredStep>& steps) {
    State& s = *s_;
    if (steps.empty()) return;
    const bool dpo = s.o.llm.method == LlmMethod::Dpo;
    // This rank's losses of every pending iteration, summed over ranks in one allreduce; then
    // one host read.
    std::vector<torch::Tensor> losses, metrics;
    for (const auto& d : steps) {
        losses.push_back(d.loss.reshape({1}));
        metrics.push_back(d.metrics.reshape({1, -1}));
    }
    torch::Tensor sum = torch::cat(losses); // [n]
    s.comm.allreduce(sum, dist::ReduceOp::Sum);
    const torch::Tensor all = read_to_host(sum);
    const torch::Tensor m =
        read_to_host(torch::cat(metrics)); // [n, 1] label tokens or [n, 4] rewards
    for (std::size_t i = 0; i < steps.size(); ++i) {
        const auto k = static_cast<std::int64_t>(i);
        const double total = all[k].item<double>();
        double value = kNaN;
        if (dpo) {
            value = total / s.size;
            steps[i].metric_values.clear();
            for (std::int64_t j = 0; j < 4; ++j)
                steps[i].metric_values.push_back(m[k][j].item<double>());
        } else {
            const double n = m[k][0].item<double>();
            value = n > 0 ? total / n : kNaN;
        }
        steps[i].loss_value = steps[i].shared_loss = value;
    }
}

std::vector<int> LlmTrainer::metric_columns() const {
    if (s_->o.llm.method != LlmMethod::Dpo) return {};
    return {kDpoRewardChosen, kDpoRewardRejected, kDpoRewardMargin, kDpoRewardAccuracy};
}

std::string LlmTrainer::progress_suffix(const DeferredStep& d) const {
    if (s_->o.llm.method != LlmMethod::Dpo || d.metric_values.size() < 4) return "";
    std::ostringstream o;
    o << "  reward acc " << std::fixed << std::setprecision(2) << d.metric_values[3];
    return o.str();
}

bool LlmTrainer::evaluates() const {
    return s_->split.val_data != nullptr && !s_->split.val.empty();
}

bool LlmTrainer::reports_perplexity() const {
    return s_->o.llm.method != LlmMethod::Dpo;
}

std::pair<double, double> LlmTrainer::evaluate() {
    // Collective. Validation item k goes to rank k % size (each counts once). Every rank runs the
    // same number of forwards, ceil(ceil(n / size) / batch): under dist.zero=3 each forward
    // all-gathers every unit, so a rank that ran fewer would leave the others waiting. A rank
    // whose shard ran out forwards a stand-in batch (the first validation item) and discards it.
    // SFT: summed token cross-entropy over all ranks / their label tokens (as the training loss);
    // DPO: mean over pairs of the DPO loss against the adapters-off reference, and the share of
    // pairs whose chosen reward exceeds the rejected one.
    State& s = *s_;
    const LlmOptions& l = s.o.llm;
    const bool dpo = l.method == LlmMethod::Dpo;
    auto& model = *s.m.model;
    const std::vector<std::int64_t>& items = s.split.val;
    const auto n = static_cast<std::int64_t>(items.size());
    std::vector<std::int64_t> mine;
    for (std::int64_t k = s.rank; k < n; k += s.size)
        mine.push_back(items[static_cast<std::size_t>(k)]);
    const std::int64_t batch = s.o.batch_size;
    const std::int64_t per_rank = (n + s.size - 1) / s.size;
    const std::int64_t batches = (per_rank + batch - 1) / batch;

    torch::NoGradGuard no_grad;
    model.eval();               // LoRA dropout off
    double sums[3] = {0, 0, 0}; // loss sum, correct pairs (DPO), label tokens or pairs
    for (std::int64_t b = 0; b < batches; ++b) {
        const auto first =
            std::min<std::int64_t>(b * batch, static_cast<std::int64_t>(mine.size()));
        const auto last =
            std::min<std::int64_t>(first + batch, static_cast<std::int64_t>(mine.size()));
        const bool stand_in = first == last;
        const std::vector<std::int64_t> idx =
            stand_in ? std::vector<std::int64_t>{items.front()}
                     : std::vector<std::int64_t>(mine.begin() + first, mine.begin() + last);
        const data::TextBatch tb = s.collate_val(idx);
        const torch::Tensor ids = tb.input_ids.to(s.o.device);
        const torch::Tensor labels = tb.labels.to(s.o.device);
        const torch::Tensor pos = tb.position_ids.to(s.o.device);
        double loss_sum = 0, correct = 0, count = 0;
        if (dpo) {
            const std::int64_t pairs = ids.size(0) / 2;
            torch::Tensor ref;
            {
                models::set_adapters_enabled(model, false);
                AutocastScope autocast(s.o.precision, s.o.device);
                ref = sequence_log_probs(model.forward(ids, pos), labels);
                models::set_adapters_enabled(model, true);
            }
            AutocastScope autocast(s.o.precision, s.o.device);
            const torch::Tensor logp = sequence_log_probs(model.forward(ids, pos), labels);
            const DpoLoss d = dpo_loss(logp.narrow(0, 0, pairs), logp.narrow(0, pairs, pairs),
                                       ref.narrow(0, 0, pairs), ref.narrow(0, pairs, pairs),
                                       l.dpo_beta, l.dpo_label_smoothing);
            loss_sum = d.loss.to(torch::kFloat64).item<double>() * static_cast<double>(pairs);
            correct = d.reward_accuracy() * static_cast<double>(pairs);
            count = static_cast<double>(pairs);
        } else {
            AutocastScope autocast(s.o.precision, s.o.device);
            loss_sum = causal_lm_loss_sum(model.forward(ids, pos), labels)
                           .to(torch::kFloat64)
                           .item<double>();
            count = static_cast<double>(tb.label_tokens);
        }
        if (stand_in) continue;
        sums[0] += loss_sum;
        sums[1] += correct;
        sums[2] += count;
    }
    model.train();
    std::vector<double> all(sums, sums + 3);
    s.comm.allreduce_host(all, dist::ReduceOp::Sum);
    if (all[2] == 0) return {kNaN, kNaN};
    return {all[0] / all[2], dpo ? all[1] / all[2] : kNaN};
}

std::string LlmTrainer::save_checkpoint(Checkpointer& checkpointer, std::int64_t next_iteration) {
    State& s = *s_;
    const int cuda_index = s.cuda_index();
    return checkpointer.save(next_iteration, [&](torch::serialize::OutputArchive& out) {
        // Trainable weights, optimizer and scaler are the same on every rank: rank 0 writes them.
        // ZeRO's optimizer state is sharded: every rank writes its shard.
        if (s.rank == 0) {
            torch::serialize::OutputArchive weights, scaler;
            // dist.zero=3: the weights are sharded; every rank writes its shard below.
            if (!s.fsdp) save_named_tensors(weights, *s.m.model, /*trainable_only=*/true);
            s.scaler->save(scaler);
            out.write("weights", weights);
            out.write("scaler", scaler);
            if (s.optimizer) {
                torch::serialize::OutputArchive optimizer;
                s.optimizer->save(optimizer);
                out.write("optimizer", optimizer);
            }
        }
        if (s.zero) {
            torch::serialize::OutputArchive shard;
            s.zero->save(shard);
            out.write("zero_shard", shard);
        }
        if (s.fsdp) {
            torch::serialize::OutputArchive shard;
            s.fsdp->save(shard);
            out.write("fsdp_shard", shard);
        }
        save_rng_state(out, cuda_index);
    });
}

void LlmTrainer::restore(const CheckpointManifest& m) {
    State& s = *s_;
    const int cuda_index = s.o.device.is_cuda() ? s.o.device.index() : -1;
    dist::agree_on_errors(s.world, [&] {
        // Elastic resume (another rank count): replicated state from rank 0's file, the ZeRO and
        // FSDP shards cut again from the saved ranks' shards that overlap this rank's; a rank the
        // checkpoint did not have keeps its own RNG.
        const bool elastic = m.world_size != s.size;
        const bool has_mine = s.rank < m.world_size;
        CheckpointShards shards(m, s.o.device);
        torch::serialize::InputArchive& first = shards.rank(0);
        torch::serialize::InputArchive* from = &first;
        torch::serialize::InputArchive weights, scaler;
        from->read("weights", weights);
        from->read("scaler", scaler);
        if (!s.fsdp) load_named_tensors(weights, *s.m.model, m.path, /*trainable_only=*/true);
        s.scaler->load(scaler);
        if (s.optimizer) {
            torch::serialize::InputArchive optimizer;
            from->read("optimizer", optimizer);
            s.optimizer->load(optimizer);
        }
        // ZeRO's and FSDP's shards: this rank's own, or cut again from another rank count's.
        auto load_shards = [&](auto& sharded, const char* key) {
            if (elastic) return sharded.load_resharded(shards);
            torch::serialize::InputArchive part;
            shards.rank(s.rank).read(key, part);
            sharded.load(part);
        };
        if (s.zero) load_shards(*s.zero, "zero_shard");
        if (s.fsdp) load_shards(*s.fsdp, "fsdp_shard");
        if (has_mine) load_rng_state(shards.rank(s.rank), cuda_index);
        s.start_iteration = read_int(first, "next_iteration");
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
    // dist.zero=3: the full adapters are gathered on every rank (collective), rank 0 writes.
    if (s.fsdp)
        s.fsdp->with_trainable_gathered([&] {
            if (s.rank == 0) write();
        });
    else if (s.rank == 0)
        write();
    return path;
}

} // namespace trainscope::train
