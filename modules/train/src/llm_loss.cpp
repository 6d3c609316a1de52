#include "trainscope/train/llm_loss.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "trainscope/models/recompute.hpp"

namespace trainscope::train {

namespace F = torch::nn::functional;

namespace {
// The loss is computed in at least fp32 (bf16/fp16 logits are upcast, as torchtune does); fp64
// runs keep fp64, so that their losses are exact enough to compare across rank counts.
torch::Tensor loss_precision(const torch::Tensor& logits) {
    return logits.scalar_type() == torch::kFloat64 ? logits : logits.to(torch::kFloat32);
}
} // namespace

torch::Tensor shift_labels(const torch::Tensor& labels) {
    return torch::cat({labels.narrow(1, 1, labels.size(1) - 1),
                       torch::full({labels.size(0), 1}, kIgnoreIndex, labels.options())},
                      1);
}

torch::Tensor score_logits(const torch::Tensor& logits, const torch::Tensor& shifted_labels,
                           LmScore kind) {
    const torch::Tensor x = loss_precision(logits);
    if (kind == LmScore::TokenLossSum)
        return F::cross_entropy(
            x.reshape({-1, x.size(-1)}), shifted_labels.reshape({-1}),
            F::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));
    const torch::Tensor mask = shifted_labels.ne(kIgnoreIndex);
    // Masked positions gather index 0 and are zeroed by the mask.
    const torch::Tensor index = shifted_labels.masked_fill(~mask, 0).unsqueeze(-1);
    torch::Tensor per_token = x.log_softmax(-1).gather(-1, index).squeeze(-1);
    return (per_token * mask.to(per_token.scalar_type())).sum(-1);
}

torch::Tensor causal_lm_loss_sum(const torch::Tensor& logits, const torch::Tensor& labels) {
    // Shift the labels, not the logits (as torchtune): position t is scored against label t + 1
    // and the last position against -100, so the [B, T, V] logits are used in place (a view),
    // never copied.
    return score_logits(logits, shift_labels(labels), LmScore::TokenLossSum);
}

std::int64_t count_label_tokens(const torch::Tensor& labels) {
    if (labels.size(1) < 2) return 0;
    return labels.narrow(1, 1, labels.size(1) - 1).ne(kIgnoreIndex).sum().item<std::int64_t>();
}

torch::Tensor sequence_log_probs(const torch::Tensor& logits, const torch::Tensor& labels) {
    return score_logits(logits, shift_labels(labels), LmScore::SequenceLogProbs);
}

namespace {

// Token chunks along T as torch.chunk makes them: [begin, length) pairs of ceil(T / chunks).
std::vector<std::pair<std::int64_t, std::int64_t>> token_chunks(std::int64_t T,
                                                                std::int64_t chunks) {
    const std::int64_t size = std::max<std::int64_t>(1, (T + chunks - 1) / chunks);
    std::vector<std::pair<std::int64_t, std::int64_t>> out;
    for (std::int64_t b = 0; b < T; b += size)
        out.emplace_back(b, std::min(size, T - b));
    return out;
}

// The chunked head and score with recomputation in backward (see head_score).
struct ChunkedHeadScore : torch::autograd::Function<ChunkedHeadScore> {
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor hidden,
                                 torch::Tensor shifted, models::LlamaForCausalLMImpl* model,
                                 std::int64_t kind, std::int64_t chunks) {
        ctx->save_for_backward({hidden, shifted});
        ctx->saved_data["model"] = reinterpret_cast<std::int64_t>(model);
        ctx->saved_data["kind"] = kind;
        ctx->saved_data["chunks"] = chunks;
        torch::NoGradGuard no_grad;
        torch::Tensor total;
        std::int64_t i = 0;
        for (const auto& [b, n] : token_chunks(hidden.size(1), chunks)) {
            // Each chunk's own state: the recomputation draws what this chunk drew.
            models::save_recompute_state(ctx, hidden.device(), std::to_string(i++));
            torch::Tensor s = score_logits(model->project(hidden.narrow(1, b, n)),
                                           shifted.narrow(1, b, n), static_cast<LmScore>(kind));
            total = total.defined() ? total + s : s;
        }
        model->end_head_forward();
        return total;
    }
    static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::tensor_list grads) {
        auto* model =
            reinterpret_cast<models::LlamaForCausalLMImpl*>(ctx->saved_data["model"].toInt());
        const auto kind = static_cast<LmScore>(ctx->saved_data["kind"].toInt());
        const auto saved = ctx->get_saved_variables();
        const torch::Tensor& hidden = saved[0];
        const torch::Tensor& shifted = saved[1];
        model->begin_head_backward();
        std::vector<torch::Tensor> parts;
        std::int64_t i = 0;
        for (const auto& [b, n] : token_chunks(hidden.size(1), ctx->saved_data["chunks"].toInt())) {
            torch::Tensor h = hidden.narrow(1, b, n).detach().requires_grad_(true);
            torch::Tensor s;
            {
                models::RecomputeScope recompute(ctx, hidden.device(), std::to_string(i++));
                s = score_logits(model->project(h), shifted.narrow(1, b, n), kind);
            }
            torch::autograd::backward({s}, {grads[0]});
            parts.push_back(h.grad());
        }
        return {torch::cat(parts, 1), torch::Tensor(), torch::Tensor(), torch::Tensor(),
                torch::Tensor()};
    }
};

} // namespace

torch::Tensor head_score(models::LlamaForCausalLMImpl& model, const torch::Tensor& hidden,
                         const torch::Tensor& labels, LmScore kind, std::int64_t chunks) {
    const torch::Tensor shifted = shift_labels(labels);
    if (chunks <= 1) return score_logits(model.head(hidden), shifted, kind);
    if (!torch::GradMode::is_enabled()) {
        torch::Tensor total;
        for (const auto& [b, n] : token_chunks(hidden.size(1), chunks)) {
            torch::Tensor s =
                score_logits(model.project(hidden.narrow(1, b, n)), shifted.narrow(1, b, n), kind);
            total = total.defined() ? total + s : s;
        }
        model.end_head_forward();
        return total;
    }
    // The head's own parameters train even where nothing before it does (LoRA on lm_head only):
    // the function's output must require grad for its backward to run.
    torch::Tensor h = hidden.requires_grad() ? hidden : hidden.detach().requires_grad_(true);
    return ChunkedHeadScore::apply(h, shifted, &model, static_cast<std::int64_t>(kind), chunks);
}

double DpoLoss::reward_accuracy() const {
    return chosen_rewards.gt(rejected_rewards).to(torch::kFloat64).mean().item<double>();
}

double DpoLoss::reward_margin() const {
    return (chosen_rewards - rejected_rewards).to(torch::kFloat64).mean().item<double>();
}

DpoLoss dpo_loss(const torch::Tensor& policy_chosen, const torch::Tensor& policy_rejected,
                 const torch::Tensor& reference_chosen, const torch::Tensor& reference_rejected,
                 double beta, double label_smoothing) {
    const torch::Tensor z =
        (policy_chosen - policy_rejected) - (reference_chosen - reference_rejected);
    const torch::Tensor losses = -F::logsigmoid(beta * z) * (1.0 - label_smoothing) -
                                 F::logsigmoid(-beta * z) * label_smoothing;
    DpoLoss out;
    out.loss = losses.mean();
    out.chosen_rewards = (beta * (policy_chosen - reference_chosen)).detach();
    out.rejected_rewards = (beta * (policy_rejected - reference_rejected)).detach();
    return out;
}

} // namespace trainscope::train
