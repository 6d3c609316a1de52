// run.precision policy on CPU: parsing and device checks with their messages, TF32 math mode,
// CPU autocast regions (dtype inside, restored state after, nesting) and the dynamic loss scaler
// against torch.amp.GradScaler's semantics (skip on inf/NaN, backoff, growth, exact unscaling).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "trainscope/core/error.hpp"
#include "trainscope/prof/statistics.hpp"
#include "trainscope/train/precision.hpp"

using namespace trainscope::train;
using trainscope::core::ConfigError;
using trainscope::core::InternalError;

namespace {

// The message of the ConfigError `f` throws ("" when it throws none).
template <class F> std::string config_error(F&& f) {
    try {
        f();
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "";
}

DeviceCaps cuda_caps(int major, int minor) {
    return DeviceCaps{torch::kCUDA, major, minor, "cuda:0 (test GPU)"};
}

std::vector<torch::Tensor> clone_all(const std::vector<torch::Tensor>& ts) {
    std::vector<torch::Tensor> out;
    for (const auto& t : ts)
        out.push_back(t.detach().clone());
    return out;
}

// A small regression model and a fixed batch: x (16, 4) → y (16, 1).
struct TinyProblem {
    torch::nn::Sequential model{nullptr};
    torch::Tensor x, y;
    explicit TinyProblem(std::uint64_t seed) {
        torch::manual_seed(seed);
        model = torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::Tanh(),
                                      torch::nn::Linear(8, 1));
        x = torch::randn({16, 4});
        y = torch::randn({16, 1});
    }
    torch::Tensor loss() { return torch::mse_loss(model->forward(x), y); }
};

GradScaler::Options scaler_options(std::int64_t growth_interval = 2000) {
    GradScaler::Options o;
    o.growth_interval = growth_interval;
    return o;
}

} // namespace

// ---- parsing and resolution ------------------------------------------------------------------

TEST(Precision, ParsesEveryNameAndRoundTrips) {
    for (const char* name : {"fp64", "fp32", "tf32", "fp16-mixed", "bf16-mixed", "bf16"})
        EXPECT_STREQ(to_string(parse_precision(name)), name);
    EXPECT_EQ(parse_precision("fp16-mixed"), Precision::FP16Mixed);
    EXPECT_EQ(parse_precision("bf16"), Precision::BF16);
}

TEST(Precision, UnknownNameListsTheValidOnes) {
    const std::string msg = config_error([] { parse_precision("fp8"); });
    EXPECT_NE(msg.find("run.precision='fp8'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fp64, fp32, tf32, fp16-mixed, bf16-mixed, bf16"), std::string::npos) << msg;
    const std::string fp16 = config_error([] { parse_precision("fp16"); });
    EXPECT_NE(fp16.find("fp16-mixed"), std::string::npos) << fp16;
}

TEST(Precision, CpuPolicies) {
    const torch::Device cpu(torch::kCPU);
    const auto fp64 = resolve_precision("fp64", cpu);
    EXPECT_EQ(fp64.param_dtype, torch::kFloat64);
    EXPECT_FALSE(fp64.autocast_dtype.has_value());
    EXPECT_FALSE(fp64.loss_scaling || fp64.tf32);

    const auto fp32 = resolve_precision("fp32", cpu);
    EXPECT_EQ(fp32.param_dtype, torch::kFloat32);
    EXPECT_FALSE(fp32.autocast_dtype.has_value() || fp32.loss_scaling || fp32.tf32);

    const auto fp16m = resolve_precision("fp16-mixed", cpu);
    EXPECT_EQ(fp16m.mode, Precision::FP16Mixed);
    EXPECT_EQ(fp16m.param_dtype, torch::kFloat32);
    ASSERT_TRUE(fp16m.autocast_dtype.has_value());
    EXPECT_EQ(*fp16m.autocast_dtype, torch::kHalf);
    EXPECT_TRUE(fp16m.loss_scaling);

    const auto bf16m = resolve_precision("bf16-mixed", cpu);
    EXPECT_EQ(bf16m.param_dtype, torch::kFloat32);
    ASSERT_TRUE(bf16m.autocast_dtype.has_value());
    EXPECT_EQ(*bf16m.autocast_dtype, torch::kBFloat16);
    EXPECT_FALSE(bf16m.loss_scaling);

    const auto bf16 = resolve_precision("bf16", cpu);
    EXPECT_EQ(bf16.param_dtype, torch::kBFloat16);
    EXPECT_FALSE(bf16.autocast_dtype.has_value() || bf16.loss_scaling);
}

