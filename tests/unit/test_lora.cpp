// LoRA: B = 0 is the base model, merged weights equal the unmerged forward, adapters off equal the
// base, targets and freezing, and torchtune's trainable-parameter count for Llama-3-8B.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "llama_test_util.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/models/llama.hpp"
#include "trainscope/models/lora.hpp"

namespace tm_ = trainscope::models;

namespace {

tm_::LlamaConfig small() {
    return trainscope::testing::small_llama(40, 48);
}

tm_::LlamaForCausalLM model(int seed = 2) {
    torch::manual_seed(seed);
    return tm_::LlamaForCausalLM(small(), torch::TensorOptions().dtype(torch::kFloat64));
}

void randomise_b(torch::nn::Module& m) {
    torch::NoGradGuard no_grad;
    for (auto& [name, t] : tm_::lora_parameters(m))
        if (name.size() > 7 && name.substr(name.size() - 7) == ".lora_b") t.normal_(0, 0.1);
}

} // namespace

TEST(Lora, ZeroBIsTheBaseModelAndDisabledAdaptersToo) {
    auto base = model(), lora = model();
    const torch::Tensor ids = torch::randint(0, 40, {2, 6}, torch::kInt64);
    const torch::Tensor want = base->forward(ids);
    tm_::apply_lora(*lora, tm_::LoraOptions{});
    EXPECT_TRUE(torch::equal(lora->forward(ids), want)); // B = 0
    randomise_b(*lora);
    EXPECT_GT((lora->forward(ids) - want).abs().max().item<double>(), 1e-6);
    tm_::set_adapters_enabled(*lora, false);
    EXPECT_TRUE(torch::equal(lora->forward(ids), want));
}

TEST(Lora, MergedWeightsEqualTheUnmergedForward) {
    auto m = model(4);
    tm_::LoraOptions o;
    o.rank = 4;
    o.alpha = 8;
    o.targets = {"q_proj",    "k_proj",  "v_proj",    "o_proj",
                 "gate_proj", "up_proj", "down_proj", "lm_head"};
    tm_::apply_lora(*m, o);
    randomise_b(*m);
    const torch::Tensor ids = torch::randint(0, 40, {3, 5}, torch::kInt64);
    const torch::Tensor unmerged = m->forward(ids);
    tm_::merge_lora(*m);
    EXPECT_TRUE(tm_::lora_parameters(*m).empty());
    EXPECT_LT((m->forward(ids) - unmerged).abs().max().item<double>(), 1e-12);
}

TEST(Lora, WrapsTheTargetsFreezesTheRestAndInitialisesLikeTorchtune) {
    auto m = model();
    const auto wrapped = tm_::apply_lora(*m, tm_::LoraOptions{});
    EXPECT_EQ(wrapped.size(), 2u * 6u);
    EXPECT_EQ(wrapped.front(), "layers.0.self_attn.q_proj");
    std::int64_t trainable = 0;
    for (auto& item : m->named_parameters()) {
        const bool adapter = item.key().find(".lora_") != std::string::npos;
        EXPECT_EQ(item.value().requires_grad(), adapter) << item.key();
        if (adapter) trainable += item.value().numel();
    }
    EXPECT_EQ(trainable, tm_::lora_parameter_count(small(), tm_::LoraOptions{}));
    for (auto& [name, t] : tm_::lora_parameters(*m)) {
        if (name.substr(name.size() - 7) == ".lora_b") {
            EXPECT_EQ(t.abs().max().item<double>(), 0.0) << name;
        } else {
            const double bound = 1.0 / std::sqrt(static_cast<double>(t.size(1)));
            EXPECT_LE(t.abs().max().item<double>(), bound) << name;
            EXPECT_GT(t.abs().max().item<double>(), bound * 0.5) << name; // not all near zero
        }
    }
    tm_::LoraOptions bad;
    bad.targets = {"q_proj", "qkv_proj"};
    try {
        tm_::apply_lora(*model(), bad);
        FAIL();
    } catch (const trainscope::core::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("qkv_proj"), std::string::npos);
        EXPECT_NE(std::string(e.what()).find("down_proj"), std::string::npos);
    }
}

