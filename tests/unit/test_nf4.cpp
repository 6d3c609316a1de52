// NF4: the 16 levels, the round-trip error bound the levels and the scale quantisation imply, the
// nibble order, the storage per weight, and the projection's forward/backward.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "nf4_reference.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/models/llama.hpp"
#include "trainscope/models/lora.hpp"
#include "trainscope/models/nf4.hpp"
#include "trainscope/prof/memory.hpp"

namespace tm_ = trainscope::models;

namespace {

// The dequantised block scales, from the stored fields: q / factor + mean.
torch::Tensor block_scales(const tm_::Nf4Tensor& t) {
    return (t.quantized_scalers.to(torch::kFloat64).view({-1, 256}) /
                t.scaler_factors.to(torch::kFloat64).unsqueeze(1) +
            t.scaler_mean)
        .reshape({-1});
}

} // namespace

TEST(Nf4, ValuesAreLevelsTimesScalesWithinTheBound) {
    torch::manual_seed(0);
    const torch::Tensor w = torch::randn({128, 256}) * 0.05;
    const auto q = tm_::Nf4Tensor::quantize(w, torch::kFloat32);
    const torch::Tensor deq = q.dequantize().to(torch::kFloat64).view({-1, 64});
    const torch::Tensor scale = block_scales(q).unsqueeze(1);
    // Every value is one of the 16 levels times its block's (dequantised) scale.
    const auto& L = tm_::nf4_levels();
    const torch::Tensor levels = torch::tensor(std::vector<double>(L.begin(), L.end()));
    const torch::Tensor ratio = deq / scale;
    const torch::Tensor dist = (ratio.unsqueeze(-1) - levels).abs().amin(-1);
    EXPECT_LT(dist.max().item<double>(), 1e-6);
    EXPECT_EQ(levels.size(0), 16);
    EXPECT_EQ(L.front(), -1.0f);
    EXPECT_EQ(L.back(), 1.0f);
    EXPECT_EQ(L[7], 0.0f);
    // Bound: absmax x half the widest gap between levels (nearest-level rounding) plus the scale's
    // own quantisation error, absmax of the centred scales / 256 per group (|level| <= 1).
    double half_gap = 0;
    for (int i = 0; i + 1 < 16; ++i)
        half_gap = std::max(half_gap, (L[i + 1] - L[i]) / 2.0);
    const torch::Tensor x = w.to(torch::kFloat64).view({-1, 64});
    const torch::Tensor absmax = x.abs().amax(1, true);
    const torch::Tensor centred = (absmax.view({-1, 256}) - absmax.mean()).abs().amax(1, true);
    const torch::Tensor scale_err = (centred / 256.0).expand({-1, 256}).reshape({-1, 1});
    const torch::Tensor bound = absmax * half_gap + scale_err + 1e-7;
    EXPECT_TRUE(((deq - x).abs() <= bound).all().item<bool>());
    // And it is a real quantisation: most values moved.
    EXPECT_GT((deq - x).abs().gt(1e-9).to(torch::kFloat64).mean().item<double>(), 0.9);
}

TEST(Nf4, NibbleOrderStorageAndShapeRule) {
    torch::Tensor w = torch::randn({128, 128}) * 0.1;
    w[0][0] = 2.0;  // the block's absmax: level 1, code 15
    w[0][1] = -2.0; // level -1, code 0
    w[0][2] = 0.0;  // level 0, code 7
    w[0][3] = 2.0;
    const auto q = tm_::Nf4Tensor::quantize(w, torch::kBFloat16);
    EXPECT_EQ(q.codes.scalar_type(), torch::kUInt8);
    EXPECT_EQ(q.codes[0].item<int>(), 0xF0); // first element in the high nibble
    EXPECT_EQ(q.codes[1].item<int>(), 0x7F);
    EXPECT_EQ(q.dequantize().scalar_type(), torch::kBFloat16);
    // Bytes: codes n/2, int8 scale per 64, fp32 factor per 64 x 256, the mean.
    const std::int64_t n = 128 * 128;
    EXPECT_EQ(q.storage_bytes(), n / 2 + n / 64 + 4 * n / (64 * 256) + 4);
    const double bits = 8.0 * q.storage_bytes() / n;
    EXPECT_NEAR(bits, 4.0 + 8.0 / 64 + 32.0 / (64 * 256) + 32.0 / n, 1e-12);
    EXPECT_NEAR(4.0 + 8.0 / 64 + 32.0 / (64 * 256), 4.127, 0.001); // ~4.13 bits per weight
    try {
        tm_::Nf4Tensor::quantize(torch::randn({64, 96}), torch::kFloat32);
        FAIL();
    } catch (const trainscope::core::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("[64, 96]"), std::string::npos) << e.what();
    }
}