TEST(Precision, Tf32OnCpuIsAConfigErrorNamingTheFix) {
    const std::string msg =
        config_error([] { resolve_precision("tf32", torch::Device(torch::kCPU)); });
    EXPECT_NE(msg.find("run.precision=tf32"), std::string::npos) << msg;
    EXPECT_NE(msg.find("on cpu"), std::string::npos) << msg;
    EXPECT_NE(msg.find("use run.precision=fp32"), std::string::npos) << msg;
}

TEST(Precision, CudaComputeCapabilityChecks) {
    const auto volta = cuda_caps(7, 0);
    for (Precision p : {Precision::TF32, Precision::BF16, Precision::BF16Mixed}) {
        const std::string msg = config_error([&] { resolve_precision(p, volta); });
        EXPECT_NE(msg.find(std::string("run.precision=") + to_string(p)), std::string::npos) << msg;
        EXPECT_NE(msg.find("cuda:0 (test GPU)"), std::string::npos) << msg;
        EXPECT_NE(msg.find("8.0"), std::string::npos) << msg;
        EXPECT_NE(msg.find("use run.precision="), std::string::npos) << msg;
    }
    for (Precision p : {Precision::FP64, Precision::FP32, Precision::FP16Mixed})
        EXPECT_NO_THROW(resolve_precision(p, volta)) << to_string(p);

    const auto ampere = cuda_caps(8, 0);
    EXPECT_TRUE(resolve_precision(Precision::TF32, ampere).tf32);
    EXPECT_EQ(*resolve_precision(Precision::BF16Mixed, ampere).autocast_dtype, torch::kBFloat16);
    EXPECT_EQ(resolve_precision(Precision::BF16, ampere).param_dtype, torch::kBFloat16);
    EXPECT_FALSE(resolve_precision(Precision::FP32, ampere).tf32);
}

// The MFU peak (prof::stats::precision_math) must be the arithmetic the resolved policy really
// runs its matmuls in, for every precision an Ampere GPU accepts: the autocast dtype when there is
// one, else the parameter dtype (fp32 with TF32 on: tf32).
TEST(Precision, MfuPeakFollowsThePolicysMatmulDtype) {
    namespace st = trainscope::prof::stats;
    const auto ampere = cuda_caps(8, 0);
    for (Precision p : {Precision::FP64, Precision::FP32, Precision::TF32, Precision::FP16Mixed,
                        Precision::BF16Mixed, Precision::BF16}) {
        const PrecisionPolicy policy = resolve_precision(p, ampere);
        const torch::ScalarType matmul = policy.autocast_dtype.value_or(policy.param_dtype);
        st::PeakMath want = st::PeakMath::FP32;
        if (matmul == torch::kFloat64) want = st::PeakMath::FP64;
        if (matmul == torch::kHalf) want = st::PeakMath::FP16;
        if (matmul == torch::kBFloat16) want = st::PeakMath::BF16;
        if (matmul == torch::kFloat32 && policy.tf32) want = st::PeakMath::TF32;
        const auto math = st::precision_math(to_string(p));
        ASSERT_TRUE(math) << to_string(p) << " has no MFU peak";
        EXPECT_EQ(math->math, want) << to_string(p);
        EXPECT_EQ(std::string(math->basis).find("autocast") != std::string::npos,
                  policy.autocast_dtype.has_value())
            << to_string(p) << ": the label must say when the peak is autocast's";
    }
}

TEST(Precision, Bf16PolicyGivesBf16Parameters) {
    const auto policy = resolve_precision("bf16", torch::Device(torch::kCPU));
    torch::manual_seed(1);
    torch::nn::Linear lin(4, 3);
    lin->to(policy.param_dtype);
    for (const auto& p : lin->parameters())
        EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
    const auto out = lin->forward(torch::randn({2, 4}).to(policy.param_dtype));
    EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
}