TEST(Lora, Llama3_8BDefaultsTrain19660800Parameters) {
    tm_::LlamaConfig c; // Llama-3-8B
    EXPECT_EQ(tm_::lora_parameter_count(c, tm_::LoraOptions{}), 19660800);
    tm_::LoraOptions qv;
    qv.targets = {"q_proj", "v_proj"}; // torchtune's 8B_lora attention-only variant
    EXPECT_EQ(tm_::lora_parameter_count(c, qv), 32 * 8 * ((4096 + 4096) + (4096 + 1024)));
}

TEST(Lora, ActivationCheckpointingKeepsTheAdapterGradients) {
    // The embedding is frozen, so no checkpointed layer input requires grad: the adapters inside
    // must still get exactly the gradients of the run without checkpointing.
    auto run = [](bool ckpt) {
        auto m = model(6);
        tm_::apply_lora(*m, tm_::LoraOptions{});
        randomise_b(*m);
        m->set_activation_checkpointing(ckpt);
        torch::manual_seed(8);
        m->forward(torch::randint(0, 40, {2, 5}, torch::kInt64)).logsumexp(-1).mean().backward();
        std::vector<torch::Tensor> g;
        for (auto& [name, t] : tm_::lora_parameters(*m)) {
            EXPECT_TRUE(t.grad().defined()) << name;
            g.push_back(t.grad().defined() ? t.grad().clone() : torch::zeros_like(t));
        }
        return g;
    };
    const auto plain = run(false), ckpt = run(true);
    ASSERT_EQ(plain.size(), ckpt.size());
    for (std::size_t i = 0; i < plain.size(); ++i)
        EXPECT_LT((plain[i] - ckpt[i]).abs().max().item<double>(), 1e-12) << i;
}

TEST(Lora, CheckpointRecomputeUsesTheForwardsAutocastAndDropoutMasks) {
    // Issue 36 point 1: the recomputation in backward runs under the autocast state and from the
    // RNG state of the forward (torch.utils.checkpoint's preserve_rng_state), so the adapters'
    // gradients with checkpointing equal those without it, under bf16 autocast on the CPU (as
    // run.precision=bf16-mixed) and with LoRA dropout 0.1 (fresh masks gave other gradients).
    struct Case {
        bool bf16;
        double dropout;
    };
    auto run = [](Case c, bool ckpt, std::uint64_t seed) {
        torch::manual_seed(6);
        auto m = tm_::LlamaForCausalLM(small(), torch::TensorOptions().dtype(torch::kFloat32));
        tm_::LoraOptions o;
        o.dropout = c.dropout;
        tm_::apply_lora(*m, o);
        randomise_b(*m);
        m->train();
        m->set_activation_checkpointing(ckpt);
        const torch::Tensor ids = torch::randint(0, 40, {2, 5}, torch::kInt64);
        torch::manual_seed(seed); // the dropout masks
        torch::Tensor loss;
        {
            at::autocast::set_autocast_enabled(c10::DeviceType::CPU, c.bf16);
            at::autocast::set_autocast_dtype(c10::DeviceType::CPU, torch::kBFloat16);
            at::autocast::increment_nesting();
            loss = m->forward(ids).to(torch::kFloat32).logsumexp(-1).mean();
            if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
            at::autocast::set_autocast_enabled(c10::DeviceType::CPU, false);
        }
        // Backward outside the autocast region, as the trainer does; an RNG draw in between must
        // not change the recomputed masks.
        (void)torch::rand({3});
        loss.backward();
        std::vector<torch::Tensor> g;
        for (auto& [name, t] : tm_::lora_parameters(*m))
            g.push_back(t.grad().defined() ? t.grad().clone() : torch::zeros_like(t));
        return g;
    };
    auto max_diff = [](const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
        double d = 0;
        for (std::size_t i = 0; i < a.size(); ++i)
            d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
        return d;
    };
    for (Case c : {Case{true, 0.0}, Case{false, 0.1}, Case{true, 0.1}}) {
        SCOPED_TRACE(std::string(c.bf16 ? "bf16 autocast" : "fp32") + ", dropout " +
                     std::to_string(c.dropout));
        const auto plain = run(c, false, 11), ckpt = run(c, true, 11);
        ASSERT_EQ(plain.size(), ckpt.size());
        EXPECT_LT(max_diff(plain, ckpt), 1e-6);
        // Not vacuous: other masks (dropout) or an fp32 recomputation (bf16) differ by far more.
        const auto other = c.dropout > 0 ? run(c, false, 12) : run(Case{false, 0.0}, false, 11);
        EXPECT_GT(max_diff(plain, other), 1e-4);
    }
}
