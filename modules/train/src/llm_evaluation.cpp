// LlmTrainer, the parts after the step: the deferred losses resolved over ranks, validation,
// the per-token FLOPs and the workload's extra columns.
#include <iomanip>
#include <sstream>

#include "llm_trainer_state.hpp"
#include "trainscope/models/lora.hpp"
#include "trainscope/train/host_sync.hpp"
#include "trainscope/train/llm_loss.hpp"

namespace trainscope::train {

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
    // NCCL: this allreduce started after the loop's bounded synchronize; the read must not wait
    // for a peer that stalled since in the CUDA driver (the iteration watchdog), but dist.timeout.
    s.comm.synchronize("the loss allreduce");
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
                ref = head_score(model, model.hidden_states(ids, pos), labels,
                                 LmScore::SequenceLogProbs, l.loss_chunks);
                models::set_adapters_enabled(model, true);
            }
            AutocastScope autocast(s.o.precision, s.o.device);
            const torch::Tensor logp = head_score(model, model.hidden_states(ids, pos), labels,
                                                  LmScore::SequenceLogProbs, l.loss_chunks);
            const DpoLoss d = dpo_loss(logp.narrow(0, 0, pairs), logp.narrow(0, pairs, pairs),
                                       ref.narrow(0, 0, pairs), ref.narrow(0, pairs, pairs),
                                       l.dpo_beta, l.dpo_label_smoothing);
            loss_sum = d.loss.to(torch::kFloat64).item<double>() * static_cast<double>(pairs);
            correct = d.reward_accuracy() * static_cast<double>(pairs);
            count = static_cast<double>(pairs);
        } else {
            AutocastScope autocast(s.o.precision, s.o.device);
            loss_sum = head_score(model, model.hidden_states(ids, pos), labels,
                                  LmScore::TokenLossSum, l.loss_chunks)
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

} // namespace trainscope::train
