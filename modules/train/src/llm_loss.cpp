#include "trainscope/train/llm_loss.hpp"

#include <ATen/autocast_mode.h>

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

// Token chunks along T as torch.chunk makes them: [begin, length) pairs of ceil(T / chunks). Each
// chunk of the hidden states is made contiguous before the projection: a strided [B, n, H] slice
// makes matmul fall back to bmm over the weight expanded per sequence (4x slower on CPU).
std::vector<std::pair<std::int64_t, std::int64_t>> token_chunks(std::int64_t T,
                                                                std::int64_t chunks) {
    const std::int64_t size = std::max<std::int64_t>(1, (T + chunks - 1) / chunks);
    std::vector<std::pair<std::int64_t, std::int64_t>> out;
    for (std::int64_t b = 0; b < T; b += size)
        out.emplace_back(b, std::min(size, T - b));
    return out;
}

// One chunk's score with a graph: the head projected from `h` (a leaf that requires grad), in
// the current autocast state.
torch::Tensor chunk_score(models::LlamaForCausalLMImpl& model, const torch::Tensor& h,
                          const torch::Tensor& shifted, LmScore kind) {
    torch::AutoGradMode enable(true);
    return score_logits(model.project(h), shifted, kind);
}

// The gradients of a chunk's score `s` with respect to its hidden states `h` and the head's
// trainable parameters, times grad_output (undefined: 1), without autocast (as a backward pass
// outside torch.autocast); parameter gradients are added into param_grads.
torch::Tensor chunk_grads(const torch::Tensor& s, const torch::Tensor& h,
                          const std::vector<torch::Tensor>& params,
                          const torch::Tensor& grad_output,
                          std::vector<torch::Tensor>& param_grads) {
    models::NoAutocast no_autocast(h.device());
    std::vector<torch::Tensor> inputs = {h};
    inputs.insert(inputs.end(), params.begin(), params.end());
    std::vector<torch::Tensor> g = torch::autograd::grad(
        {s}, inputs, {grad_output.defined() ? grad_output : torch::ones_like(s)},
        /*retain_graph=*/false, /*create_graph=*/false, /*allow_unused=*/true);
    for (std::size_t k = 0; k < params.size(); ++k) {
        const torch::Tensor& gk = g[k + 1];
        if (!gk.defined()) continue;
        if (param_grads[k].defined())
            param_grads[k].add_(gk);
        else
            param_grads[k] = gk;
    }
    return g[0];
}

