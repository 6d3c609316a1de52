// LLM training arithmetic: the SFT token loss and DPO loss against formulas evaluated here with
// plain loops, the --dry-run memory plan against the parameter arithmetic of Llama-3-8B, and the
// seeded validation split (llm.val_fraction).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cmath>
#include <iostream>
#include <map>
#include <string>

#include "llama_test_util.hpp"
#include "trainscope/models/llama.hpp"
#include "trainscope/models/lora.hpp"
#include "trainscope/prof/memory.hpp"
#include "trainscope/train/llm_loss.hpp"
#include "trainscope/train/llm_memory.hpp"
#include "trainscope/train/llm_trainer.hpp"

namespace tt = trainscope::train;
namespace dist = trainscope::dist;

namespace {

// -log softmax(row)[k] in double, by hand.
double nll(const std::vector<double>& row, std::int64_t k) {
    double mx = row[0];
    for (double v : row)
        mx = std::max(mx, v);
    double z = 0;
    for (double v : row)
        z += std::exp(v - mx);
    return -(row[static_cast<std::size_t>(k)] - mx - std::log(z));
}

double log_sigmoid(double x) {
    return -std::log1p(std::exp(-x));
}

} // namespace

TEST(LlmLoss, TokenSumShiftsAndSkipsMaskedLabels) {
    torch::manual_seed(3);
    const std::int64_t B = 2, T = 5, V = 7;
    torch::Tensor logits = torch::randn({B, T, V}, torch::kFloat64);
    torch::Tensor labels =
        torch::tensor({{4, 1, -100, 6, 2}, {0, -100, -100, 3, 5}}, torch::kInt64);
    double expected = 0;
    std::int64_t counted = 0;
    for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t t = 0; t + 1 < T; ++t) {
            const std::int64_t y = labels[b][t + 1].item<std::int64_t>();
            if (y == -100) continue;
            std::vector<double> row(V);
            for (std::int64_t v = 0; v < V; ++v)
                row[v] = logits[b][t][v].item<double>();
            expected += nll(row, y);
            ++counted;
        }
    EXPECT_EQ(tt::count_label_tokens(labels), counted);
    EXPECT_EQ(counted, 5);
    EXPECT_NEAR(tt::causal_lm_loss_sum(logits, labels).item<double>(), expected, 1e-5);

    // Per-sequence log-probabilities: minus the per-row share of the same sum.
    const torch::Tensor lp = tt::sequence_log_probs(logits, labels);
    double row0 = 0;
    for (std::int64_t t = 0; t + 1 < T; ++t) {
        const std::int64_t y = labels[0][t + 1].item<std::int64_t>();
        if (y == -100) continue;
        std::vector<double> row(V);
        for (std::int64_t v = 0; v < V; ++v)
            row[v] = logits[0][t][v].item<double>();
        row0 -= nll(row, y);
    }
    EXPECT_NEAR(lp[0].item<double>(), row0, 1e-5);
    EXPECT_NEAR(lp.sum().item<double>(), -expected, 1e-5);
}

TEST(LlmLoss, DpoMatchesTheFormulaWithAndWithoutLabelSmoothing) {
    const auto f64 = torch::kFloat64;
    torch::Tensor pc = torch::tensor({-1.0, -2.0, -4.0}, f64);
    torch::Tensor pr = torch::tensor({-3.0, -1.5, -3.5}, f64);
    torch::Tensor rc = torch::tensor({-1.5, -2.5, -3.0}, f64);
    torch::Tensor rr = torch::tensor({-2.5, -2.0, -3.0}, f64);
    for (double eps : {0.0, 0.2}) {
        const double beta = 0.1;
        double expected = 0;
        std::vector<double> z(3);
        for (int i = 0; i < 3; ++i) {
            z[i] = (pc[i].item<double>() - pr[i].item<double>()) -
                   (rc[i].item<double>() - rr[i].item<double>());
            expected += -log_sigmoid(beta * z[i]) * (1 - eps) - log_sigmoid(-beta * z[i]) * eps;
        }
        expected /= 3;
        const tt::DpoLoss d = tt::dpo_loss(pc, pr, rc, rr, beta, eps);
        EXPECT_NEAR(d.loss.item<double>(), expected, 1e-12) << "label smoothing " << eps;
        // Rewards beta (pi - ref): chosen 0.05, 0.05, -0.1; rejected -0.05, 0.05, -0.05.
        EXPECT_NEAR(d.chosen_rewards[2].item<double>(), -0.1, 1e-12);
        EXPECT_NEAR(d.rejected_rewards[0].item<double>(), -0.05, 1e-12);
        EXPECT_NEAR(d.reward_accuracy(), 1.0 / 3.0, 1e-12); // only the first pair is ahead
        EXPECT_NEAR(d.reward_margin(), (0.1 + 0.0 - 0.05) / 3.0, 1e-12);
    }
}

