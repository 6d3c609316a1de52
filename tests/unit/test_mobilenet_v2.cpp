// MobileNetV2: the layer layout users compare against torchvision (parameter counts, output
// shapes for the studies' input sizes), the cost model behind --dry-run, and the sync-BN variant
// (cv.sync_bn) being the same model in one process.
#include <gtest/gtest.h>

#include "trainscope/core/config.hpp"
#include "trainscope/models/mobilenet_v2.hpp"

using namespace trainscope::models;

TEST(MobileNetV2, ParameterCountsMatchTorchvision) {
    // torchvision.models.mobilenet_v2(): 3,504,872 parameters (ImageNet head, width 1.0).
    EXPECT_EQ(count_parameters(*MobileNetV2(MobileNetV2Options{1000, 1.0, 0.2, 3})), 3504872);
    // num_classes=10: the classifier shrinks from 1280x1000+1000 to 1280x10+10.
    EXPECT_EQ(count_parameters(*MobileNetV2(MobileNetV2Options{10, 1.0, 0.2, 3})), 2236682);
    // width 0.5 (torchvision: mobilenet_v2(width_mult=0.5) has 1,968,680 parameters).
    EXPECT_EQ(count_parameters(*MobileNetV2(MobileNetV2Options{1000, 0.5, 0.2, 3})), 1968680);
}

TEST(MobileNetV2, AnyInputSideFrom32) {
    torch::manual_seed(0);
    MobileNetV2 net(MobileNetV2Options{10, 0.35, 0.0, 3});
    net->eval();
    torch::NoGradGuard g;
    for (int side : {32, 45, 100}) {
        auto y = net->forward(torch::randn({2, 3, side, side}));
        EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 10})) << side;
        EXPECT_TRUE(torch::isfinite(y).all().item<bool>());
    }
}

TEST(MobileNetV2, CostModelMatchesKnownFigures) {
    // Published figure for MobileNetV2 1.0 at 224x224: ~300 M multiply-adds (paper table 3).
    const auto c = mobilenet_v2_cost(MobileNetV2Options{1000, 1.0, 0.2, 3}, 224);
    EXPECT_NEAR(static_cast<double>(c.macs) / 1e6, 300.0, 3.0);
    // Cost scales with the number of pixels: 4x the side is ~16x the MACs (the classifier does not
    // scale).
    const auto small = mobilenet_v2_cost(MobileNetV2Options{10, 1.0, 0.2, 3}, 32);
    const auto large = mobilenet_v2_cost(MobileNetV2Options{10, 1.0, 0.2, 3}, 128);
    EXPECT_NEAR(static_cast<double>(large.macs) / static_cast<double>(small.macs), 16.0, 1.0);
    EXPECT_GT(large.activation_elements, 15 * small.activation_elements);
}

TEST(MobileNetV2, TrainsOnATinyProblem) {
    // Two separable classes: a few SGD steps must reduce the loss (the model is wired to learn).
    torch::manual_seed(1);
    MobileNetV2 net(MobileNetV2Options{2, 0.35, 0.0, 3});
    torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-3));
    auto x = torch::randn({16, 3, 32, 32});
    auto y = torch::arange(16) % 2;
    x.index_put_({y == 1}, x.index({y == 1}) + 1.5);
    double first = 0, last = 0;
    for (int i = 0; i < 30; ++i) {
        opt.zero_grad();
        auto loss = torch::nn::functional::cross_entropy(net->forward(x), y);
        loss.backward();
        opt.step();
        (i == 0 ? first : last) = loss.item<double>();
    }
    EXPECT_LT(last, first);
    EXPECT_LT(last, 0.1); // chance level is ln 2 = 0.69
}

namespace {

// A MobileNetV2 whose batch-norm layers are SyncBatchNorm2d with a one-rank "allreduce" (the sum
// over one rank is the tensor itself), counting its calls.
MobileNetV2Options one_rank_sync_bn(MobileNetV2Options o, int& calls) {
    o.sync_bn_allreduce = [&calls](torch::Tensor&) { ++calls; };
    return o;
}

template <typename M> int count_modules(const torch::nn::Module& net) {
    int n = 0;
    for (const auto& m : net.modules(/*include_self=*/false))
        n += m->as<M>() != nullptr;
    return n;
}

} // namespace

TEST(MobileNetV2, SyncBatchNormKeepsNamesShapesAndOrder) {
    int calls = 0;
    MobileNetV2 plain(MobileNetV2Options{1000, 1.0, 0.2, 3});
    MobileNetV2 sync(one_rank_sync_bn(MobileNetV2Options{1000, 1.0, 0.2, 3}, calls));
    // 1 stem + 2 in the t=1 block + 3 in each of the other 16 blocks + 1 last conv.
    EXPECT_EQ(count_modules<torch::nn::BatchNorm2d>(*plain), 52);
    EXPECT_EQ(count_modules<SyncBatchNorm2d>(*plain), 0);
    EXPECT_EQ(count_modules<SyncBatchNorm2d>(*sync), 52);
    EXPECT_EQ(count_modules<torch::nn::BatchNorm2d>(*sync), 0);
    EXPECT_EQ(count_parameters(*sync), 3504872);
    for (bool buffers : {false, true}) {
        const auto a = buffers ? plain->named_buffers() : plain->named_parameters();
        const auto b = buffers ? sync->named_buffers() : sync->named_parameters();
        ASSERT_EQ(a.size(), b.size());
        for (std::size_t i = 0; i < a.size(); ++i) {
            EXPECT_EQ(a[i].key(), b[i].key());
            EXPECT_EQ(a[i].value().sizes(), b[i].value().sizes()) << a[i].key();
            EXPECT_EQ(a[i].value().dtype(), b[i].value().dtype()) << a[i].key();
            EXPECT_EQ(a[i].value().requires_grad(), b[i].value().requires_grad()) << a[i].key();
        }
    }
    EXPECT_EQ(calls, 0);
}