TEST(Nf4, ProjectionUsesTheDequantisedWeightForwardAndBackward) {
    torch::manual_seed(1);
    const torch::Tensor w = torch::randn({64, 256});
    tm_::Nf4ProjectionImpl p(w, torch::kFloat32);
    const torch::Tensor dense = p.weight.dequantize();
    torch::Tensor x = torch::randn({3, 5, 256}, torch::requires_grad());
    torch::Tensor x2 = x.detach().clone().requires_grad_(true);
    const torch::Tensor y = p.forward(x);
    const torch::Tensor y2 = torch::nn::functional::linear(x2, dense);
    EXPECT_LT((y - y2).abs().max().item<double>(), 1e-5);
    const torch::Tensor g = torch::randn_like(y);
    y.backward(g);
    y2.backward(g);
    EXPECT_LT((x.grad() - x2.grad()).abs().max().item<double>(), 1e-5);
    EXPECT_TRUE(p.parameters().empty()); // nothing of the base weight is trainable
    EXPECT_EQ(p.buffers().size(), 3u);
}

// QLoRA's memory saving is real only if nothing keeps the dense projections once they are
// quantised: the layers used to hold them in members besides their children, which kept every
// dense weight alive (found by the host tensor counter: QLoRA peaked above LoRA).
TEST(Nf4, QuantisedLlamaReleasesTheDenseProjections) {
    torch::manual_seed(2);
    tm_::LlamaConfig c = tm_::LlamaConfig::preset("tiny");
    c.vocab_size = 64;
    tm_::LlamaForCausalLM model(c, torch::TensorOptions().dtype(torch::kFloat32));
    std::vector<std::weak_ptr<torch::nn::Module>> dense;
    tm_::for_each_projection(*model,
                             [&](torch::nn::Module&, const std::string&, const std::string& full,
                                 std::shared_ptr<tm_::ProjectionImpl> p) {
                                 if (full.rfind("layers.", 0) == 0) dense.push_back(p);
                             });
    ASSERT_EQ(dense.size(), 2u * 7u);
    tm_::quantize_nf4(*model, torch::kFloat32);
    tm_::LoraOptions lora;
    tm_::apply_lora(*model, lora);
    for (const auto& d : dense)
        EXPECT_TRUE(d.expired());
    for (const auto& p : model->named_parameters())
        EXPECT_TRUE(p.key().find("lora_") != std::string::npos ||
                    p.key().rfind("layers.", 0) != 0 ||
                    p.key().find("layernorm") != std::string::npos)
            << p.key() << " is a dense parameter left in a quantised layer";
    // Still a working model.
    const torch::Tensor logits = model->forward(torch::randint(0, 64, {1, 8}));
    EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
}