TEST(LlmLoss, DpoGradientPushesChosenUpAndRejectedDown) {
    torch::Tensor pc = torch::tensor({-2.0}, torch::requires_grad());
    torch::Tensor pr = torch::tensor({-2.0}, torch::requires_grad());
    const torch::Tensor ref = torch::tensor({-2.0});
    tt::dpo_loss(pc, pr, ref, ref, 0.1, 0.0).loss.backward();
    // d/dpc of -logsigmoid(beta z) at z = 0 is -beta/2.
    EXPECT_NEAR(pc.grad().item<double>(), -0.05, 1e-7);
    EXPECT_NEAR(pr.grad().item<double>(), 0.05, 1e-7);
}

namespace {

// Loss (or weighted per-sequence log-probabilities) and every parameter's gradient of one forward
// and backward through the model's head_score with `chunks` chunks.
struct HeadRun {
    torch::Tensor value;
    std::map<std::string, torch::Tensor> grads;
};
HeadRun run_head(trainscope::models::LlamaForCausalLMImpl& model, const torch::Tensor& ids,
                 const torch::Tensor& labels, tt::LmScore kind, std::int64_t chunks) {
    for (auto& p : model.parameters())
        p.mutable_grad() = torch::Tensor();
    torch::Tensor v = tt::head_score(model, model.hidden_states(ids), labels, kind, chunks);
    // Per-sequence values get distinct weights, so that each sequence's gradient is checked.
    torch::Tensor w = torch::arange(1, v.numel() + 1, v.options());
    (v * w).sum().backward();
    HeadRun r{v.detach(), {}};
    for (const auto& p : model.named_parameters())
        if (p.value().grad().defined()) r.grads[p.key()] = p.value().grad().clone();
    return r;
}

} // namespace