// The chunked head and score (see head_score). The head's trainable parameters are inputs of the
// function, so that their gradient, summed over the chunks, is accumulated once per backward as
// for an unchunked head (DDP's post-accumulate hooks and FSDP's unit hooks see one gradient;
// accumulating per chunk would fire them once per chunk).
//   Eager (the SFT loss; sequence log-probs where the head is frozen): forward computes each
//   chunk's gradients at once (the score is linear in the incoming gradient: a scalar, or one
//   factor per sequence, whose rows a chunk's rows belong to), keeps d score / d hidden and the
//   head parameters' summed gradient, and frees the chunk's logits; backward only scales them.
//   The head is projected once forward and once backward, as unchunked (fused linear
//   cross-entropy).
//   Recomputing (sequence log-probs with a trainable head: per-sequence factors do not scale a
//   parameter gradient summed over sequences; and fp16, whose gradients need the loss scale the
//   incoming gradient carries): forward scores without a graph; backward recomputes each chunk
//   under the forward's autocast and RNG state and back-propagates it.
struct ChunkedHeadScore : torch::autograd::Function<ChunkedHeadScore> {
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor hidden,
                                 torch::Tensor shifted, models::LlamaForCausalLMImpl* model,
                                 std::int64_t kind, std::int64_t chunks, at::TensorList params) {
        const auto k = static_cast<LmScore>(kind);
        // fp16 (fp16-mixed's autocast, or fp16 weights) recomputes too: eager gradients would
        // miss the loss scale, which keeps fp16 gradients from underflowing.
        const auto type = hidden.device().type();
        const bool fp16 = hidden.scalar_type() == torch::kHalf ||
                          (at::autocast::is_autocast_enabled(type) &&
                           at::autocast::get_autocast_dtype(type) == at::kHalf);
        const bool eager = (k == LmScore::TokenLossSum || params.empty()) && !fp16;
        const std::vector<torch::Tensor> ps(params.begin(), params.end());
        ctx->saved_data["model"] = reinterpret_cast<std::int64_t>(model);
        ctx->saved_data["kind"] = kind;
        ctx->saved_data["chunks"] = chunks;
        ctx->saved_data["eager"] = eager;
        ctx->saved_data["params"] = static_cast<std::int64_t>(ps.size());
        torch::Tensor total;
        auto add = [&](const torch::Tensor& s) { total = total.defined() ? total + s : s; };
        if (eager) {
            torch::Tensor grad_hidden = torch::empty_like(hidden);
            std::vector<torch::Tensor> param_grads(ps.size());
            for (const auto& [b, n] : token_chunks(hidden.size(1), chunks)) {
                torch::Tensor h = hidden.narrow(1, b, n).detach().contiguous().requires_grad_(true);
                const torch::Tensor s = chunk_score(*model, h, shifted.narrow(1, b, n), k);
                add(s.detach());
                grad_hidden.narrow(1, b, n).copy_(chunk_grads(s, h, ps, {}, param_grads));
            }
            std::vector<torch::Tensor> saved = {grad_hidden};
            for (auto& g : param_grads) // a parameter without gradient: zeros
                saved.push_back(g);
            ctx->save_for_backward(saved);
        } else {
            std::vector<torch::Tensor> saved = {hidden, shifted};
            saved.insert(saved.end(), ps.begin(), ps.end());
            ctx->save_for_backward(saved);
            // One state for all chunks: backward recomputes them in this order from it, so each
            // draws what it drew here (LoRA dropout on lm_head).
            models::save_recompute_state(ctx, hidden.device());
            torch::NoGradGuard no_grad;
            for (const auto& [b, n] : token_chunks(hidden.size(1), chunks))
                add(score_logits(model->project(hidden.narrow(1, b, n).contiguous()),
                                 shifted.narrow(1, b, n), k));
        }
        return total;
    }
    static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::tensor_list grads) {
        auto* model =
            reinterpret_cast<models::LlamaForCausalLMImpl*>(ctx->saved_data["model"].toInt());
        const auto kind = static_cast<LmScore>(ctx->saved_data["kind"].toInt());
        const auto saved = ctx->get_saved_variables();
        const auto nparams = static_cast<std::size_t>(ctx->saved_data["params"].toInt());
        model->begin_head_backward();
        torch::autograd::tensor_list out = {torch::Tensor(), torch::Tensor(), torch::Tensor(),
                                            torch::Tensor(), torch::Tensor()};
        const torch::Tensor& go = grads[0];
        if (ctx->saved_data["eager"].toBool()) {
            // d score / d hidden times the incoming gradient: a scalar, or one per sequence.
            const torch::Tensor factor =
                kind == LmScore::TokenLossSum ? go : go.reshape({-1, 1, 1});
            out[0] = saved[0] * factor.to(saved[0].scalar_type());
            for (std::size_t k = 0; k < nparams; ++k)
                out.push_back(saved[k + 1].defined()
                                  ? saved[k + 1] * go.to(saved[k + 1].scalar_type())
                                  : torch::Tensor());
            return out;
        }
        const torch::Tensor& hidden = saved[0];
        const torch::Tensor& shifted = saved[1];
        const std::vector<torch::Tensor> params(saved.begin() + 2, saved.end());
        std::vector<torch::Tensor> parts, param_grads(params.size());
        using Part = models::RecomputeScope::Part;
        models::RecomputeScope rng(ctx, hidden.device(), "", Part::Rng);
        for (const auto& [b, n] : token_chunks(hidden.size(1), ctx->saved_data["chunks"].toInt())) {
            torch::Tensor h = hidden.narrow(1, b, n).contiguous().detach().requires_grad_(true);
            torch::Tensor s;
            {
                models::RecomputeScope recompute(ctx, hidden.device(), "", Part::Autocast);
                s = chunk_score(*model, h, shifted.narrow(1, b, n), kind);
            }
            parts.push_back(chunk_grads(s, h, params, go, param_grads));
        }
        out[0] = torch::cat(parts, 1);
        out.insert(out.end(), param_grads.begin(), param_grads.end());
        return out;
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
            torch::Tensor s = score_logits(model.project(hidden.narrow(1, b, n).contiguous()),
                                           shifted.narrow(1, b, n), kind);
            total = total.defined() ? total + s : s;
        }
        model.end_head_forward();
        return total;
    }
    // The function's output requires grad if the hidden states or a head parameter do; where
    // neither does (nothing trains: gradients are still asked for), a detached copy does.
    std::vector<torch::Tensor> params;
    for (const torch::Tensor& p : model.head_parameters())
        if (p.requires_grad()) params.push_back(p);
    torch::Tensor h =
        hidden.requires_grad() || !params.empty() ? hidden : hidden.detach().requires_grad_(true);
    torch::Tensor total = ChunkedHeadScore::apply(
        h, shifted, &model, static_cast<std::int64_t>(kind), chunks, at::TensorList(params));
    // Here, not in the function's forward, which autograd runs without grad: FSDP's after_forward
    // must see grad mode on, or it takes this for a forward without backward (DPO's reference)
    // and neither reduces the head's gradients nor keeps a tied embedding gathered.
    model.end_head_forward();
    return total;
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
