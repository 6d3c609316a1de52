// run.strategy=dp on CPU replicas: the scatter/forward/gather/gradient-reduction path equals one
// model trained on the same chunks with gradient accumulation (batch-norm statistics are per chunk
// in DataParallel, so the reference must use the same chunks).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "trainscope/train/data_parallel.hpp"

namespace train = trainscope::train;
namespace models = trainscope::models;

namespace {

models::MobileNetV2Options tiny() {
    models::MobileNetV2Options o;
    o.num_classes = 5;
    o.width_mult = 0.25;
    o.dropout = 0.0;
    return o;
}

models::MobileNetV2 make(std::uint64_t seed) {
    torch::manual_seed(seed);
    models::MobileNetV2 m(tiny());
    m->to(torch::kFloat64);
    return m;
}

double max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
    double d = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
        d = std::max(d, (a[i] - b[i]).abs().max().item<double>());
    return d;
}

std::vector<torch::Tensor> grads(models::MobileNetV2& m) {
    std::vector<torch::Tensor> g;
    for (auto& p : m->parameters())
        g.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
    return g;
}

} // namespace

TEST(DataParallel, ThreeCpuReplicasMatchChunkedAccumulation) {
    torch::manual_seed(3);
    const torch::Tensor x = torch::randn({8, 3, 32, 32}, torch::kFloat64); // chunks 3, 3, 2
    const torch::Tensor y = torch::randint(0, 5, {8}, torch::kInt64);

    models::MobileNetV2 master = make(11);
    train::DataParallel dp(
        master, [] { return make(99); }, {torch::kCPU, torch::kCPU, torch::kCPU}, torch::kFloat64,
        /*channels_last=*/false);
    models::MobileNetV2 ref = make(11);
    torch::optim::SGD opt(master->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));

    for (int step = 0; step < 3; ++step) {
        torch::Tensor logits = dp.forward(x);
        ASSERT_EQ(logits.sizes(), torch::IntArrayRef({8, 5}));
        torch::Tensor loss = torch::nn::functional::cross_entropy(logits, y);
        loss.backward();
        dp.reduce_gradients();

        double ref_loss = 0;
        const auto xs = x.chunk(3, 0);
        const auto ys = y.chunk(3, 0);
        for (std::size_t i = 0; i < xs.size(); ++i) {
            const double share = static_cast<double>(xs[i].size(0)) / 8.0;
            torch::Tensor li = torch::nn::functional::cross_entropy(ref->forward(xs[i]), ys[i]);
            (li * share).backward();
            ref_loss += li.item<double>() * share;
        }
        EXPECT_NEAR(loss.item<double>(), ref_loss, 1e-12) << "step " << step;
        EXPECT_LE(max_diff(grads(master), grads(ref)), 1e-10) << "step " << step;

        opt.step();
        opt.zero_grad();
        ref_opt.step();
        ref_opt.zero_grad();
        dp.refresh();
    }
    EXPECT_LE(max_diff(master->parameters(), ref->parameters()), 1e-10);
}

TEST(DataParallel, OneDeviceIsPlainTraining) {
    models::MobileNetV2 master = make(5);
    models::MobileNetV2 ref = make(5);
    train::DataParallel dp(
        master, [] { return make(1); }, {torch::kCPU}, torch::kFloat64, false);
    torch::manual_seed(8);
    const torch::Tensor x = torch::randn({4, 3, 32, 32}, torch::kFloat64);
    EXPECT_EQ(dp.forward(x).sub(ref->forward(x)).abs().max().item<double>(), 0.0);
}