// llm.loss_chunks: the chunked head (projection + score per token chunk)
// gives the unchunked loss and gradients, for the SFT token loss and DPO's sequence log-probs, an
// uneven split (T = 7 in 3 chunks of 3, 3, 1), masked labels, a tied and an untied head with
// LoRA on lm_head, trainable and frozen (both of the function's paths: gradients computed in
// forward, and recomputation in backward), in fp64 (1e-12) and under bf16 autocast (equal to
// the unchunked bf16 run to bf16 rounding of the sums).
TEST(LlmLoss, ChunkedHeadEqualsTheUnchunkedLossAndGradients) {
    namespace models = trainscope::models;
    for (const bool tied : {false, true}) {
        models::LlamaConfig c = trainscope::testing::small_llama();
        c.tie_word_embeddings = tied;
        torch::manual_seed(11);
        models::LlamaForCausalLM model(c, torch::TensorOptions().dtype(torch::kFloat64));
        if (!tied) {
            models::LoraOptions lo;
            lo.rank = 4;
            lo.alpha = 8;
            lo.targets = {"q_proj", "v_proj", "lm_head"};
            models::apply_lora(*model, lo);
            for (auto& p : model->parameters())
                p.requires_grad_(true); // base weights train too: every gradient is compared
        }
        const torch::Tensor ids = torch::randint(c.vocab_size, {2, 7});
        torch::Tensor labels = ids.clone();
        labels.index_put_({0, torch::indexing::Slice(0, 3)}, tt::kIgnoreIndex);
        labels.index_put_({1, 5}, tt::kIgnoreIndex);
        for (const tt::LmScore kind : {tt::LmScore::TokenLossSum, tt::LmScore::SequenceLogProbs}) {
            const HeadRun whole = run_head(*model, ids, labels, kind, 1);
            const HeadRun chunked = run_head(*model, ids, labels, kind, 3);
            ASSERT_EQ(whole.grads.size(), chunked.grads.size());
            EXPECT_LT((whole.value - chunked.value).abs().max().item<double>(), 1e-12);
            for (const auto& [name, g] : whole.grads)
                EXPECT_LT((g - chunked.grads.at(name)).abs().max().item<double>(), 1e-12)
                    << name << (tied ? " tied" : " untied");
            // More chunks than positions: one position per chunk.
            EXPECT_LT((whole.value - run_head(*model, ids, labels, kind, 50).value)
                          .abs()
                          .max()
                          .item<double>(),
                      1e-12);
        }
        // Each head parameter accumulates one gradient per backward, however many chunks (DDP's
        // post-accumulate hooks would otherwise fire once per chunk).
        struct Count final : torch::autograd::PostAccumulateGradHook {
            int* n;
            explicit Count(int* c) : n(c) {}
            void operator()(const torch::autograd::Variable&) override { ++*n; }
        };
        const std::vector<torch::Tensor> head = model->head_parameters();
        ASSERT_EQ(head.size(), tied ? 1u : 3u); // tied: the embedding; else base, lora_a, lora_b
        std::vector<int> fired(head.size(), 0);
        for (std::size_t k = 0; k < head.size(); ++k)
            torch::autograd::impl::set_post_acc_grad_hooks(head[k],
                                                           std::make_unique<Count>(&fired[k]));
        run_head(*model, ids, labels, tt::LmScore::TokenLossSum, 3);
        for (std::size_t k = 0; k < head.size(); ++k) {
            EXPECT_EQ(fired[k], 1) << "head parameter " << k;
            torch::autograd::impl::set_post_acc_grad_hooks(head[k], nullptr);
        }
        // DPO's case: sequence log-probs through a frozen head (forward computes the chunks'
        // gradients at once; backward scales them per sequence).
        for (const auto& p : model->head_parameters())
            const_cast<torch::Tensor&>(p).requires_grad_(false);
        {
            const HeadRun whole = run_head(*model, ids, labels, tt::LmScore::SequenceLogProbs, 1);
            const HeadRun chunked = run_head(*model, ids, labels, tt::LmScore::SequenceLogProbs, 3);
            ASSERT_EQ(whole.grads.size(), chunked.grads.size());
            EXPECT_LT((whole.value - chunked.value).abs().max().item<double>(), 1e-12);
            for (const auto& [name, g] : whole.grads)
                EXPECT_LT((g - chunked.grads.at(name)).abs().max().item<double>(), 1e-12)
                    << name << " (frozen head)";
        }
        for (const auto& p : model->head_parameters())
            const_cast<torch::Tensor&>(p).requires_grad_(true);
        // The unchunked helpers score the same as head_score.
        EXPECT_NEAR(
            tt::causal_lm_loss_sum(model->forward(ids), labels).item<double>(),
            run_head(*model, ids, labels, tt::LmScore::TokenLossSum, 4).value.item<double>(),
            1e-12);
    }
    // bf16 autocast on fp32 weights.
    models::LlamaConfig c = trainscope::testing::small_llama();
    torch::manual_seed(12);
    models::LlamaForCausalLM model(c, torch::TensorOptions().dtype(torch::kFloat32));
    const torch::Tensor ids = torch::randint(c.vocab_size, {2, 16});
    HeadRun runs[2];
    for (int i = 0; i < 2; ++i) {
        at::autocast::set_autocast_enabled(c10::DeviceType::CPU, true);
        at::autocast::set_autocast_dtype(c10::DeviceType::CPU, torch::kBFloat16);
        for (auto& p : model->parameters())
            p.mutable_grad() = torch::Tensor();
        torch::Tensor v = tt::head_score(*model, model->hidden_states(ids), ids,
                                         tt::LmScore::TokenLossSum, i == 0 ? 1 : 4);
        at::autocast::set_autocast_enabled(c10::DeviceType::CPU, false);
        at::autocast::clear_cache();
        v.backward();
        runs[i].value = v.detach();
        for (const auto& p : model->named_parameters())
            runs[i].grads[p.key()] = p.value().grad().clone();
    }
    EXPECT_NEAR(runs[0].value.item<double>(), runs[1].value.item<double>(),
                1e-5 * std::abs(runs[0].value.item<double>()));
    for (const auto& [name, g] : runs[0].grads)
        EXPECT_LT((g - runs[1].grads.at(name)).abs().max().item<double>(),
                  1e-2 * g.abs().max().item<double>() + 1e-6)
            << name;
}

