// Losses of LLM fine-tuning, as torchtune computes them (in fp32 from the model's logits).
#pragma once

#include <torch/torch.h>

#include "trainscope/models/llama.hpp"

namespace trainscope::train {

constexpr std::int64_t kIgnoreIndex = -100; // label of masked and padded tokens

// torchtune's default number of output chunks (CEWithChunkedOutputLoss, llm.loss_chunks).
constexpr std::int64_t kDefaultLossChunks = 8;

// What a causal LM's logits are scored for: the summed token cross-entropy (SFT) or each
// sequence's summed label-token log-probability (DPO).
enum class LmScore { TokenLossSum, SequenceLogProbs };

// labels[:, 1:] followed by one -100 per row: the label each position t is scored against.
torch::Tensor shift_labels(const torch::Tensor& labels);

// The score of logits [B, t, V] against shifted labels [B, t], in at least fp32 (the logits are
// upcast here, as torchtune does; fp64 stays fp64): a scalar for TokenLossSum, [B] for
// SequenceLogProbs.
torch::Tensor score_logits(const torch::Tensor& logits, const torch::Tensor& shifted_labels,
                           LmScore kind);

// The head (model.project) and the score of the final hidden states [B, T, H], in `chunks` chunks
// of tokens along T (as torch.chunk: ceil(T / chunks) positions each) so that one chunk's logits
// exist at a time: torchtune's CEWithChunkedOutputLoss upcasts one chunk at a time but keeps every
// chunk's fp32 log-softmax for backward; here each chunk's gradients are computed in forward and
// its logits freed (the score is linear in the incoming gradient; backward only scales what was
// kept), so the step holds one chunk of logits and projects the head twice, as unchunked. Only
// sequence log-probs through a trainable head and fp16 (the loss scale) recompute each chunk in
// backward instead, under the forward's autocast and RNG state (recompute.hpp): a third projection.
// Without grad the chunks are scored in turn. chunks <= 1: model.head() and one score, as before.
// Equal to score_logits(model.head(hidden), shift_labels(labels), kind) up to summation order.
torch::Tensor head_score(models::LlamaForCausalLMImpl& model, const torch::Tensor& hidden,
                         const torch::Tensor& labels, LmScore kind, std::int64_t chunks);

// Sum over the batch of the token cross-entropies where the shifted label is not -100: logits
// [B, T, V] at position t predict labels [B, T] at t + 1. The caller divides by the number of
// label tokens over all micro-batches and ranks (torchtune's normalisation), so that gradient
// accumulation and data parallelism give the same update as one big batch.
torch::Tensor causal_lm_loss_sum(const torch::Tensor& logits, const torch::Tensor& labels);

// Label tokens after the shift: (labels[:, 1:] != -100).sum().
std::int64_t count_label_tokens(const torch::Tensor& labels);

// Per-sequence sum of the log-probabilities of the shifted label tokens: [B] fp32.
torch::Tensor sequence_log_probs(const torch::Tensor& logits, const torch::Tensor& labels);

// DPO (Rafailov et al. 2023) with conservative label smoothing (torchtune's DPOLoss):
//   z = (pi_chosen - pi_rejected) - (ref_chosen - ref_rejected)
//   loss_i = -logsigmoid(beta z)(1 - eps) - logsigmoid(-beta z) eps, loss = mean_i loss_i
//   rewards = beta (pi - ref) per example, detached.
struct DpoLoss {
    torch::Tensor loss;             // scalar
    torch::Tensor chosen_rewards;   // [B]
    torch::Tensor rejected_rewards; // [B]
    double reward_accuracy() const; // mean(chosen_rewards > rejected_rewards)
    double reward_margin() const;   // mean(chosen_rewards - rejected_rewards)
};
DpoLoss dpo_loss(const torch::Tensor& policy_chosen, const torch::Tensor& policy_rejected,
                 const torch::Tensor& reference_chosen, const torch::Tensor& reference_rejected,
                 double beta, double label_smoothing);

} // namespace trainscope::train
