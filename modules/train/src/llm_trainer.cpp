// LLM fine-tuning loop. One iteration = llm.gradient_accumulation micro-batches of
// train.batch_size sequences on every rank, then one optimizer step:
//   data (collate all micro-batches) -> per micro-batch: h2d, forward, backward (the synchronizer
//   armed before the last one, so its bucket allreduces overlap that backward) -> comm_wait
//   (finish the allreduces; the label-token count is summed over ranks) -> optimizer.
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
#include <iomanip>
#include <numeric>
#include <sstream>

#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/data/distributed_sampler.hpp"
#include "trainscope/dist/mpi_runtime.hpp"
#include "trainscope/models/fake_quant.hpp"
#include "trainscope/models/lora.hpp"
#include "trainscope/models/nf4.hpp"
#include "trainscope/models/safetensors.hpp"
#include "trainscope/prof/memory.hpp"
#include "trainscope/prof/phase_timer.hpp"
#include "trainscope/prof/profiler_window.hpp"
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
                          << (r.tensors_ignored ? ", ignored " + std::to_string(r.tensors_ignored)
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

struct LlmTrainer::State {
    LlmTrainerOptions o;
    LlmModel m;
    const data::TextDataset& data;
    const data::Tokenizer& tokenizer;
    dist::Communicator& comm;
    MPI_Comm world;
    int rank = 0, size = 1;
    std::vector<data::PackedSample> packs; // llm.packed
    std::unique_ptr<dist::GradientSynchronizer> sync;
    std::unique_ptr<ZeroOptimizer> zero;
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    std::unique_ptr<GradScaler> scaler;
    std::int64_t per_epoch = 0;
    std::function<void(const dist::IterationComm&)> on_comm;
    double frozen_bytes = 0, nf4_bytes = 0; // fixed for the run
    RunControl* control = nullptr;
    Checkpointer* checkpointer = nullptr;
    std::int64_t start_iteration = 0; // > 0 after restore()
    bool interrupted = false;

    std::size_t num_items() const {
        if (o.llm.packed) return packs.size();
        return static_cast<std::size_t>(data.size());
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
                v.push_back(&data.preference(i));
            return data::collate_preference(v, pad);
        }
        std::vector<const data::TokenizedSample*> v;
        for (auto i : idx)
            v.push_back(&data.sample(i));
        return data::collate_samples(v, pad);
    }
};