// With Llama-3's vocabulary (128256) the logits dominate a small model's step: the host tensor
// peak of a forward + backward with llm.loss_chunks = 8 falls against 1 by what the memory plan
// says the chunking saves (within 10 %).
TEST(LlmLoss, ChunkedHeadLowersThePeakByThePlannedLogits) {
    namespace models = trainscope::models;
    namespace prof = trainscope::prof;
    prof::install_host_tensor_counter();
    models::LlamaConfig c = trainscope::testing::small_llama(128256);
    torch::manual_seed(13);
    models::LlamaForCausalLM model(c, torch::TensorOptions().dtype(torch::kFloat32));
    const std::int64_t B = 2, T = 64;
    const torch::Tensor ids = torch::randint(c.vocab_size, {B, T});
    // The gradients exist before the measured steps, as in training (zeroed, not freed).
    tt::head_score(*model, model->hidden_states(ids), ids, tt::LmScore::TokenLossSum, 8).backward();
    double peak[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
        for (auto& p : model->parameters())
            p.mutable_grad().zero_();
        const double base = prof::host_tensor_bytes().current;
        prof::reset_host_tensor_peak();
        tt::head_score(*model, model->hidden_states(ids), ids, tt::LmScore::TokenLossSum,
                       i == 0 ? 1 : 8)
            .backward();
        peak[i] = prof::host_tensor_bytes().peak - base;
    }
    tt::LlmMemoryInputs in;
    in.config = c;
    in.method = tt::LlmMethod::Full;
    in.param_dtype = in.compute_dtype = torch::kFloat32;
    in.micro_batch = B;
    in.seq_len = T;
    const double planned_whole = tt::plan_llm_memory(in).total_bytes();
    in.loss_chunks = 8;
    const double planned_saving = planned_whole - tt::plan_llm_memory(in).total_bytes();
    const double measured_saving = peak[0] - peak[1];
    std::cout << "host tensor peak above the model: loss_chunks=1 " << peak[0] / 1e6
              << " MB, loss_chunks=8 " << peak[1] / 1e6 << " MB; saving measured "
              << measured_saving / 1e6 << " MB, planned " << planned_saving / 1e6 << " MB\n";
    EXPECT_GT(planned_saving, 0.5 * peak[0]); // the logits are most of this step
    EXPECT_NEAR(measured_saving, planned_saving, 0.02 * planned_saving)
        << "peak unchunked " << peak[0] / 1e6 << " MB, chunked " << peak[1] / 1e6 << " MB";
}

TEST(LlmMemoryPlan, CountsTheGradientSynchronizersBuffersUnderDdp) {
    // dist::synchronizer_buffer_bytes over the plan's trainable sizes (the allocation itself is
    // held against the host tensor counter in tests/mpi/test_gradient_synchronizer.cpp): a
    // 16-bit copy is 2 bytes per trainable parameter, so the sizes sum to the parameter count.
    tt::LlmMemoryInputs in; // Llama-3-8B
    in.world_size = 2;
    in.lora.targets.push_back("lm_head");
    for (tt::LlmMethod m : {tt::LlmMethod::Full, tt::LlmMethod::Lora}) {
        in.method = m;
        in.param_dtype = in.compute_dtype = torch::kFloat32;
        in.compression = {};
        in.backend = "nccl";
        const tt::LlmMemoryPlan plain = tt::plan_llm_memory(in);
        const double t = static_cast<double>(plain.trainable_parameters);
        EXPECT_EQ(plain.comm_buffer_bytes, 0.0);
        in.compression.kind = dist::CompressionKind::Fp16;
        const tt::LlmMemoryPlan fp16 = tt::plan_llm_memory(in);
        EXPECT_DOUBLE_EQ(fp16.comm_buffer_bytes, 2.0 * t);
        EXPECT_DOUBLE_EQ(fp16.total_bytes() - plain.total_bytes(), 2.0 * t);
        // PowerSGD: the error feedback and the uncompressed tensors (4 bytes per parameter in
        // fp32) plus P and Q of rank 2: (n + m) x 2 elements per n x m matrix. Full: under 1 %
        // more. LoRA's [8, in] and [out, 8]: 2 (8 + in) per 8 in, a quarter more, + 32 elements
        // per adapter pair (32 layers x 7 targets).
        in.compression.kind = dist::CompressionKind::PowerSgd;
        const double psgd = tt::plan_llm_memory(in).comm_buffer_bytes;
        if (m == tt::LlmMethod::Full) {
            EXPECT_GT(psgd, 4.0 * t);
            EXPECT_LT(psgd, 4.0 * t * 1.01);
        } else {
            EXPECT_NEAR(psgd, 4.0 * 1.25 * t + 4.0 * 32.0 * (32 * 6 + 1), 1.0);
        }
        // MPI widens 16-bit gradients to float32 on the wire: 4 bytes per bf16 parameter.
        in.compression = {};
        in.backend = "mpi";
        in.param_dtype = in.compute_dtype = torch::kBFloat16;
        EXPECT_DOUBLE_EQ(tt::plan_llm_memory(in).comm_buffer_bytes, 4.0 * t);
        in.world_size = 1; // nothing travels
        EXPECT_EQ(tt::plan_llm_memory(in).comm_buffer_bytes, 0.0);
        in.world_size = 2;
        in.zero = 1; // ZeRO has no synchronizer; with 16-bit reduce-scatters, their shard
        EXPECT_EQ(tt::plan_llm_memory(in).comm_buffer_bytes, 0.0);
        in.compression.kind = dist::CompressionKind::Bf16;
        EXPECT_DOUBLE_EQ(tt::plan_llm_memory(in).comm_buffer_bytes, 2.0 * std::ceil(t / 2.0));
        in.zero = 3; // FSDP reduce-scatters each unit's gradient in 16 bits: nothing persists
        EXPECT_EQ(tt::plan_llm_memory(in).comm_buffer_bytes, 0.0);
        in.zero = 0;
        in.compression = {};
    }
}

