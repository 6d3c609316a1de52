// GradientSynchronizer under MPI (np 1, 2, 4): data-parallel training with bucketed, overlapped
// gradient averaging must reproduce single-process training on the global batch (fp64, 1e-10),
// for bucket caps from "one bucket" to "one parameter per bucket".
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <chrono>

#include "dist_test_util.hpp"
#include "mpi_test_util.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/dist/communicator.hpp"
#include "trainscope/dist/gradient_synchronizer.hpp"

namespace dist = trainscope::dist;
namespace core = trainscope::core;

namespace {

using trainscope::testing::world_rank;
using trainscope::testing::world_size;

// 2,411 parameters, registered as conv.weight [4,1,3,3], conv.bias [4], fc1.weight [16,144],
// fc1.bias [16], fc2.weight [3,16], fc2.bias [3]; no batch-norm, so per-sample gradients are
// independent of how the batch is split.
struct NetImpl : torch::nn::Module {
    NetImpl() {
        conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)));
        fc1 = register_module("fc1", torch::nn::Linear(4 * 6 * 6, 16));
        fc2 = register_module("fc2", torch::nn::Linear(16, 3));
    }
    torch::Tensor forward(torch::Tensor x) { // x: [B, 1, 8, 8]
        x = torch::relu(conv(x)).flatten(1); // [B, 144]
        return fc2(torch::relu(fc1(x)));     // [B, 3]
    }
    torch::nn::Conv2d conv{nullptr};
    torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

Net make_net(std::uint64_t seed) {
    torch::manual_seed(seed);
    Net net;
    net->to(torch::kFloat64);
    return net;
}

double max_abs_diff(const Net& a, const Net& b) {
    double m = 0;
    auto pa = a->parameters(), pb = b->parameters();
    for (std::size_t i = 0; i < pa.size(); ++i)
        m = std::max(m, (pa[i] - pb[i]).abs().max().item<double>());
    return m;
}

using trainscope::testing::mpi_communicator;

struct CapCase {
    std::size_t cap;
    std::vector<std::size_t> bytes;               // expected bucket payloads (fp64)
    std::vector<std::vector<std::size_t>> params; // expected parameter indices per bucket
};

// Parameter bytes in reverse registration order: fc2.bias 24, fc2.weight 384, fc1.bias 128,
// fc1.weight 18432, conv.bias 32, conv.weight 288.
const std::vector<CapCase> kCaps = {
    {25u << 20, {19288}, {{5, 4, 3, 2, 1, 0}}},
    {1024, {536, 18432, 320}, {{5, 4, 3}, {2}, {1, 0}}},
    {16, {24, 384, 128, 18432, 32, 288}, {{5}, {4}, {3}, {2}, {1}, {0}}}, // cap < any parameter
};

} // namespace

TEST(GradientSynchronizer, DataParallelEqualsGlobalBatchTraining) {
    const int r = world_rank(), w = world_size();
    const std::int64_t B = 3; // per rank
    for (const CapCase& c : kCaps) {
        SCOPED_TRACE("bucket cap " + std::to_string(c.cap) + " bytes");
        auto comm = mpi_communicator();
        Net reference = make_net(7);
        Net model = make_net(7 + r); // ranks start different; broadcast_parameters fixes that
        dist::GradientSynchronizer sync(*comm, model->parameters(), c.cap);
        ASSERT_EQ(sync.num_buckets(), c.bytes.size());
        EXPECT_EQ(sync.bucket_bytes(), c.bytes);
        EXPECT_EQ(sync.bucket_parameters(), c.params);
        EXPECT_EQ(sync.bytes_per_iteration(), w > 1 ? 19288u : 0u);

        sync.broadcast_parameters(0);
        ASSERT_EQ(max_abs_diff(model, reference), 0.0);

        torch::optim::SGD ref_opt(reference->parameters(),
                                  torch::optim::SGDOptions(0.1).momentum(0.9));
        torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
        for (int step = 0; step < 5; ++step) {
            torch::manual_seed(1000 + step); // the same global batch on every rank
            auto x = torch::randn({w * B, 1, 8, 8}, torch::kFloat64);
            auto y = torch::randint(0, 3, {w * B}, torch::kInt64);

            ref_opt.zero_grad();
            torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
            ref_opt.step();

            opt.zero_grad();
            sync.begin_iteration();
            auto loss = torch::nn::functional::cross_entropy(model->forward(x.narrow(0, r * B, B)),
                                                             y.narrow(0, r * B, B));
            loss.backward();
            EXPECT_GE(sync.finish(), 0.0);
            opt.step();
            // Every bucket became ready during backward and was launched from a hook.
            EXPECT_EQ(sync.buckets_launched_in_backward(), c.bytes.size());
            EXPECT_EQ(sync.buckets_launched_in_finish(), 0u);
        }
        EXPECT_LE(max_abs_diff(model, reference), 1e-10);
        EXPECT_GT(max_abs_diff(model, make_net(7)), 1e-3); // it did train
        auto stats = comm->stats();
        if (w > 1) {
            EXPECT_EQ(stats["allreduce"].calls, 5 * c.bytes.size());
            EXPECT_EQ(stats["allreduce"].bytes, 5u * 19288);
        } else {
            EXPECT_EQ(stats.count("allreduce"), 0u); // one rank: no communication at all
        }
    }
}