// Issue 25: the dequantisation table is built once per device and reused (on a GPU each build was
// a pageable host-to-device copy, i.e. a host sync, in every projection's forward and backward).
TEST(Nf4, ByteTableIsBuiltOncePerDeviceAndMatchesTheLevels) {
    const torch::Tensor& a = tm_::nf4_byte_table(torch::kCPU);
    torch::manual_seed(1);
    const auto q = tm_::Nf4Tensor::quantize(torch::randn({64, 256}) * 0.05, torch::kFloat32);
    const torch::Tensor first = q.dequantize();
    const torch::Tensor& b = tm_::nf4_byte_table(torch::kCPU);
    EXPECT_EQ(a.data_ptr(), b.data_ptr()); // the same buffer, not a rebuilt one
    EXPECT_TRUE(torch::equal(first, q.dequantize()));
    ASSERT_EQ(a.sizes(), torch::IntArrayRef({256, 2}));
    EXPECT_EQ(a.device(), torch::Device(torch::kCPU));
    const auto& L = tm_::nf4_levels();
    for (int byte : {0x00, 0x0f, 0xf0, 0x7a, 0xff}) {
        EXPECT_EQ(a[byte][0].item<float>(), L[static_cast<std::size_t>(byte >> 4)]) << byte;
        EXPECT_EQ(a[byte][1].item<float>(), L[static_cast<std::size_t>(byte & 15)]) << byte;
    }
    if (torch::cuda::is_available()) { // the gpu label's run: one table per device, kept there
        const torch::Device gpu(torch::kCUDA, 0);
        const torch::Tensor& g = tm_::nf4_byte_table(gpu);
        EXPECT_EQ(g.device(), gpu);
        EXPECT_EQ(g.data_ptr(), tm_::nf4_byte_table(gpu).data_ptr());
        EXPECT_TRUE(torch::equal(g.cpu(), a));
    }
}

// Issue 36: dequantisation in the compute dtype through int32 indices, without int64 copies or
// fp32 temporaries: equal to the fp32 arithmetic used before (in fp32 bit for bit; in bf16 within
// the rounding of the level and scale to bf16), and its host tensor peak is the result plus
// dequant_transient_bytes(), well under the former path's.
TEST(Nf4, DequantizeInTheComputeDtypeEqualsTheFp32PathAndStaysLean) {
    namespace prof = trainscope::prof;
    prof::install_host_tensor_counter();
    torch::manual_seed(4);
    const torch::Tensor w = torch::randn({512, 1024}) * 0.05;
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
        const auto q = tm_::Nf4Tensor::quantize(w, dtype);
        // The former arithmetic: int64 indices, fp32 table, fp32 product, then the cast.
        auto before = [&] { return trainscope::testing::nf4_dequantize_fp32_path(q); };
        double base = prof::host_tensor_bytes().current;
        prof::reset_host_tensor_peak();
        const torch::Tensor ref = before();
        const double before_peak = prof::host_tensor_bytes().peak - base;
        base = prof::host_tensor_bytes().current;
        prof::reset_host_tensor_peak();
        const torch::Tensor now = q.dequantize();
        const double now_peak = prof::host_tensor_bytes().peak - base;
        ASSERT_EQ(now.scalar_type(), dtype);
        ASSERT_EQ(now.sizes(), ref.sizes());
        if (dtype == torch::kFloat32) {
            EXPECT_TRUE(torch::equal(now, ref));
        } else {
            const torch::Tensor r = ref.to(torch::kFloat32), n = now.to(torch::kFloat32);
            // Level, scale and product each rounded to bf16 (unit roundoff 2^-8), against one
            // rounding of the fp32 product: at most 4 roundings apart, 2^-6 relative.
            EXPECT_LE(((n - r).abs() - r.abs() * std::ldexp(1.0, -6)).max().item<double>(), 0.0);
            EXPECT_GT(torch::eq(n, r).to(torch::kFloat64).mean().item<double>(), 0.5);
        }
        const double result = static_cast<double>(now.nbytes());
        EXPECT_LE(now_peak, result + static_cast<double>(q.dequant_transient_bytes()) + 4096)
            << torch::toString(dtype);
        // fp32: the int64 index and the product are gone (6 -> 3 bytes per weight); bf16: also
        // the fp32 values (7 -> 4).
        EXPECT_LT(now_peak, (dtype == torch::kFloat32 ? 0.6 : 0.35) * before_peak)
            << torch::toString(dtype);
    }
}