TEST(MobileNetV2, SyncBatchNormOnOneRankEqualsPlainBatchNorm) {
    // Same seed, same initialisation; one training step and an evaluation in float64 agree with the
    // plain model (the two compute the statistics in a different order: rounding only).
    int calls = 0;
    torch::manual_seed(2);
    MobileNetV2 plain(MobileNetV2Options{5, 0.35, 0.0, 3});
    torch::manual_seed(2);
    MobileNetV2 sync(one_rank_sync_bn(MobileNetV2Options{5, 0.35, 0.0, 3}, calls));
    plain->to(torch::kFloat64);
    sync->to(torch::kFloat64);
    const auto x = torch::randn({6, 3, 40, 40}, torch::kFloat64);
    const auto y = torch::arange(6) % 5;
    const auto out_plain = plain->forward(x), out_sync = sync->forward(x);
    EXPECT_LT((out_plain - out_sync).abs().max().item<double>(), 1e-12);
    torch::nn::functional::cross_entropy(out_plain, y).backward();
    torch::nn::functional::cross_entropy(out_sync, y).backward();
    EXPECT_EQ(calls, 2 * 52);
    const auto gp = plain->named_parameters(), gs = sync->named_parameters();
    for (std::size_t i = 0; i < gp.size(); ++i) {
        const auto& a = gp[i].value().grad();
        EXPECT_LT((a - gs[i].value().grad()).abs().max().item<double>(),
                  1e-11 * (1 + a.abs().max().item<double>()))
            << gp[i].key();
    }
    const auto bp = plain->named_buffers(), bs = sync->named_buffers();
    for (std::size_t i = 0; i < bp.size(); ++i)
        EXPECT_LT((bp[i].value() - bs[i].value()).abs().max().item<double>(), 1e-12) << bp[i].key();
    plain->eval();
    sync->eval();
    torch::NoGradGuard no_grad;
    EXPECT_LT((plain->forward(x) - sync->forward(x)).abs().max().item<double>(), 1e-12);
    EXPECT_EQ(calls, 2 * 52); // eval mode does not communicate
}

TEST(MobileNetV2, SyncBatchNormOptionIsOffByDefault) {
    trainscope::core::OptionRegistry registry;
    declare_options(registry);
    const auto* spec = registry.find("cv.sync_bn");
    ASSERT_NE(spec, nullptr);
    EXPECT_EQ(spec->type, trainscope::core::OptionType::Bool);
    EXPECT_EQ(spec->default_value, "false");
}

// cv.channels_last: the same network with NHWC weights and inputs (what the trainer does) gives
// the same loss and gradients as NCHW, to rounding (fp64), in training mode.
TEST(MobileNetV2, ChannelsLastMatchesNchw) {
    MobileNetV2Options o;
    o.num_classes = 10;
    o.width_mult = 0.25;
    o.dropout = 0.0;
    torch::manual_seed(21);
    MobileNetV2 nchw(o);
    torch::manual_seed(21);
    MobileNetV2 nhwc(o);
    nchw->to(torch::kFloat64);
    nhwc->to(torch::kFloat64);
    {
        torch::NoGradGuard no_grad;
        for (auto& p : nhwc->parameters())
            if (p.dim() == 4) p.set_data(p.contiguous(torch::MemoryFormat::ChannelsLast));
    }
    torch::manual_seed(5);
    const torch::Tensor x = torch::randn({6, 3, 32, 32}, torch::kFloat64);
    const torch::Tensor y = torch::randint(0, 10, {6}, torch::kInt64);
    const torch::Tensor x_cl = x.contiguous(torch::MemoryFormat::ChannelsLast);
    ASSERT_TRUE(x_cl.is_contiguous(torch::MemoryFormat::ChannelsLast));

    torch::Tensor loss = torch::nn::functional::cross_entropy(nchw->forward(x), y);
    torch::Tensor loss_cl = torch::nn::functional::cross_entropy(nhwc->forward(x_cl), y);
    loss.backward();
    loss_cl.backward();
    EXPECT_NEAR(loss.item<double>(), loss_cl.item<double>(), 1e-12);
    const auto a = nchw->parameters(), b = nhwc->parameters();
    ASSERT_EQ(a.size(), b.size());
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, (a[i].grad() - b[i].grad()).abs().max().item<double>());
    EXPECT_LE(worst, 1e-10);
    // The NHWC weights really are channels-last (the comparison is not NCHW against itself).
    EXPECT_TRUE(b[0].is_contiguous(torch::MemoryFormat::ChannelsLast));
    EXPECT_FALSE(b[0].is_contiguous());
}