TEST(Precision, MathModeSwitchesTf32ForCublasAndCudnn) {
    auto& ctx = at::globalContext();
    PrecisionPolicy tf32;
    tf32.mode = Precision::TF32;
    tf32.tf32 = true;
    apply_math_mode(tf32);
    EXPECT_TRUE(ctx.allowTF32CuBLAS());
    EXPECT_TRUE(ctx.allowTF32CuDNN());
    EXPECT_EQ(ctx.float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL),
              at::Float32Precision::TF32);

    apply_math_mode(PrecisionPolicy{}); // fp32: TF32 off for both, including cuDNN's default-on
    EXPECT_FALSE(ctx.allowTF32CuBLAS());
    EXPECT_FALSE(ctx.allowTF32CuDNN());
    EXPECT_EQ(ctx.float32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL),
              at::Float32Precision::IEEE);
}

// ---- autocast --------------------------------------------------------------------------------

class CpuAutocast : public ::testing::TestWithParam<const char*> {};

TEST_P(CpuAutocast, LinearAndConvRunInTheLowPrecisionDtypeInsideOnly) {
    const torch::Device cpu(torch::kCPU);
    const auto policy = resolve_precision(GetParam(), cpu);
    const torch::Dtype low = *policy.autocast_dtype;
    torch::manual_seed(2);
    torch::nn::Linear lin(8, 4);
    torch::nn::Conv2d conv(torch::nn::Conv2dOptions(/*in=*/3, /*out=*/5, /*kernel_size=*/3));
    const auto x = torch::randn({2, 8});         // (B, in)
    const auto img = torch::randn({1, 3, 6, 6}); // (N, C, H, W)
    torch::Tensor y, loss;
    {
        AutocastScope scope(policy, cpu);
        EXPECT_TRUE(scope.active());
        EXPECT_TRUE(at::autocast::is_autocast_enabled(torch::kCPU));
        y = lin->forward(x);
        EXPECT_EQ(y.scalar_type(), low);
        EXPECT_EQ(conv->forward(img).scalar_type(), low);
        // Losses autocast to fp32 (cross_entropy is on CPU autocast's fp32 list).
        loss = torch::nn::functional::cross_entropy(y, torch::tensor({0, 3}, torch::kLong));
        EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
    }
    EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
    EXPECT_EQ(lin->forward(x).scalar_type(), torch::kFloat32);
    EXPECT_EQ(conv->forward(img).scalar_type(), torch::kFloat32);
    // Backward outside the region: fp32 parameters get fp32 gradients.
    loss.backward();
    EXPECT_EQ(lin->weight.grad().scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::isfinite(lin->weight.grad()).all().item<bool>());
}

INSTANTIATE_TEST_SUITE_P(MixedModes, CpuAutocast, ::testing::Values("fp16-mixed", "bf16-mixed"));

TEST(Autocast, NestedScopesRestoreTheOuterState) {
    const torch::Device cpu(torch::kCPU);
    const auto fp16 = resolve_precision("fp16-mixed", cpu);
    const auto bf16 = resolve_precision("bf16-mixed", cpu);
    const auto dtype_before = at::autocast::get_autocast_dtype(torch::kCPU);
    torch::nn::Linear lin(4, 4);
    const auto x = torch::randn({3, 4});
    {
        AutocastScope outer(fp16, cpu);
        EXPECT_EQ(lin->forward(x).scalar_type(), torch::kHalf);
        {
            // Plain tensors: the cast cache (keyed by leaf parameter, not by dtype) would hand
            // lin's fp16 weight copy to a bf16 region, in PyTorch as here.
            AutocastScope inner(bf16, cpu);
            EXPECT_EQ(torch::mm(x, x.t()).scalar_type(), torch::kBFloat16);
        }
        EXPECT_TRUE(at::autocast::is_autocast_enabled(torch::kCPU));
        EXPECT_EQ(lin->forward(x).scalar_type(), torch::kHalf);
        {
            AutocastScope none(resolve_precision("fp32", cpu), cpu); // no-op: stays fp16
            EXPECT_FALSE(none.active());
            EXPECT_EQ(lin->forward(x).scalar_type(), torch::kHalf);
        }
    }
    EXPECT_FALSE(at::autocast::is_autocast_enabled(torch::kCPU));
    EXPECT_EQ(at::autocast::get_autocast_dtype(torch::kCPU), dtype_before);
    EXPECT_EQ(lin->forward(x).scalar_type(), torch::kFloat32);
}