TEST(LlmMemoryPlan, Llama3_8BFiguresFollowTheParameterArithmetic) {
    tt::LlmMemoryInputs in; // Llama-3-8B defaults, bf16
    in.world_size = 4;
    in.micro_batch = 2;
    in.seq_len = 2048;
    const double n = static_cast<double>(in.config.num_parameters());
    EXPECT_EQ(in.config.num_parameters(), 8030261248LL);

    in.method = tt::LlmMethod::Full;
    const tt::LlmMemoryPlan full = tt::plan_llm_memory(in);
    EXPECT_DOUBLE_EQ(full.trainable_weight_bytes, 2 * n);
    EXPECT_DOUBLE_EQ(full.gradient_bytes, 2 * n);
    EXPECT_DOUBLE_EQ(full.optimizer_state_bytes, 4 * n);
    EXPECT_DOUBLE_EQ(full.frozen_weight_bytes, 0);
    in.zero = 1;
    const tt::LlmMemoryPlan z1 = tt::plan_llm_memory(in);
    EXPECT_DOUBLE_EQ(z1.optimizer_state_bytes, n);      // 4n / 4 ranks
    EXPECT_DOUBLE_EQ(z1.gradient_bytes, 2 * n + n / 2); // the full flat gradient and its shard
    in.zero = 2;
    const tt::LlmMemoryPlan z2 = tt::plan_llm_memory(in);
    EXPECT_DOUBLE_EQ(z2.gradient_bytes, n / 2); // 2n / 4 ranks
    // ... but the full flat gradient exists from backward to its reduce-scatter.
    EXPECT_DOUBLE_EQ(z2.unit_gradient_bytes, 2 * n);
    EXPECT_DOUBLE_EQ(z1.unit_gradient_bytes, 0);
    in.zero = 0;

    in.method = tt::LlmMethod::Lora;
    const tt::LlmMemoryPlan lora = tt::plan_llm_memory(in);
    EXPECT_EQ(lora.trainable_parameters, 19660800);
    EXPECT_DOUBLE_EQ(lora.frozen_weight_bytes, 2 * n);
    EXPECT_DOUBLE_EQ(lora.optimizer_state_bytes, 4.0 * 19660800);

    in.method = tt::LlmMethod::Qlora;
    const tt::LlmMemoryPlan qlora = tt::plan_llm_memory(in);
    // Projections: 32 layers x (4096*4096*2 + 4096*1024*2 + 3*4096*14336).
    const double proj = 32.0 * (4096.0 * 4096 * 2 + 4096.0 * 1024 * 2 + 3.0 * 4096 * 14336);
    EXPECT_EQ(tt::llama_projection_parameters(in.config), static_cast<std::int64_t>(proj));
    EXPECT_NEAR(qlora.nf4_weight_bytes, proj * (0.5 + 1.0 / 64 + 4.0 / (64 * 256)), 1.0);
    EXPECT_DOUBLE_EQ(qlora.frozen_weight_bytes, 2 * (n - proj));
    EXPECT_LT(qlora.total_bytes(), lora.total_bytes());

    in.method = tt::LlmMethod::Dpo; // chosen + rejected: twice the tokens through the policy
    const tt::LlmMemoryPlan dpo = tt::plan_llm_memory(in);
    EXPECT_DOUBLE_EQ(dpo.activation_bytes, 2 * lora.activation_bytes);

    in.method = tt::LlmMethod::Lora;
    in.activation_checkpointing = true;
    EXPECT_LT(tt::plan_llm_memory(in).activation_bytes, lora.activation_bytes / 8);

    // The expected ordering of the studies: QLoRA < LoRA < DPO < full (no ZeRO).
    EXPECT_LT(lora.total_bytes(), dpo.total_bytes());
    EXPECT_LT(dpo.total_bytes(), full.total_bytes());

    // On a GPU, LibTorch's cuBLAS workspaces (one for the step's thread, one for autograd's
    // device thread; 32 MiB each on Hopper) are allocated bytes like any tensor's: 0 on the CPU.
    EXPECT_DOUBLE_EQ(lora.workspace_bytes, 0);
    in.activation_checkpointing = false;
    in.cublas_workspace_bytes = 32.0 * 1024 * 1024;
    const tt::LlmMemoryPlan gpu = tt::plan_llm_memory(in);
    EXPECT_DOUBLE_EQ(gpu.workspace_bytes, 64.0 * 1024 * 1024);
    EXPECT_DOUBLE_EQ(gpu.total_bytes(), lora.total_bytes() + 64.0 * 1024 * 1024);
}

