// Sync batch-norm (cv.sync_bn) under MPI (np 1, 2): SyncBatchNorm2d on each rank's share of a
// joint batch must behave like one-process torch::nn::BatchNorm2d on the whole batch (outputs,
// input and parameter gradients, running statistics) for even, uneven and empty shares, NCHW and
// channels_last, float64 and float32; eval mode must not communicate; and MobileNetV2 with sync BN
// under DDP's gradient averaging must get the gradients of one process on the joint batch.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "dist_test_util.hpp"
#include "mpi_test_util.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/models/mobilenet_v2.hpp"
#include "trainscope/models/sync_batch_norm.hpp"

namespace dist = trainscope::dist;
namespace models = trainscope::models;
namespace core = trainscope::core;
using torch::Tensor;

namespace {

using trainscope::testing::world_rank;
using trainscope::testing::world_size;

using trainscope::testing::mpi_communicator;

// The allreduce the trainer passes to the model, counting its calls.
models::AllreduceSum counting_allreduce(dist::Communicator& comm, int& calls) {
    return [&comm, &calls](Tensor& t) {
        ++calls;
        comm.allreduce(t, dist::ReduceOp::Sum);
    };
}

// How a joint batch of `total` samples is split over the ranks (samples per rank).
struct Split {
    std::string name;
    std::vector<std::int64_t> counts;
    std::int64_t begin(int rank) const {
        std::int64_t b = 0;
        for (int r = 0; r < rank; ++r)
            b += counts[static_cast<std::size_t>(r)];
        return b;
    }
    std::int64_t count(int rank) const { return counts[static_cast<std::size_t>(rank)]; }
};

// even: equal shares (remainder to the last rank); uneven: rank 0 has 3 of 8 (2 ranks: 3 + 5);
// empty: rank 0 has everything, the others nothing. At 1 rank all three are the whole batch.
std::vector<Split> splits(std::int64_t total) {
    const int w = world_size();
    // `first` samples on rank 0, the rest spread over the other ranks (remainder to the last).
    auto first_then_rest = [&](std::int64_t first) {
        std::vector<std::int64_t> counts(static_cast<std::size_t>(w), 0);
        counts[0] = w == 1 ? total : first;
        const std::int64_t rest = total - counts[0];
        for (int r = 1; r < w; ++r)
            counts[static_cast<std::size_t>(r)] =
                rest / (w - 1) + (r == w - 1 ? rest % (w - 1) : 0);
        return counts;
    };
    return {{"even", first_then_rest(total / w)},
            {"uneven", first_then_rest(3)},
            {"empty", first_then_rest(total)}};
}

Tensor my_rows(const Tensor& joint, const Split& s) {
    return joint.narrow(0, s.begin(world_rank()), s.count(world_rank()));
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
    EXPECT_EQ(a.sizes(), b.sizes());
    if (a.numel() == 0) return 0.0;
    return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

// Sum over ranks of a copy of `t`.
Tensor summed(dist::Communicator& comm, const Tensor& t) {
    Tensor s = t.clone().contiguous();
    comm.allreduce(s, dist::ReduceOp::Sum);
    return s;
}

} // namespace

TEST(SyncBatchNorm, MatchesBatchNormOnTheJointBatch) {
    auto comm = mpi_communicator();
    const std::int64_t n = 8, c = 5;
    for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
        // float64: rounding only; float32: a few ulps of O(1) values through two reductions.
        const double tol = dtype == torch::kFloat64 ? 1e-10 : 2e-5;
        const auto opt = torch::TensorOptions().dtype(dtype);
        torch::manual_seed(11); // same joint data on every rank
        // Channel means 0, 3, 6, ... and spreads 0.5, 1, 1.5, ...: stats differ per channel.
        const Tensor offset = (3.0 * torch::arange(c, opt)).view({1, c, 1, 1});
        const Tensor spread = (0.5 * torch::arange(1, c + 1, opt)).view({1, c, 1, 1});
        const Tensor x1 = torch::randn({n, c, 3, 4}, opt) * spread + offset; // [8, 5, 3, 4]
        const Tensor x2 = torch::randn({n, c, 3, 4}, opt) * spread - offset; // second step
        const Tensor g = torch::randn({n, c, 3, 4}, opt); // upstream gradient dL/dy
        const Tensor w = torch::randn({c}, opt), b = torch::randn({c}, opt);

        // One process, joint batch: loss = sum(y * g).
        torch::nn::BatchNorm2d ref(c);
        ref->to(dtype);
        {
            torch::NoGradGuard no_grad;
            ref->weight.copy_(w);
            ref->bias.copy_(b);
        }
        const Tensor xr = x1.clone().requires_grad_(true);
        const Tensor yr = ref->forward(xr);
        (yr * g).sum().backward();
        ref->forward(x2);

        for (const auto& split : splits(n)) {
            for (bool channels_last : {false, true}) {
                SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + split.name +
                             (channels_last ? " channels_last" : " NCHW"));
                int calls = 0;
                models::SyncBatchNorm2d sbn(c, counting_allreduce(*comm, calls));
                sbn->to(dtype);
                {
                    torch::NoGradGuard no_grad;
                    sbn->weight.copy_(w);
                    sbn->bias.copy_(b);
                }
                const auto format = channels_last ? torch::MemoryFormat::ChannelsLast
                                                  : torch::MemoryFormat::Contiguous;
                const Tensor x = my_rows(x1, split).contiguous(format).clone().requires_grad_(true);
                const Tensor y = sbn->forward(x);
                EXPECT_EQ(calls, 1); // one fused allreduce in forward
                EXPECT_LE(max_abs_diff(y, my_rows(yr, split)), tol);
                if (channels_last && x.numel() > 0) EXPECT_TRUE(y.is_contiguous(format));

                (y * my_rows(g, split)).sum().backward();
                EXPECT_EQ(calls, 2); // and one in backward
                EXPECT_LE(max_abs_diff(x.grad(), my_rows(xr.grad(), split)), tol);
                // Weight/bias gradients are local contributions: their sum is the joint gradient.
                EXPECT_LE(max_abs_diff(summed(*comm, sbn->weight.grad()), ref->weight.grad()),
                          tol * n);
                EXPECT_LE(max_abs_diff(summed(*comm, sbn->bias.grad()), ref->bias.grad()), tol * n);

                sbn->forward(my_rows(x2, split).contiguous(format));
                EXPECT_LE(max_abs_diff(sbn->running_mean, ref->running_mean), tol);
                EXPECT_LE(max_abs_diff(sbn->running_var, ref->running_var), tol);
                EXPECT_EQ(sbn->num_batches_tracked.item<std::int64_t>(), 2);
            }
        }
    }
}