// ---- GradScaler ------------------------------------------------------------------------------

TEST(GradScaler, InfGradientSkipsTheStepAndBacksOff) {
    TinyProblem prob(3);
    torch::optim::SGD opt(prob.model->parameters(), torch::optim::SGDOptions(0.1));
    GradScaler scaler(scaler_options(), torch::Device(torch::kCPU));
    EXPECT_EQ(scaler.scale_value(), 65536.0);
    // Two finite steps: the growth tracker counts them, the scale stays (interval 2000).
    for (int i = 0; i < 2; ++i) {
        opt.zero_grad();
        scaler.scale(prob.loss()).backward();
        EXPECT_TRUE(scaler.step(opt));
        scaler.update();
    }
    EXPECT_EQ(scaler.growth_tracker(), 2);
    EXPECT_EQ(scaler.scale_value(), 65536.0);

    opt.zero_grad();
    scaler.scale(prob.loss()).backward();
    auto params = prob.model->parameters();
    params[1].grad()[0] = std::numeric_limits<float>::infinity(); // one bias entry overflows
    const auto before = clone_all(params);
    EXPECT_TRUE(scaler.unscale(params));
    EXPECT_FALSE(scaler.step(opt));
    for (std::size_t i = 0; i < params.size(); ++i)
        EXPECT_TRUE(torch::equal(params[i], before[i])) << "parameter " << i << " changed";
    EXPECT_EQ(scaler.skipped_steps(), 1);
    scaler.update();
    EXPECT_EQ(scaler.scale_value(), 32768.0);
    EXPECT_EQ(scaler.growth_tracker(), 0);

    // NaN is caught the same way, through step() alone (it unscales itself).
    opt.zero_grad();
    scaler.scale(prob.loss()).backward();
    params[0].grad()[0][0] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_FALSE(scaler.step(opt));
    scaler.update();
    EXPECT_EQ(scaler.skipped_steps(), 2);
    EXPECT_EQ(scaler.scale_value(), 16384.0);
}

TEST(GradScaler, ScaleGrowsAfterGrowthIntervalFiniteSteps) {
    TinyProblem prob(4);
    torch::optim::SGD opt(prob.model->parameters(), torch::optim::SGDOptions(0.01));
    GradScaler::Options o = scaler_options(/*growth_interval=*/3);
    o.init_scale = 1024.0;
    GradScaler scaler(o, torch::Device(torch::kCPU));
    const std::vector<std::int64_t> tracker{1, 2, 0, 1, 2, 0};
    const std::vector<double> scale{1024, 1024, 2048, 2048, 2048, 4096};
    for (std::size_t i = 0; i < tracker.size(); ++i) {
        opt.zero_grad();
        scaler.scale(prob.loss()).backward();
        EXPECT_TRUE(scaler.step(opt));
        scaler.update();
        EXPECT_EQ(scaler.growth_tracker(), tracker[i]) << "step " << i;
        EXPECT_EQ(scaler.scale_value(), scale[i]) << "step " << i;
    }
    EXPECT_EQ(scaler.skipped_steps(), 0);
}