// dist.zero=3 (FSDP) on Llama-3-8B, bf16: units are the embedding, 32 decoder layers and the head
// (final norm + lm_head), each sharded 1/N. The unit sizes are spelled out here from the
// architecture, not taken from the plan.
TEST(LlmMemoryPlan, Stage3ShardsEveryMethodAndCountsTheUnitsInFlight) {
    tt::LlmMemoryInputs in;
    in.micro_batch = 2;
    in.seq_len = 2048;
    in.zero = 3;
    const double n = 8030261248.0;
    const double V = 128256, h = 4096, f = 14336, kv = 1024;
    const double layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h; // q, o, k, v, MLP, 2 norms
    const double head = V * h + h;                                   // lm_head + final norm
    ASSERT_DOUBLE_EQ(V * h + 32 * layer + head, n);
    // LoRA rank 8 on q, v, o, gate, up, down: r (in + out) per adapter.
    const double adapters = 8 * ((h + h) + (h + kv) + (h + h) + 3 * (h + f));
    ASSERT_DOUBLE_EQ(32 * adapters, 19660800);
    const double proj = 32 * (layer - 2 * h);
    const double nf4 = proj * (0.5 + 1.0 / 64 + 4.0 / (64 * 256));

    std::map<int, double> full_total, lora_total;
    for (int N : {4, 8}) {
        in.world_size = N;
        SCOPED_TRACE("N = " + std::to_string(N));
        // Every unit's numel divides by 4 and 8 on this model: no padding.
        in.method = tt::LlmMethod::Full;
        const tt::LlmMemoryPlan full = tt::plan_llm_memory(in);
        EXPECT_EQ(full.zero, 3);
        EXPECT_DOUBLE_EQ(full.trainable_weight_bytes, 2 * n / N);
        EXPECT_DOUBLE_EQ(full.gradient_bytes, 2 * n / N);
        EXPECT_DOUBLE_EQ(full.optimizer_state_bytes, 4 * n / N);
        EXPECT_DOUBLE_EQ(full.frozen_weight_bytes + full.nf4_weight_bytes, 0);
        // The head is the largest unit: itself and its neighbour, a decoder layer, gathered
        // (prefetch: the largest adjacent pair), and its gradient.
        EXPECT_DOUBLE_EQ(full.gathered_weight_bytes, 2 * head + 2 * layer);
        EXPECT_DOUBLE_EQ(full.unit_gradient_bytes, 2 * head);
        // Stage 3 keeps activations and logits as unsharded data parallelism.
        in.zero = 0;
        const tt::LlmMemoryPlan full0 = tt::plan_llm_memory(in);
        in.zero = 3;
        EXPECT_DOUBLE_EQ(full.activation_bytes, full0.activation_bytes);
        EXPECT_DOUBLE_EQ(full.logits_bytes, full0.logits_bytes);
        EXPECT_DOUBLE_EQ(full0.gathered_weight_bytes + full0.unit_gradient_bytes, 0);
        EXPECT_DOUBLE_EQ(full.total_bytes(), 8 * n / N + 4 * head + 2 * layer +
                                                 full0.activation_bytes + full0.logits_bytes);
        full_total[N] = full.total_bytes();

        // The chunked loss (llm.loss_chunks=8): the head's gradient G = 2 V h bytes is summed
        // over the chunks beside one chunk's (2 G in the logits column); the embedding's (also
        // V h) exists only after that, so no unit gradient adds to the peak.
        in.loss_chunks = 8;
        const tt::LlmMemoryPlan chunked = tt::plan_llm_memory(in);
        EXPECT_DOUBLE_EQ(chunked.unit_gradient_bytes, 0);
        EXPECT_GE(chunked.logits_bytes, 2 * 2 * V * h);
        EXPECT_LT(chunked.total_bytes(), full.total_bytes());
        in.loss_chunks = 1;

        in.prefetch = false; // one unit gathered at a time
        EXPECT_DOUBLE_EQ(tt::plan_llm_memory(in).gathered_weight_bytes, 2 * head);
        in.prefetch = true;
        in.reshard_after_forward = false; // every unit stays gathered: the whole model
        EXPECT_DOUBLE_EQ(tt::plan_llm_memory(in).gathered_weight_bytes, 2 * n);
        in.reshard_after_forward = true;

        in.method = tt::LlmMethod::Lora;
        const tt::LlmMemoryPlan lora = tt::plan_llm_memory(in);
        EXPECT_DOUBLE_EQ(lora.frozen_weight_bytes, 2 * n / N);
        EXPECT_DOUBLE_EQ(lora.trainable_weight_bytes, 2 * 32 * adapters / N);
        EXPECT_DOUBLE_EQ(lora.gradient_bytes, 2 * 32 * adapters / N);
        EXPECT_DOUBLE_EQ(lora.optimizer_state_bytes, 4 * 32 * adapters / N);
        EXPECT_DOUBLE_EQ(lora.gathered_weight_bytes, 2 * head + 2 * (layer + adapters));
        EXPECT_DOUBLE_EQ(lora.unit_gradient_bytes, 2 * adapters); // one layer's adapters
        lora_total[N] = lora.total_bytes();

        in.method = tt::LlmMethod::Qlora;
        const tt::LlmMemoryPlan qlora = tt::plan_llm_memory(in);
        EXPECT_NEAR(qlora.nf4_weight_bytes, nf4 / N, 1e-3);
        EXPECT_DOUBLE_EQ(qlora.frozen_weight_bytes, 2 * (n - proj) / N);
        EXPECT_DOUBLE_EQ(qlora.trainable_weight_bytes, 2 * 32 * adapters / N);
        EXPECT_NEAR(qlora.gathered_weight_bytes, 2 * head + nf4 / 32 + 2 * 2 * h + 2 * adapters,
                    1e-3);                // NF4 layer
        in.reshard_after_forward = false; // NF4 layers are gathered as NF4
        EXPECT_NEAR(tt::plan_llm_memory(in).gathered_weight_bytes,
                    2 * (n - proj) + nf4 + 2 * 32 * adapters, 1e-3);
        in.reshard_after_forward = true;

        in.method = tt::LlmMethod::Dpo; // the LoRA state; twice the sequences
        const tt::LlmMemoryPlan dpo = tt::plan_llm_memory(in);
        EXPECT_DOUBLE_EQ(dpo.frozen_weight_bytes, lora.frozen_weight_bytes);
        EXPECT_DOUBLE_EQ(dpo.gathered_weight_bytes, lora.gathered_weight_bytes);
        EXPECT_DOUBLE_EQ(dpo.activation_bytes, 2 * lora.activation_bytes);

        in.method = tt::LlmMethod::Qat; // every weight trains, as full
        const tt::LlmMemoryPlan qat = tt::plan_llm_memory(in);
        EXPECT_DOUBLE_EQ(qat.trainable_weight_bytes, 2 * n / N);
        EXPECT_DOUBLE_EQ(qat.optimizer_state_bytes, 4 * n / N);
        EXPECT_DOUBLE_EQ(qat.gathered_weight_bytes, 2 * head + 2 * layer);
    }
    // Per-rank state falls ~1/N; the units in flight do not.
    EXPECT_DOUBLE_EQ(full_total[4] - full_total[8], 8 * n / 4 - 8 * n / 8);
    EXPECT_LT(lora_total[8], lora_total[4]);
}