LlmTrainer::LlmTrainer(const LlmTrainerOptions& options, LlmModel model,
                       const data::TextDataset& data, const data::Tokenizer& tokenizer,
                       dist::Communicator& comm, MPI_Comm world)
    : s_(std::make_unique<State>(State{options, std::move(model), data, tokenizer, comm, world})) {
    State& s = *s_;
    s.rank = comm.rank();
    s.size = comm.size();
    const LlmOptions& l = s.o.llm;
    if (l.packed) {
        std::vector<const data::TokenizedSample*> all;
        for (std::int64_t i = 0; i < data.size(); ++i)
            all.push_back(&data.sample(i));
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
        if (l.optimizer != "adamw")
            throw core::ConfigError("dist.zero=" + std::to_string(l.zero) +
                                    " implements AdamW: set train.optimizer=adamw");
        s.zero = std::make_unique<ZeroOptimizer>(comm, s.m.trainable, l.zero, h);
    } else {
        if (l.optimizer == "adamw")
            s.optimizer = std::make_unique<torch::optim::AdamW>(
                s.m.trainable, torch::optim::AdamWOptions(l.lr).weight_decay(l.weight_decay));
        else
            s.optimizer = std::make_unique<torch::optim::SGD>(
                s.m.trainable, torch::optim::SGDOptions(l.lr).weight_decay(l.weight_decay));
        s.sync = std::make_unique<dist::GradientSynchronizer>(
            comm, s.m.trainable, static_cast<std::size_t>(s.o.bucket_bytes));
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
void LlmTrainer::set_schedule(const LrSchedule& schedule) {
    s_->o.schedule = schedule;
}
void LlmTrainer::on_iteration_comm(std::function<void(const dist::IterationComm&)> callback) {
    s_->on_comm = std::move(callback);
}
const dist::GradientSynchronizer* LlmTrainer::synchronizer() const {
    return s_->sync.get();
}
const LlmModel& LlmTrainer::model() const {
    return s_->m;
}

std::vector<io::Column> LlmTrainer::extra_columns() {
    return {{"padding_fraction", "1"},     {"seq_len_max", "tokens"},
            {"seq_len_min", "tokens"},     {"sequences", "1"},
            {"dpo_reward_chosen", "nats"}, {"dpo_reward_rejected", "nats"},
            {"dpo_reward_margin", "nats"}, {"dpo_reward_accuracy", "1"},
            {"qat_enabled", "1"},          {"frozen_weight_bytes", "B"},
            {"nf4_weight_bytes", "B"},     {"trainable_weight_bytes", "B"}};
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

void LlmTrainer::run(Recorder* recorder, prof::PhaseTimer& timer, prof::ProfilerWindow* window) {
    State& s = *s_;
    const LlmOptions& l = s.o.llm;
    const std::int64_t total = total_iterations();
    const int cuda_index = s.o.device.is_cuda() ? s.o.device.index() : -1;
    const bool dpo = l.method == LlmMethod::Dpo;
    const std::int64_t accum = l.gradient_accumulation;
    auto& model = *s.m.model;
    model.train();

    std::int64_t iteration = s.start_iteration; // > 0 when resumed
    const std::int64_t first_epoch = s.per_epoch > 0 ? iteration / s.per_epoch : 0;
    auto t_log = std::chrono::steady_clock::now();
    std::int64_t logged_at = iteration;
    double tokens_since_log = 0;
    for (std::int64_t epoch = first_epoch; epoch < s.o.epochs && iteration < total && !s.interrupted;
         ++epoch) {
        const auto t_epoch = std::chrono::steady_clock::now();
        data::DistributedSampler sampler = s.make_sampler();
        sampler.set_epoch(epoch);
        const std::vector<std::int64_t> order = sampler.indices();
        double loss_sum = 0, epoch_samples = 0;
        std::int64_t epoch_iters = 0;
        for (std::int64_t k = epoch == first_epoch ? iteration - epoch * s.per_epoch : 0;
             k < s.per_epoch && iteration < total; ++k) {
            timer.begin_iteration(iteration);
            if (window) window->begin_iteration(iteration);
            if (s.control) s.control->begin_iteration(iteration);
            const double lr = s.o.schedule.at(iteration);
            if (s.optimizer)
                for (auto& group : s.optimizer->param_groups())
                    group.options().set_lr(lr);
            if (l.method == LlmMethod::Qat && l.qat_start_step > 0 && iteration == l.qat_start_step)
                models::set_qat_enabled(model, true);

            std::vector<data::TextBatch> micro;
            {
                prof::PhaseScope p(timer, prof::Phase::Data);
                for (std::int64_t a = 0; a < accum; ++a) {
                    const auto first = order.begin() + (k * accum + a) * s.o.batch_size;
                    micro.push_back(s.collate({first, first + s.o.batch_size}));
                }
            }
            double tokens = 0, label_tokens = 0, padded = 0, cells = 0;
            double len_max = 0, len_min = std::numeric_limits<double>::infinity(), sequences = 0;
            for (const auto& b : micro) {
                tokens += static_cast<double>(b.tokens);
                label_tokens += static_cast<double>(b.label_tokens);
                padded += static_cast<double>(b.padded_tokens);
                cells += static_cast<double>(b.input_ids.numel());
                len_max = std::max(len_max, static_cast<double>(b.max_len));
                len_min = std::min(len_min, static_cast<double>(b.min_len));
                sequences += static_cast<double>(b.input_ids.size(0));
            }

            // Allocator peak per phase (CUDA caching allocator, or the host tensor counter on
            // CPU); forward and backward repeat per micro-batch and keep their largest peak.
            const prof::PhasePeak peak(cuda_index, s.o.accounting);
            double forward_peak = kNaN, backward_peak = kNaN, optimizer_peak = kNaN;
            if (s.zero) s.zero->zero_grad();
            torch::Tensor loss_acc = torch::zeros({}, torch::kFloat64);
            double dpo_vals[4] = {0, 0, 0, 0}; // chosen, rejected, margin, accuracy (sums)
            for (std::int64_t a = 0; a < accum; ++a) {
                data::TextBatch& b = micro[static_cast<std::size_t>(a)];
                torch::Tensor ids, labels, pos, seg;
                {
                    prof::PhaseScope p(timer, prof::Phase::H2D);
                    ids = b.input_ids.to(s.o.device);
                    labels = b.labels.to(s.o.device);
                    pos = b.position_ids.to(s.o.device);
                    if (b.segment_ids.defined()) seg = b.segment_ids.to(s.o.device);
                }
                torch::Tensor loss;
                {
                    prof::PhaseScope p(timer, prof::Phase::Forward);
                    peak.begin();
                    if (dpo) {
                        const std::int64_t pairs = ids.size(0) / 2;
                        torch::Tensor ref_c, ref_r;
                        {
                            // The reference: the same model with its adapters switched off.
                            torch::NoGradGuard no_grad;
                            models::set_adapters_enabled(model, false);
                            AutocastScope autocast(s.o.precision, s.o.device);
                            const torch::Tensor logp =
                                sequence_log_probs(model.forward(ids, pos), labels);
                            models::set_adapters_enabled(model, true);
                            ref_c = logp.narrow(0, 0, pairs);
                            ref_r = logp.narrow(0, pairs, pairs);
                        }
                        AutocastScope autocast(s.o.precision, s.o.device);
                        const torch::Tensor logp =
                            sequence_log_probs(model.forward(ids, pos), labels);
                        DpoLoss d = dpo_loss(logp.narrow(0, 0, pairs), logp.narrow(0, pairs, pairs),
                                             ref_c, ref_r, l.dpo_beta, l.dpo_label_smoothing);
                        loss = d.loss / static_cast<double>(accum);
                        dpo_vals[0] += d.chosen_rewards.mean().item<double>();
                        dpo_vals[1] += d.rejected_rewards.mean().item<double>();
                        dpo_vals[2] += d.reward_margin();
                        dpo_vals[3] += d.reward_accuracy();
                        loss_acc +=
                            d.loss.detach().to(torch::kFloat64).cpu() / static_cast<double>(accum);
                    } else {
                        AutocastScope autocast(s.o.precision, s.o.device);
                        loss = causal_lm_loss_sum(model.forward(ids, pos, seg), labels);
                        if (s.control) inject_fault(*s.control, iteration, loss);
                        loss_acc += loss.detach().to(torch::kFloat64).cpu();
                    }
                    peak.end(forward_peak);
                }
                {
                    prof::PhaseScope p(timer, prof::Phase::Backward);
                    peak.begin();
                    if (a == accum - 1 && s.sync) s.sync->begin_iteration();
                    s.scaler->scale(loss).backward();
                    peak.end(backward_peak);
                }
            }

            // Exposed communication: finish the gradient allreduce (or ZeRO's reduce-scatter)
            // and, for SFT, agree on the label-token count of the global batch.
            double global_label_tokens = label_tokens;
            double comm_bytes = 0, comm_s = 0;
            Verdict verdict;
            {
                prof::PhaseScope p(timer, prof::Phase::CommWait);
                if (!dpo) {
                    torch::Tensor n = torch::full({1}, label_tokens, torch::kFloat64);
                    if (s.comm.device().is_cuda()) n = n.to(s.comm.device());
                    s.comm.allreduce(n, dist::ReduceOp::Sum);
                    global_label_tokens = n.cpu().item<double>();
                }
                // torchtune's normalisation: sum over all tokens / all label tokens. The
                // synchronizer averaged over ranks, hence the factor world / tokens.
                const double scale =
                    dpo ? 1.0 : (global_label_tokens > 0 ? s.size / global_label_tokens : 0.0);
                if (s.sync) {
                    s.sync->finish();
                    if (scale != 1.0) {
                        torch::NoGradGuard no_grad;
                        for (auto& t : s.m.trainable)
                            if (t.grad().defined()) t.mutable_grad().mul_(scale);
                    }
                } else {
                    comm_s = s.zero->reduce_gradients(scale);
                    comm_bytes = s.zero->bytes_per_iteration();
                }
                // All ranks decide together (run_control.hpp); the loss scaler handles its own
                // inf/NaN steps.
                if (s.control) {
                    bool bad = false;
                    if (!s.scaler->enabled()) {
                        bad = !std::isfinite(loss_acc.item<double>()) ||
                              (s.zero ? !s.zero->shard_gradients_finite()
                                      : !all_finite(torch::Tensor(), s.m.trainable));
                    }
                    verdict = s.control->agree(iteration, bad);
                }
            }
            if (verdict.nonfinite && !s.control->options().skip_nonfinite) {
                if (recorder) recorder->flush();
                throw_nonfinite(iteration);
            }
            const double loss_scale = s.scaler->enabled() ? s.scaler->scale_value() : kNaN;
            bool stepped = true;
            {
                prof::PhaseScope p(timer, prof::Phase::Optimizer);
                peak.begin();
                if (verdict.nonfinite) { // run.nonfinite=skip: no rank steps
                    stepped = false;
                    if (s.optimizer) s.optimizer->zero_grad(/*set_to_none=*/false);
                } else if (s.zero) {
                    s.zero->step(lr);
                } else {
                    if (s.scaler->enabled()) {
                        stepped = s.scaler->step(*s.optimizer);
                        s.scaler->update();
                    } else {
                        s.optimizer->step();
                    }
                    s.optimizer->zero_grad(/*set_to_none=*/false);
                }
                peak.end(optimizer_peak);
            }
            timer.end_iteration();
            if (window) window->end_iteration(iteration);

            // The iteration's loss: SFT = token-mean over the global batch; DPO = mean over
            // micro-batches, averaged over ranks.
            double loss_value = loss_acc.item<double>();
            {
                double v[2] = {loss_value, dpo ? 1.0 : 0.0};
                MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_SUM, s.world);
                loss_value = dpo ? v[0] / s.size
                                 : (global_label_tokens > 0 ? v[0] / global_label_tokens : kNaN);
            }
            loss_sum += loss_value;
            epoch_samples += sequences;
            ++epoch_iters;
            tokens_since_log += tokens;
            if (recorder) {
                IterationValues v;
                v.iteration = iteration;
                v.epoch = epoch;
                v.loss = loss_value;
                v.samples = dpo ? sequences / 2 : sequences;
                v.tokens = tokens;
                v.label_tokens = label_tokens;
                v.lr = lr;
                v.loss_scale = loss_scale;
                v.step_skipped = stepped ? 0.0 : 1.0;
                v.nonfinite_skipped = verdict.nonfinite ? 1.0 : 0.0;
                v.extra.assign(kExtraCount, kNaN);
                v.extra[kPaddingFraction] = cells > 0 ? padded / cells : 0.0;
                v.extra[kSeqLenMax] = len_max;
                v.extra[kSeqLenMin] = len_min;
                v.extra[kSequences] = sequences;
                if (dpo) {
                    for (int i = 0; i < 4; ++i)
                        v.extra[kDpoRewardChosen + i] = dpo_vals[i] / static_cast<double>(accum);
                }
                v.extra[kQatEnabled] =
                    l.method == LlmMethod::Qat ? (iteration >= l.qat_start_step ? 1.0 : 0.0) : kNaN;
                if (s.o.accounting) {
                    if (s.sync) {
                        const dist::IterationComm c = s.sync->last_iteration();
                        comm_bytes = c.bytes;
                        comm_s = c.collective_s;
                        if (s.on_comm) s.on_comm(c);
                    }
                    v.comm_bytes = comm_bytes;
                    v.comm_collective_s = comm_s;
                    v.memory = prof::sample_memory(cuda_index);
                    prof::fold_phase_peaks(v.memory, cuda_index,
                                           {forward_peak, backward_peak, optimizer_peak});
                    v.forward_peak_bytes = forward_peak;
                    v.backward_peak_bytes = backward_peak;
                    v.optimizer_peak_bytes = optimizer_peak;
                    double params = 0, grads = 0, state = 0;
                    for (const auto& t : s.m.trainable) {
                        params += bytes_of(t);
                        grads += bytes_of(t.grad());
                    }
                    if (s.zero) {
                        grads = s.zero->gradient_bytes();
                        state = s.zero->optimizer_state_bytes();
                    } else {
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
                } else {
                    v.comm_bytes = v.comm_collective_s = kNaN;
                    v.parameter_bytes = v.gradient_bytes = v.optimizer_state_bytes = kNaN;
                    v.memory.host_rss_bytes = v.memory.host_peak_rss_bytes = kNaN;
                }
                recorder->record_iteration(v);
                if (recorder->flush_due()) recorder->flush();
            }
            ++iteration;
            if (s.o.log_every > 0 && (iteration % s.o.log_every == 0 || iteration == total)) {
                const auto now = std::chrono::steady_clock::now();
                const double dt = std::chrono::duration<double>(now - t_log).count();
                double all_tokens = tokens_since_log;
                MPI_Allreduce(MPI_IN_PLACE, &all_tokens, 1, MPI_DOUBLE, MPI_SUM, s.world);
                std::ostringstream line;
                line << "iter " << iteration << "/" << total << "  epoch " << epoch + 1 << "/"
                     << s.o.epochs << "  loss " << std::fixed << std::setprecision(4) << loss_value
                     << "  lr " << std::scientific << std::setprecision(2) << lr << "  "
                     << std::fixed << std::setprecision(0) << (dt > 0 ? all_tokens / dt : 0.0)
                     << " tokens/s";
                if (dpo)
                    line << "  reward acc " << std::setprecision(2)
                         << dpo_vals[3] / static_cast<double>(accum);
                core::log::info() << line.str();
                t_log = now;
                logged_at = iteration;
                tokens_since_log = 0;
            }
            if (s.control) s.control->idle();
            if (verdict.checkpoint && s.checkpointer && s.checkpointer->enabled()) {
                if (recorder) recorder->flush();
                s.control->begin_activity("checkpoint write");
                const std::string dir = save_checkpoint(iteration);
                s.control->checkpoint_written();
                s.control->idle();
                core::log::info() << "checkpoint " << dir << " (resumes at iteration " << iteration
                                  << ")";
            }
            if (verdict.stop) {
                core::log::info() << "signal " << verdict.signal << " received: stopped after "
                                  << "iteration " << iteration - 1;
                s.interrupted = true;
                break;
            }
        }
        if (s.interrupted) break; // the epoch is incomplete: not recorded
        EpochValues ev;
        ev.epoch = epoch;
        ev.samples = epoch_samples;
        ev.train_loss = epoch_iters ? loss_sum / static_cast<double>(epoch_iters) : kNaN;
        ev.val_loss = ev.val_accuracy = kNaN;
        ev.epoch_s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t_epoch).count();
        if (recorder) recorder->record_epoch(ev);
    }
    (void)logged_at;
    if (recorder) recorder->flush();
}

void LlmTrainer::set_run_control(RunControl* control, Checkpointer* checkpointer) {
    s_->control = control;
    s_->checkpointer = checkpointer;
}

bool LlmTrainer::interrupted() const {
    return s_->interrupted;
}

std::string LlmTrainer::save_checkpoint(std::int64_t next_iteration) {
    State& s = *s_;
    const int cuda_index = s.o.device.is_cuda() ? s.o.device.index() : -1;
    return s.checkpointer->save(next_iteration, [&](torch::serialize::OutputArchive& out) {
        // Trainable weights, optimizer and scaler are the same on every rank: rank 0 writes them.
        // ZeRO's optimizer state is sharded: every rank writes its shard.
        if (s.rank == 0) {
            torch::serialize::OutputArchive weights, scaler;
            save_named_tensors(weights, *s.m.model, /*trainable_only=*/true);
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
        save_rng_state(out, cuda_index);
    });
}

void LlmTrainer::restore(const CheckpointManifest& m) {
    State& s = *s_;
    const int cuda_index = s.o.device.is_cuda() ? s.o.device.index() : -1;
    dist::agree_on_errors(s.world, [&] {
        torch::serialize::InputArchive mine, first;
        Checkpointer::load(m, s.rank, mine);
        torch::serialize::InputArchive* from = &mine;
        if (s.rank != 0) {
            Checkpointer::load(m, 0, first);
            from = &first;
        }
        torch::serialize::InputArchive weights, scaler;
        from->read("weights", weights);
        from->read("scaler", scaler);
        load_named_tensors(weights, *s.m.model, m.path, /*trainable_only=*/true);
        s.scaler->load(scaler);
        if (s.optimizer) {
            torch::serialize::InputArchive optimizer;
            from->read("optimizer", optimizer);
            s.optimizer->load(optimizer);
        }
        if (s.zero) {
            torch::serialize::InputArchive shard;
            mine.read("zero_shard", shard);
            s.zero->load(shard);
        }
        load_rng_state(mine, cuda_index);
        s.start_iteration = read_int(mine, "next_iteration");
    });
    const LlmOptions& l = s.o.llm;
    if (l.method == LlmMethod::Qat && l.qat_start_step > 0 && s.start_iteration >= l.qat_start_step)
        models::set_qat_enabled(*s.m.model, true); // the run had switched it on before the stop
}

std::string LlmTrainer::save_adapters(const std::string& path) {
    State& s = *s_;
    if (path.empty()) return "";
    auto params = models::lora_parameters(*s.m.model);
    if (params.empty()) return "";
    if (s.rank == 0) {
        // PEFT's names: base_model.model.<HF module path>.lora_A.weight / lora_B.weight.
        std::vector<std::pair<std::string, torch::Tensor>> out;
        for (auto& [name, t] : params) {
            std::string n = name;
            const bool a = n.size() > 7 && n.compare(n.size() - 7, 7, ".lora_a") == 0;
            const bool b = n.size() > 7 && n.compare(n.size() - 7, 7, ".lora_b") == 0;
            if (a || b) n = n.substr(0, n.size() - 7) + (a ? ".lora_A.weight" : ".lora_B.weight");
            const bool head = n.rfind("lm_head", 0) == 0;
            out.emplace_back("base_model.model." + std::string(head ? "" : "model.") + n,
                             t.detach().cpu());
        }
        const LlmOptions& l = s.o.llm;
        std::string targets;
        for (const auto& t : l.lora.targets)
            targets += (targets.empty() ? "" : ",") + t;
        models::save_safetensors(path, out,
                                 {{"format", "pt"},
                                  {"producer", "trainscope"},
                                  {"lora_rank", std::to_string(l.lora.rank)},
                                  {"lora_alpha", std::to_string(l.lora.alpha)},
                                  {"lora_targets", targets}});
    }
    return path;
}

} // namespace trainscope::train