TEST(GradScaler, UnscaledGradientsEqualTheHandComputedOnes) {
    TinyProblem prob(5);
    auto params = prob.model->parameters();
    prob.loss().backward(); // reference: gradients of the unscaled loss
    const auto reference =
        clone_all({params[0].grad(), params[1].grad(), params[2].grad(), params[3].grad()});
    for (auto& p : params)
        p.mutable_grad().zero_();

    GradScaler scaler(scaler_options(), torch::Device(torch::kCPU));
    const auto scaled_loss = scaler.scale(prob.loss());
    EXPECT_EQ(scaled_loss.dim(), 0); // the 0-dim loss stays 0-dim
    scaled_loss.backward();
    std::vector<torch::Tensor> by_hand;
    for (const auto& p : params)
        by_hand.push_back(p.grad() / 65536.0);
    EXPECT_FALSE(scaler.unscale(params));
    for (std::size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(torch::equal(params[i].grad(), by_hand[i])) << "parameter " << i;
        EXPECT_TRUE(torch::allclose(params[i].grad(), reference[i], /*rtol=*/1e-6, /*atol=*/1e-7))
            << "parameter " << i;
    }
    EXPECT_THROW(scaler.unscale(params), InternalError); // twice in one step
}

TEST(GradScaler, Fp32TrainingWithScalerMatchesTrainingWithout) {
    TinyProblem plain(6), scaled(6);
    const auto opts = torch::optim::SGDOptions(0.05).momentum(0.9);
    torch::optim::SGD opt_plain(plain.model->parameters(), opts);
    torch::optim::SGD opt_scaled(scaled.model->parameters(), opts);
    GradScaler scaler(scaler_options(/*growth_interval=*/2), torch::Device(torch::kCPU));
    for (int it = 0; it < 6; ++it) {
        opt_plain.zero_grad();
        plain.loss().backward();
        opt_plain.step();

        opt_scaled.zero_grad();
        scaler.scale(scaled.loss()).backward();
        EXPECT_TRUE(scaler.step(opt_scaled));
        scaler.update();
    }
    EXPECT_EQ(scaler.scale_value(), 65536.0 * 8); // grew at steps 2, 4 and 6
    const auto a = plain.model->parameters(), b = scaled.model->parameters();
    for (std::size_t i = 0; i < a.size(); ++i) {
        EXPECT_FALSE(torch::equal(a[i], TinyProblem(6).model->parameters()[i])); // trained
        EXPECT_LE((a[i] - b[i]).abs().max().item<double>(), 1e-6) << "parameter " << i;
    }
}

TEST(GradScaler, Fp16MixedStepOnCpu) {
    const torch::Device cpu(torch::kCPU);
    const auto policy = resolve_precision("fp16-mixed", cpu);
    TinyProblem prob(7);
    torch::optim::SGD opt(prob.model->parameters(), torch::optim::SGDOptions(0.1));
    GradScaler scaler(scaler_options(), cpu);
    const auto before = clone_all(prob.model->parameters());
    torch::Tensor loss;
    {
        AutocastScope autocast(policy, cpu);
        auto out = prob.model->forward(prob.x); // (16, 1) in fp16
        EXPECT_EQ(out.scalar_type(), torch::kHalf);
        loss = torch::mse_loss(out.to(torch::kFloat32), prob.y);
    }
    scaler.scale(loss).backward();
    EXPECT_TRUE(scaler.step(opt));
    scaler.update();
    const auto after = prob.model->parameters();
    for (std::size_t i = 0; i < after.size(); ++i) {
        EXPECT_EQ(after[i].scalar_type(), torch::kFloat32);
        EXPECT_TRUE(torch::isfinite(after[i]).all().item<bool>());
        EXPECT_FALSE(torch::equal(after[i], before[i])) << "parameter " << i << " not updated";
    }
}

TEST(GradScaler, DisabledIsAPassThrough) {
    GradScaler::Options o;
    o.enabled = false;
    GradScaler scaler(o, torch::Device(torch::kCPU));
    TinyProblem prob(8);
    torch::optim::SGD opt(prob.model->parameters(), torch::optim::SGDOptions(0.1));
    const auto loss = prob.loss();
    EXPECT_TRUE(torch::equal(scaler.scale(loss), loss));
    loss.backward();
    prob.model->parameters()[0].grad()[0][0] = std::numeric_limits<float>::infinity();
    EXPECT_FALSE(scaler.unscale(prob.model->parameters()));
    EXPECT_TRUE(scaler.step(opt)); // no inf check when disabled: the optimizer steps
    scaler.update();
    EXPECT_EQ(scaler.scale_value(), 1.0);
    EXPECT_EQ(scaler.skipped_steps(), 0);
}