// Odd sizes: every (dtype, trainable) group of a unit is padded to a multiple of N; a tied
// embedding stays gathered (and keeps its full gradient) for the whole step.
TEST(LlmMemoryPlan, Stage3PadsEachGroupAndKeepsATiedEmbeddingGathered) {
    tt::LlmMemoryInputs in;
    in.config.vocab_size = 1001;
    in.config.hidden_size = 64;
    in.config.intermediate_size = 160;
    in.config.num_hidden_layers = 3;
    in.config.num_attention_heads = 4;
    in.config.num_key_value_heads = 2;
    in.config.head_dim = 16;
    in.config.tie_word_embeddings = true;
    in.param_dtype = in.compute_dtype = torch::kFloat32;
    in.method = tt::LlmMethod::Full;
    in.zero = 3;
    in.world_size = 3;
    in.micro_batch = 1;
    in.seq_len = 16;
    const std::int64_t V = 1001, h = 64, f = 160, kv = 32;
    const std::int64_t embed = V * h;                                      // 64064
    const std::int64_t layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h; // 43136
    const std::int64_t head = h;                                           // the norm (tied)
    ASSERT_EQ(embed + 3 * layer + head, in.config.num_parameters());
    auto up = [](std::int64_t x) { return (x + 2) / 3; }; // ceil(x / 3)
    ASSERT_NE(embed % 3, 0);
    ASSERT_NE(layer % 3, 0);
    const double shard = 4.0 * static_cast<double>(up(embed) + 3 * up(layer) + up(head));
    const tt::LlmMemoryPlan p = tt::plan_llm_memory(in);
    EXPECT_DOUBLE_EQ(p.trainable_weight_bytes, shard);
    EXPECT_GT(shard, 4.0 * static_cast<double>(in.config.num_parameters()) / 3);
    EXPECT_DOUBLE_EQ(p.gradient_bytes, shard);
    EXPECT_DOUBLE_EQ(p.optimizer_state_bytes, 2 * shard);
    // Gathered: the tied embedding throughout, plus the largest adjacent pair of other units (two
    // layers), all padded to 3 shards.
    EXPECT_DOUBLE_EQ(p.gathered_weight_bytes,
                     4.0 * 3 * static_cast<double>(up(embed) + 2 * up(layer)));
    EXPECT_DOUBLE_EQ(p.unit_gradient_bytes, 4.0 * 3 * static_cast<double>(up(embed) + up(layer)));
    in.config.tie_word_embeddings = false; // the head (V h + h) is now the largest unit
    const tt::LlmMemoryPlan untied = tt::plan_llm_memory(in);
    EXPECT_DOUBLE_EQ(untied.gathered_weight_bytes,
                     4.0 * 3 * static_cast<double>(up(embed + h) + up(layer)));
    EXPECT_DOUBLE_EQ(untied.unit_gradient_bytes, 4.0 * 3 * static_cast<double>(up(embed + h)));
}

