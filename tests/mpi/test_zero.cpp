// ZeRO-1/2 (dist.zero) against plain data parallelism: a tiny Llama in fp64, each rank its own
// micro-batches, three AdamW steps with torchtune's token normalisation. Sharding the optimizer
// state (and the gradients) must not change the arithmetic: both reach the same parameters.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <optional>
#include <utility>

#include "../unit/llama_test_util.hpp"
#include "dist_test_util.hpp"
#include "trainscope/distributed/gradient_synchronizer.hpp"
#include "trainscope/distributed/zero.hpp"
#include "trainscope/models/llama.hpp"
#include "trainscope/train/llm_loss.hpp"

namespace tt = trainscope::train;
namespace tm_ = trainscope::models;

namespace {

tm_::LlamaConfig tiny() {
    return trainscope::testing::small_llama(96, 48);
}

tm_::LlamaForCausalLM make_model() {
    torch::manual_seed(11);
    return tm_::LlamaForCausalLM(tiny(), torch::TensorOptions().dtype(torch::kFloat64));
}

// Rank-specific batch for step `k` with some masked labels, and its label-token count.
std::pair<torch::Tensor, torch::Tensor> batch(int rank, int k) {
    torch::manual_seed(1000 + 17 * rank + k);
    torch::Tensor ids = torch::randint(0, 96, {2, 9}, torch::kInt64);
    torch::Tensor labels = ids.clone();
    labels.index_put_({0, torch::indexing::Slice(0, 3 + rank)}, -100);
    return {ids, labels};
}

double global_tokens(const torch::Tensor& labels) {
    double n = static_cast<double>(tt::count_label_tokens(labels));
    MPI_Allreduce(MPI_IN_PLACE, &n, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return n;
}

std::vector<torch::Tensor>
train_plain(int steps,
            trainscope::dist::CompressionKind compress = trainscope::dist::CompressionKind::None) {
    auto comm = trainscope::testing::mpi_communicator();
    auto model = make_model();
    auto params = model->parameters();
    trainscope::dist::CompressionOptions compression;
    compression.kind = compress;
    trainscope::dist::GradientSynchronizer sync(*comm, params, 4096, 4096, compression);
    sync.broadcast_parameters(0);
    torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
    for (int k = 0; k < steps; ++k) {
        auto [ids, labels] = batch(comm->rank(), k);
        sync.begin_iteration();
        tt::causal_lm_loss_sum(model->forward(ids), labels).backward();
        sync.finish();
        const double scale = comm->size() / global_tokens(labels);
        for (auto& p : params)
            p.mutable_grad().mul_(scale);
        opt.step();
        opt.zero_grad();
    }
    std::vector<torch::Tensor> out;
    for (auto& p : params)
        out.push_back(p.detach().clone());
    return out;
}

std::vector<torch::Tensor> train_zero(int stage, int steps,
                                      std::optional<torch::ScalarType> reduce_dtype = {}) {
    auto comm = trainscope::testing::mpi_communicator();
    auto model = make_model();
    auto params = model->parameters();
    trainscope::dist::ZeroAdamW h;
    h.lr = 1e-2;
    h.weight_decay = 0.01;
    trainscope::dist::ZeroOptimizer zero(*comm, params, stage, h, reduce_dtype);
    for (int k = 0; k < steps; ++k) {
        auto [ids, labels] = batch(comm->rank(), k);
        zero.zero_grad();
        tt::causal_lm_loss_sum(model->forward(ids), labels).backward();
        zero.reduce_gradients(comm->size() / global_tokens(labels));
        zero.step(1e-2);
    }
    std::vector<torch::Tensor> out;
    for (auto& p : model->parameters())
        out.push_back(p.detach().clone());
    return out;
}

} // namespace

TEST(Zero, Stage1And2ReachThePlainDataParallelParameters) {
    const auto plain = train_plain(3);
    for (int stage : {1, 2}) {
        const auto zero = train_zero(stage, 3);
        ASSERT_EQ(zero.size(), plain.size());
        double worst = 0;
        for (std::size_t i = 0; i < plain.size(); ++i)
            worst = std::max(worst, (zero[i] - plain[i]).abs().max().item<double>());
        EXPECT_LT(worst, 1e-12) << "dist.zero=" << stage;
        // And the training moved the weights (the comparison is not between two untouched models).
        auto fresh = make_model()->parameters();
        double moved = 0;
        for (std::size_t i = 0; i < plain.size(); ++i)
            moved = std::max(moved, (fresh[i] - plain[i]).abs().max().item<double>());
        EXPECT_GT(moved, 1e-3);
    }
}

double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
    return worst;
}

TEST(Zero, Fp16AndBf16ReduceDtypeMatchCompressedDdp) {
    // dist.compress=fp16/bf16 under ZeRO: the reduce-scatter in 16 bits with the hook's
    // pre-division, element for element what DDP's compressed bucket allreduce computes. With two
    // ranks each element is one 16-bit addition whatever the collective, so both agree to the
    // AdamW arithmetic's 1e-12; with more, the collectives may sum in other orders.
    using trainscope::dist::CompressionKind;
    const int w = trainscope::testing::world_size();
    const auto plain = train_plain(3);
    for (auto [kind, dtype] : {std::pair{CompressionKind::Fp16, torch::kHalf},
                               std::pair{CompressionKind::Bf16, torch::kBFloat16}}) {
        const auto ddp = train_plain(3, kind);
        for (int stage : {1, 2}) {
            const auto zero = train_zero(stage, 3, dtype);
            if (w <= 2) EXPECT_LT(max_diff(zero, ddp), 1e-12) << "dist.zero=" << stage;
            if (w > 1) EXPECT_GT(max_diff(zero, plain), 1e-9) << "nothing was compressed";
        }
    }
}

TEST(Zero, ShardsOptimizerStateAndStage2Gradients) {
    auto comm = trainscope::testing::mpi_communicator();
    auto model = make_model();
    auto params = model->parameters();
    std::int64_t n = 0;
    for (auto& p : params)
        n += p.numel();
    for (int stage : {1, 2}) {
        auto m = make_model();
        trainscope::dist::ZeroOptimizer zero(*comm, m->parameters(), stage,
                                             trainscope::dist::ZeroAdamW{});
        const std::int64_t shard = (n + comm->size() - 1) / comm->size();
        EXPECT_EQ(zero.numel(), n);
        EXPECT_EQ(zero.shard_numel(), shard);
        EXPECT_DOUBLE_EQ(zero.optimizer_state_bytes(), 2.0 * shard * 8);
        auto [ids, labels] = batch(comm->rank(), 0);
        zero.zero_grad();
        tt::causal_lm_loss_sum(m->forward(ids), labels).backward();
        zero.reduce_gradients(1.0);
        // Stage 1 keeps the full gradient buffer, stage 2 only its shard.
        const double full = static_cast<double>(shard * comm->size()) * 8;
        EXPECT_DOUBLE_EQ(zero.gradient_bytes(), shard * 8.0 + (stage == 1 ? full : 0.0));
        zero.step(1e-3);
    }
}