TEST(GradientSynchronizer, MissingGradientsCountAsZero) {
    const int r = world_rank(), w = world_size();
    auto comm = mpi_communicator();
    auto opts = torch::TensorOptions().dtype(torch::kFloat64).requires_grad(true);
    auto a = torch::zeros({3}, opts);      // used on every rank
    auto b = torch::zeros({2}, opts);      // used on rank 0 only
    auto unused = torch::zeros({4}, opts); // never used
    dist::GradientSynchronizer sync(*comm, {a, b, unused}, /*bucket_cap_bytes=*/8);
    ASSERT_EQ(sync.num_buckets(), 3u);
    for (int it = 0; it < 2; ++it) {
        a.mutable_grad() = torch::Tensor();
        b.mutable_grad() = torch::Tensor();
        unused.mutable_grad() = torch::Tensor();
        sync.begin_iteration();
        auto loss = double(r + 1) * a.sum();
        if (r == 0) loss = loss + 2.0 * b.sum();
        loss.backward();
        sync.finish();
        // The first bucket (unused, reverse order) never becomes ready, so every bucket waits for
        // finish(): buckets are launched strictly in order.
        EXPECT_EQ(sync.buckets_launched_in_backward(), 0u);
        EXPECT_EQ(sync.buckets_launched_in_finish(), 3u);
        EXPECT_TRUE(torch::allclose(a.grad(), torch::full({3}, (w + 1) / 2.0, torch::kFloat64)));
        EXPECT_TRUE(torch::allclose(b.grad(), torch::full({2}, 2.0 / w, torch::kFloat64)));
        ASSERT_TRUE(unused.grad().defined());
        EXPECT_TRUE(torch::equal(unused.grad(), torch::zeros({4}, torch::kFloat64)));
    }
}

TEST(GradientSynchronizer, HooksIdleOutsideIterationsForAccumulation) {
    const int r = world_rank(), w = world_size();
    auto comm = mpi_communicator();
    auto a = torch::zeros({5}, torch::TensorOptions().dtype(torch::kFloat64).requires_grad(true));
    dist::GradientSynchronizer sync(*comm, {a}, 1 << 20);
    // Micro-batch 1: no begin_iteration(), the gradient stays local.
    (double(r + 1) * a.sum()).backward();
    EXPECT_TRUE(torch::equal(a.grad(), torch::full({5}, double(r + 1), torch::kFloat64)));
    // Micro-batch 2 inside the iteration: the accumulated gradient 2(r+1) is averaged.
    sync.begin_iteration();
    (double(r + 1) * a.sum()).backward();
    sync.finish();
    EXPECT_EQ(sync.buckets_launched_in_backward(), 1u);
    EXPECT_TRUE(torch::equal(a.grad(), torch::full({5}, double(w + 1), torch::kFloat64)));
}

TEST(GradientSynchronizer, SecondBackwardInOneIterationIsAnError) {
    auto comm = mpi_communicator();
    auto a = torch::ones({5}, torch::TensorOptions().dtype(torch::kFloat64).requires_grad(true));
    dist::GradientSynchronizer sync(*comm, {a}, 1 << 20);
    sync.begin_iteration();
    auto loss = (a * a).sum();
    loss.backward({}, /*retain_graph=*/true);
    try {
        loss.backward();
        ADD_FAILURE() << "a second backward before finish() must throw";
    } catch (const core::InternalError& e) { // the autograd engine rethrows it unchanged
        EXPECT_NE(std::string(e.what()).find("backward ran twice"), std::string::npos) << e.what();
    }
    sync.finish(); // the bucket launched by the first backward completes on every rank
    EXPECT_THROW(sync.finish(), core::InternalError); // finish without begin_iteration
    sync.begin_iteration();
    EXPECT_THROW(sync.begin_iteration(), core::InternalError);
    sync.finish();
}

