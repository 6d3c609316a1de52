#include "trainscope/train/llm_loss.hpp"

namespace trainscope::train {

namespace F = torch::nn::functional;

namespace {
// The loss is computed in at least fp32 (bf16/fp16 logits are upcast, as torchtune does); fp64
// runs keep fp64, so that their losses are exact enough to compare across rank counts.
torch::Tensor loss_precision(const torch::Tensor& logits) {
    return logits.scalar_type() == torch::kFloat64 ? logits : logits.to(torch::kFloat32);
}
} // namespace

torch::Tensor causal_lm_loss_sum(const torch::Tensor& logits, const torch::Tensor& labels) {
    // Shift the labels, not the logits (as torchtune): position t is scored against label t + 1
    // and the last position against -100, so the [B, T, V] logits are used in place (a view),
    // never copied.
    const auto v = logits.size(-1);
    const torch::Tensor shifted =
        torch::cat({labels.narrow(1, 1, labels.size(1) - 1),
                    torch::full({labels.size(0), 1}, kIgnoreIndex, labels.options())},
                   1);
    return F::cross_entropy(
        loss_precision(logits).reshape({-1, v}), shifted.reshape({-1}),
        F::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));
}

std::int64_t count_label_tokens(const torch::Tensor& labels) {
    if (labels.size(1) < 2) return 0;
    return labels.narrow(1, 1, labels.size(1) - 1).ne(kIgnoreIndex).sum().item<std::int64_t>();
}

torch::Tensor sequence_log_probs(const torch::Tensor& logits, const torch::Tensor& labels) {
    torch::Tensor shifted_logits = loss_precision(logits.narrow(1, 0, logits.size(1) - 1));
    torch::Tensor shifted_labels = labels.narrow(1, 1, labels.size(1) - 1);
    const torch::Tensor mask = shifted_labels.ne(kIgnoreIndex);
    // Masked positions gather index 0 and are zeroed by the mask.
    const torch::Tensor index = shifted_labels.masked_fill(~mask, 0).unsqueeze(-1);
    torch::Tensor per_token = shifted_logits.log_softmax(-1).gather(-1, index).squeeze(-1);
    return (per_token * mask.to(per_token.scalar_type())).sum(-1);
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