TEST(SyncBatchNorm, EvalModeUsesRunningStatsWithoutCommunication) {
    auto comm = mpi_communicator();
    const std::int64_t c = 3;
    torch::manual_seed(5);
    const auto opt = torch::TensorOptions().dtype(torch::kFloat64);
    const Tensor mean = torch::randn({c}, opt), var = torch::rand({c}, opt) + 0.5;
    const Tensor w = torch::randn({c}, opt), b = torch::randn({c}, opt);
    torch::nn::BatchNorm2d ref(c);
    int calls = 0;
    models::SyncBatchNorm2d sbn(c, counting_allreduce(*comm, calls));
    ref->to(torch::kFloat64);
    sbn->to(torch::kFloat64);
    {
        torch::NoGradGuard no_grad;
        for (auto* p : {&ref->weight, &sbn->weight})
            p->copy_(w);
        for (auto* p : {&ref->bias, &sbn->bias})
            p->copy_(b);
        for (auto* p : {&ref->running_mean, &sbn->running_mean})
            p->copy_(mean);
        for (auto* p : {&ref->running_var, &sbn->running_var})
            p->copy_(var);
    }
    ref->eval();
    sbn->eval();
    // A single value per channel is fine in eval mode (training would need more than one).
    for (auto sizes :
         {std::vector<std::int64_t>{1, c, 1, 1}, std::vector<std::int64_t>{4, c, 5, 2}}) {
        const Tensor x = torch::randn(sizes, opt);
        EXPECT_LE(max_abs_diff(sbn->forward(x), ref->forward(x)), 1e-14);
        EXPECT_LE(max_abs_diff(sbn->forward(x.contiguous(torch::MemoryFormat::ChannelsLast)),
                               ref->forward(x)),
                  1e-14);
    }
    EXPECT_EQ(calls, 0);
    EXPECT_TRUE(torch::equal(sbn->running_mean, mean)); // eval leaves running stats alone
    EXPECT_EQ(sbn->num_batches_tracked.item<std::int64_t>(), 0);
}