TEST(LlmValidationSplit, DisjointCompleteAndFixedBySeed) {
    for (std::int64_t n : {1, 2, 7, 100, 1001})
        for (std::int64_t n_val : {std::int64_t{0}, std::int64_t{1}, n / 3, n - 1}) {
            if (n_val < 0 || n_val >= n) continue;
            const tt::LlmSplit s = tt::split_validation(n, n_val, 42);
            ASSERT_EQ(static_cast<std::int64_t>(s.val.size()), n_val);
            ASSERT_EQ(static_cast<std::int64_t>(s.train.size()), n - n_val);
            ASSERT_TRUE(std::is_sorted(s.val.begin(), s.val.end()));
            ASSERT_TRUE(std::is_sorted(s.train.begin(), s.train.end()));
            // Disjoint, and together every sample exactly once.
            std::vector<int> seen(static_cast<std::size_t>(n), 0);
            for (auto i : s.val)
                ++seen[static_cast<std::size_t>(i)];
            for (auto i : s.train)
                ++seen[static_cast<std::size_t>(i)];
            for (int c : seen)
                ASSERT_EQ(c, 1) << "n " << n << " n_val " << n_val;
            // What every rank computes from run.seed alone: the same lists each time.
            const tt::LlmSplit again = tt::split_validation(n, n_val, 42);
            EXPECT_EQ(again.val, s.val);
            EXPECT_EQ(again.train, s.train);
        }
    // Another seed holds out other samples, and not simply the first or last ones.
    const tt::LlmSplit a = tt::split_validation(1000, 50, 42),
                       b = tt::split_validation(1000, 50, 7);
    EXPECT_NE(a.val, b.val);
    EXPECT_LT(a.val.front(), 100);
    EXPECT_GT(a.val.back(), 900);
    EXPECT_EQ(a.val_data, nullptr);
}