TEST(GradientSynchronizer, DestructorRemovesHooks) {
    auto comm = mpi_communicator();
    auto a = torch::ones({2}, torch::TensorOptions().dtype(torch::kFloat64).requires_grad(true));
    {
        dist::GradientSynchronizer sync(*comm, {a}, 1 << 20);
        EXPECT_TRUE(torch::autograd::impl::post_acc_grad_hooks(a) != nullptr);
        EXPECT_THROW(dist::GradientSynchronizer(*comm, {a}, 1 << 20), core::InternalError);
    }
    EXPECT_TRUE(torch::autograd::impl::post_acc_grad_hooks(a) == nullptr);
    (a * 3.0).sum().backward(); // no hook left to fire
    EXPECT_TRUE(torch::equal(a.grad(), torch::full({2}, 3.0, torch::kFloat64)));
    dist::GradientSynchronizer again(*comm, {a}, 1 << 20); // the slot is free again
}

TEST(GradientSynchronizer, BroadcastsParametersAndBuffers) {
    const int r = world_rank(), w = world_size();
    auto comm = mpi_communicator();
    auto opts = torch::TensorOptions().dtype(torch::kFloat32).requires_grad(true);
    auto p = torch::full({3, 2}, float(r), opts);
    auto q = torch::full({4}, double(r), opts.dtype(torch::kFloat64)); // second dtype
    auto running_mean = torch::full({5}, float(r));
    auto counter = torch::full({}, std::int64_t{r} * 7, torch::kInt64);
    dist::GradientSynchronizer sync(*comm, {p, q}, 1 << 20);
    EXPECT_EQ(sync.num_buckets(), 2u); // one per dtype
    sync.broadcast_parameters(w - 1, {running_mean, counter});
    EXPECT_TRUE(torch::equal(p, torch::full({3, 2}, float(w - 1))));
    EXPECT_TRUE(torch::equal(q, torch::full({4}, double(w - 1), torch::kFloat64)));
    EXPECT_TRUE(torch::equal(running_mean, torch::full({5}, float(w - 1))));
    EXPECT_EQ(counter.item<std::int64_t>(), std::int64_t{w - 1} * 7);
    EXPECT_TRUE(p.requires_grad());
}

TEST(GradientSynchronizer, AccountsBytesCollectiveAndExposedTimePerIteration) {
    const int r = world_rank(), w = world_size();
    auto comm = mpi_communicator();
    Net model = make_net(11);
    // Cap 1024 B: buckets of 536, 18432 and 320 bytes (kCaps).
    dist::GradientSynchronizer sync(*comm, model->parameters(), 1024);
    const auto before = sync.last_iteration(); // before any iteration: zeros, one per bucket
    EXPECT_EQ(before.bytes, 0.0);
    EXPECT_EQ(before.bucket_bytes, std::vector<double>(3, 0.0));
    EXPECT_EQ(before.bucket_s, std::vector<double>(3, 0.0));
    for (int step = 0; step < 3; ++step) {
        torch::manual_seed(step);
        auto x = torch::randn({4, 1, 8, 8}, torch::kFloat64) + r;
        auto y = torch::randint(0, 3, {4}, torch::kInt64);
        model->zero_grad();
        sync.begin_iteration();
        torch::nn::functional::cross_entropy(model->forward(x), y).backward();
        const auto t0 = std::chrono::steady_clock::now();
        const double waited = sync.finish();
        const double finish_wall =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

        const dist::IterationComm it = sync.last_iteration();
        EXPECT_EQ(it.exposed_s, waited);
        EXPECT_GE(it.exposed_s, 0.0);
        EXPECT_LE(it.exposed_s, finish_wall);
        ASSERT_EQ(it.bucket_bytes.size(), 3u);
        ASSERT_EQ(it.bucket_s.size(), 3u);
        if (w > 1) {
            EXPECT_EQ(it.bucket_bytes, (std::vector<double>{536, 18432, 320}));
            EXPECT_EQ(it.bytes, 19288.0);
            EXPECT_EQ(it.bytes, double(sync.bytes_per_iteration()));
            double sum = 0;
            for (double s : it.bucket_s) {
                EXPECT_GT(s, 0.0);
                sum += s;
            }
            EXPECT_DOUBLE_EQ(it.collective_s, sum);
        } else { // one rank: nothing is communicated
            EXPECT_EQ(it.bytes, 0.0);
            EXPECT_EQ(it.collective_s, 0.0);
            EXPECT_EQ(it.bucket_bytes, std::vector<double>(3, 0.0));
        }
        // Reading twice gives the cached result.
        EXPECT_EQ(sync.last_iteration().bucket_s, it.bucket_s);
    }
}