TEST(SyncBatchNorm, NeedsMoreThanOneValuePerChannelOverAllRanks) {
    // Every rank holds one value per channel: fine from 2 ranks on (the joint batch has w values),
    // an InputError on every rank at 1 rank, as BatchNorm2d refuses a single value.
    auto comm = mpi_communicator();
    int calls = 0;
    models::SyncBatchNorm2d sbn(4, counting_allreduce(*comm, calls));
    sbn->to(torch::kFloat64);
    const auto opt = torch::TensorOptions().dtype(torch::kFloat64);
    torch::manual_seed(100 + world_rank()); // a different value on each rank
    const Tensor x = torch::randn({1, 4, 1, 1}, opt);
    if (world_size() == 1) {
        EXPECT_THROW(sbn->forward(x), core::InputError);
    } else {
        // Each rank's output is its value standardised over the joint batch of w values: the
        // outputs sum to 0 and their squares to w * var / (var + eps), var the biased variance.
        const Tensor y = sbn->forward(x);
        const double w = world_size();
        const Tensor mean = summed(*comm, x) / w;
        const Tensor var = summed(*comm, x * x) / w - mean * mean;
        EXPECT_LE(summed(*comm, y).abs().max().item<double>(), 1e-12);
        EXPECT_LE(max_abs_diff(summed(*comm, y * y), w * var / (var + 1e-5)), 1e-10);
    }
    // Only rank 0 holds a value: the joint batch has one, every rank refuses.
    const Tensor lonely = torch::randn({world_rank() == 0 ? 1 : 0, 4, 1, 1}, opt);
    EXPECT_THROW(sbn->forward(lonely), core::InputError);
}

namespace {

// Copies every parameter and buffer of `from` into `to` by name (names must match).
void copy_state(const torch::nn::Module& from, torch::nn::Module& to) {
    torch::NoGradGuard no_grad;
    auto params = to.named_parameters();
    for (const auto& p : from.named_parameters())
        params[p.key()].copy_(p.value());
    auto buffers = to.named_buffers();
    for (const auto& b : from.named_buffers())
        buffers[b.key()].copy_(b.value());
}

} // namespace

TEST(SyncBatchNorm, MobileNetV2WithDdpAveragingMatchesOneProcessOnTheJointBatch) {
    // DDP's convention: gradients averaged over ranks. With a mean loss over equal local batches
    // (and sum * R / B_joint over unequal ones) every parameter gradient and running statistic
    // equals one process's on the joint batch with a mean loss.
    auto comm = mpi_communicator();
    const int w = world_size();
    const std::int64_t n = 4, classes = 4;
    torch::manual_seed(3);
    const auto opt = torch::TensorOptions().dtype(torch::kFloat64);
    const Tensor images = torch::randn({n, 3, 32, 32}, opt); // last block is 1x1: BN over n values
    const Tensor labels = torch::arange(n) % classes;

    models::MobileNetV2 ref(models::MobileNetV2Options{classes, 0.35, 0.0, 3});
    ref->to(torch::kFloat64);
    models::MobileNetV2 initial(models::MobileNetV2Options{classes, 0.35, 0.0, 3});
    initial->to(torch::kFloat64);
    copy_state(*ref, *initial);
    const Tensor logits_ref = ref->forward(images);
    torch::nn::functional::cross_entropy(logits_ref, labels).backward();

    for (const auto& split : splits(n)) {
        if (split.name == "empty") continue; // a mean loss over no samples is undefined
        SCOPED_TRACE(split.name);
        int calls = 0;
        models::MobileNetV2Options o{classes, 0.35, 0.0, 3};
        o.sync_bn_allreduce = counting_allreduce(*comm, calls);
        models::MobileNetV2 net(o);
        net->to(torch::kFloat64);
        copy_state(*initial, *net);

        const Tensor logits = net->forward(my_rows(images, split));
        EXPECT_LE(max_abs_diff(logits, my_rows(logits_ref, split)), 1e-10);
        const Tensor local_labels = my_rows(labels, split);
        const bool even = split.name == "even" || w == 1;
        const Tensor loss =
            even ? torch::nn::functional::cross_entropy(logits, local_labels)
                 : torch::nn::functional::cross_entropy(
                       logits, local_labels,
                       torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) *
                       (static_cast<double>(w) / n);
        loss.backward();
        EXPECT_EQ(calls, 2 * 52); // 52 batch-norm layers, one allreduce each way

        const auto ref_params = ref->named_parameters();
        for (const auto& p : net->named_parameters()) {
            Tensor grad = p.value().grad().clone();
            comm->allreduce(grad, dist::ReduceOp::Average); // what DDP does
            const Tensor& expected = ref_params[p.key()].grad();
            EXPECT_LE(max_abs_diff(grad, expected),
                      1e-10 * (1 + expected.abs().max().item<double>()))
                << p.key();
        }
        const auto ref_buffers = ref->named_buffers();
        for (const auto& b : net->named_buffers())
            EXPECT_LE(max_abs_diff(b.value(), ref_buffers[b.key()]), 1e-10) << b.key();
    }
}
