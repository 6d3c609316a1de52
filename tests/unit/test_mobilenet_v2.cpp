// MobileNetV2: the layer layout users compare against torchvision (parameter counts, output
// shapes for the studies' input sizes) and the cost model behind --dry-run.
#include <gtest/gtest.h>

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
