// GradientSynchronizer under MPI (np 1, 2, 4): data-parallel training with bucketed, overlapped
// gradient averaging must reproduce single-process training on the global batch (fp64, 1e-10),
// for bucket caps from "one bucket" to "one parameter per bucket", with a small first bucket, with
// gradient accumulation and with .grad living in the bucket buffers (DDP's
// gradient_as_bucket_view).
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <chrono>

#include "dist_test_util.hpp"
#include "mpi_test_util.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/gradient_synchronizer.hpp"
#include "trainscope/prof/memory.hpp"

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
    std::size_t first = dist::GradientSynchronizer::kDefaultFirstBucketBytes; // first bucket cap
};

// Parameter bytes in reverse registration order: fc2.bias 24, fc2.weight 384, fc1.bias 128,
// fc1.weight 18432, conv.bias 32, conv.weight 288.
const std::vector<CapCase> kCaps = {
    {25u << 20, {19288}, {{5, 4, 3, 2, 1, 0}}},
    {1024, {536, 18432, 320}, {{5, 4, 3}, {2}, {1, 0}}},
    {16, {24, 384, 128, 18432, 32, 288}, {{5}, {4}, {3}, {2}, {1}, {0}}}, // cap < any parameter
    // A first bucket smaller than the cap: fc2 only, then everything else.
    {25u << 20, {408, 18880}, {{5, 4}, {3, 2, 1, 0}}, /*first=*/512},
    // A first cap below any parameter: fc2.bias alone, then 1 KiB buckets.
    {1024, {24, 512, 18432, 320}, {{5}, {4, 3}, {2}, {1, 0}}, /*first=*/16},
};

// Whether `grad` lies inside `buffer` (shares its storage and its bytes are within it).
bool inside(const torch::Tensor& grad, const torch::Tensor& buffer) {
    if (!grad.defined() || !grad.is_alias_of(buffer)) return false;
    const char* g = static_cast<const char*>(grad.data_ptr());
    const char* b = static_cast<const char*>(buffer.data_ptr());
    return g >= b && g + grad.nbytes() <= b + buffer.nbytes();
}

// Every view parameter's .grad lies in its own bucket's buffer.
void expect_gradients_in_buckets(const dist::GradientSynchronizer& sync,
                                 const std::vector<torch::Tensor>& params) {
    const auto members = sync.bucket_parameters();
    for (std::size_t k = 0; k < members.size(); ++k)
        for (std::size_t i : members[k])
            if (sync.gradient_is_bucket_view(i))
                EXPECT_TRUE(inside(params[i].grad(), sync.bucket_buffer(k)))
                    << "parameter " << i << " bucket " << k;
}

} // namespace

TEST(GradientSynchronizer, DataParallelEqualsGlobalBatchTraining) {
    const int r = world_rank(), w = world_size();
    const std::int64_t B = 3; // per rank
    for (const CapCase& c : kCaps)
        for (bool set_to_none : {false, true}) {
            SCOPED_TRACE("bucket cap " + std::to_string(c.cap) + " bytes, first " +
                         std::to_string(c.first) +
                         ", zero_grad(set_to_none=" + std::to_string(set_to_none) + ")");
            auto comm = mpi_communicator();
            Net reference = make_net(7);
            Net model = make_net(7 + r); // ranks start different; broadcast_parameters fixes that
            dist::GradientSynchronizer sync(*comm, model->parameters(), c.cap, c.first);
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

                // set_to_none=true detaches .grad from the buckets; the synchronizer copies the
                // new gradients in and points .grad back at its slices.
                opt.zero_grad(set_to_none);
                sync.begin_iteration();
                auto loss = torch::nn::functional::cross_entropy(
                    model->forward(x.narrow(0, r * B, B)), y.narrow(0, r * B, B));
                loss.backward();
                EXPECT_GE(sync.finish(), 0.0);
                expect_gradients_in_buckets(sync, model->parameters());
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

TEST(GradientSynchronizer, DataParallelWithAccumulationEqualsGlobalBatchTraining) {
    // 2 micro-batches of B per rank and step; the hooks stay idle for the first one, whose
    // gradients accumulate in the bucket views, and reduce the sum after the second.
    const int r = world_rank(), w = world_size();
    const std::int64_t B = 2, A = 2;
    auto comm = mpi_communicator();
    Net reference = make_net(5);
    Net model = make_net(5 + r);
    // A tiny first cap and a 1 KiB cap: buckets {fc2.bias}, {fc2.weight, fc1.bias}, {fc1.weight},
    // {conv.bias, conv.weight}.
    dist::GradientSynchronizer sync(*comm, model->parameters(), 1024, /*first_bucket_cap=*/16);
    ASSERT_EQ(sync.num_buckets(), 4u);
    sync.broadcast_parameters(0);
    torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    std::vector<const void*> first_ptrs;
    for (int step = 0; step < 4; ++step) {
        torch::manual_seed(2000 + step);
        auto x = torch::randn({w * A * B, 1, 8, 8}, torch::kFloat64);
        auto y = torch::randint(0, 3, {w * A * B}, torch::kInt64);

        ref_opt.zero_grad(/*set_to_none=*/false);
        torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
        ref_opt.step();

        opt.zero_grad(/*set_to_none=*/false);
        for (std::int64_t a = 0; a < A; ++a) {
            const std::int64_t at = (r * A + a) * B; // this rank's a-th micro-batch
            if (a == A - 1) sync.begin_iteration();
            (torch::nn::functional::cross_entropy(model->forward(x.narrow(0, at, B)),
                                                  y.narrow(0, at, B)) /
             static_cast<double>(A))
                .backward();
        }
        sync.finish();
        EXPECT_EQ(sync.buckets_launched_in_backward(), 4u);
        expect_gradients_in_buckets(sync, model->parameters());
        // zero_grad(false) keeps the views: the same addresses every step, nothing re-pointed.
        std::vector<const void*> ptrs;
        for (const auto& p : model->parameters())
            ptrs.push_back(p.grad().data_ptr());
        if (step == 0)
            first_ptrs = ptrs;
        else
            EXPECT_EQ(ptrs, first_ptrs);
        opt.step();
    }
    EXPECT_LE(max_abs_diff(model, reference), 1e-10);
    EXPECT_GT(max_abs_diff(model, make_net(5)), 1e-3);
}

TEST(GradientSynchronizer, FirstBucketIsSmallAndHoldsTheLastParameters) {
    // float32 parameters of 300, 700, 500, 900, 400, 600, 200, 100 KiB in registration order;
    // caps 1 MiB (first, the default) and 2 MiB. In reverse order: {100, 200, 600} = 900 KiB
    // (adding 400 would pass 1 MiB), {400, 900, 500} = 1800 KiB, {700, 300} = 1000 KiB. Without
    // the small first bucket the first one would be {100, 200, 600, 400} = 1300 KiB.
    const int r = world_rank(), w = world_size();
    const std::vector<std::int64_t> kib = {300, 700, 500, 900, 400, 600, 200, 100};
    std::vector<torch::Tensor> params;
    for (std::int64_t k : kib)
        params.push_back(torch::zeros(
            {k * 256}, torch::TensorOptions().dtype(torch::kFloat32).requires_grad(true)));
    auto comm = mpi_communicator();
    const std::size_t cap = 2u << 20, first = 1u << 20;
    {
        dist::GradientSynchronizer same(*comm, params, cap, /*first_bucket_cap=*/cap);
        EXPECT_EQ(same.bucket_parameters().front(), (std::vector<std::size_t>{7, 6, 5, 4}));
    }
    dist::GradientSynchronizer sync(*comm, params, cap); // default first cap: 1 MiB
    const auto members = sync.bucket_parameters();
    const auto bytes = sync.bucket_bytes();
    EXPECT_EQ(members, (std::vector<std::vector<std::size_t>>{{7, 6, 5}, {4, 3, 2}, {1, 0}}));
    EXPECT_EQ(bytes, (std::vector<std::size_t>{900u << 10, 1800u << 10, 1000u << 10}));
    ASSERT_FALSE(bytes.empty());
    EXPECT_LE(bytes[0], first);
    for (std::size_t k = 1; k < bytes.size(); ++k)
        EXPECT_LE(bytes[k], cap) << "bucket " << k;
    // The first bucket holds a suffix of the registration order, the last parameter included.
    for (std::size_t j = 0; j < members[0].size(); ++j)
        EXPECT_EQ(members[0][j], params.size() - 1 - j);

    // One iteration: parameter i's gradient is (r + 1) * (i + 1) on rank r; averaged
    // (w + 1) / 2 * (i + 1), in place in the buckets.
    sync.begin_iteration();
    torch::Tensor loss = torch::zeros({}, torch::kFloat32);
    for (std::size_t i = 0; i < params.size(); ++i)
        loss = loss + float((r + 1) * (i + 1)) * params[i].sum();
    loss.backward();
    sync.finish();
    EXPECT_EQ(sync.buckets_launched_in_backward(), 3u);
    expect_gradients_in_buckets(sync, params);
    for (std::size_t i = 0; i < params.size(); ++i)
        EXPECT_TRUE(torch::equal(params[i].grad(),
                                 torch::full_like(params[i], (w + 1) / 2.0f * float(i + 1))))
            << "parameter " << i;
}

TEST(GradientSynchronizer, GradientsAreBucketViewsAcrossIterations) {
    const int r = world_rank(), w = world_size();
    auto comm = mpi_communicator();
    Net model = make_net(3);
    auto params = model->parameters();
    params[2].mutable_grad() = torch::full_like(params[2], 4.0); // an existing gradient is kept
    dist::GradientSynchronizer sync(*comm, params, 1024, /*first_bucket_cap=*/16);
    // Views from construction on, before any backward: zeros, or the gradient that was there.
    expect_gradients_in_buckets(sync, params);
    for (std::size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(sync.gradient_is_bucket_view(i));
        EXPECT_EQ(params[i].grad().strides(), params[i].strides());
    }
    EXPECT_TRUE(torch::equal(params[2].grad(), torch::full_like(params[2], 4.0)));
    EXPECT_TRUE(torch::equal(params[0].grad(), torch::zeros_like(params[0])));
    std::vector<const void*> ptrs;
    for (const auto& p : params)
        ptrs.push_back(p.grad().data_ptr());

    torch::optim::SGD opt(params, torch::optim::SGDOptions(0.01));
    for (int it = 0; it < 4; ++it) {
        opt.zero_grad(/*set_to_none=*/false);
        torch::manual_seed(it);
        auto x = torch::randn({2, 1, 8, 8}, torch::kFloat64) * (r + 1);
        sync.begin_iteration();
        model->forward(x).sum().backward();
        sync.finish();
        expect_gradients_in_buckets(sync, params);
        for (std::size_t i = 0; i < params.size(); ++i)
            EXPECT_EQ(params[i].grad().data_ptr(), ptrs[i]) << "iteration " << it << " param " << i;
        opt.step();
    }

    // set_to_none=true: autograd makes new gradient tensors; each hook copies its parameter's into
    // the bucket and points .grad back at its slice (same address as before); parameters without
    // a gradient stay undefined until finish() zeroes their slices. Every rank's gradient of this
    // bias-only loss is (r + 1), the average (w + 1) / 2.
    opt.zero_grad(/*set_to_none=*/true);
    EXPECT_FALSE(params[0].grad().defined());
    sync.begin_iteration();
    torch::Tensor loss = torch::zeros({}, torch::kFloat64);
    for (std::size_t i : {std::size_t{1}, std::size_t{3}, std::size_t{5}}) // the biases
        loss = loss + double(r + 1) * params[i].sum();
    loss.backward();
    for (std::size_t i = 0; i < params.size(); ++i)
        if (i % 2 == 1)
            EXPECT_EQ(params[i].grad().data_ptr(), ptrs[i]) << "re-pointed by the hook: " << i;
        else
            EXPECT_FALSE(params[i].grad().defined()) << "weight " << i;
    sync.finish();
    expect_gradients_in_buckets(sync, params);
    for (std::size_t i = 0; i < params.size(); ++i) {
        EXPECT_EQ(params[i].grad().data_ptr(), ptrs[i]) << "param " << i;
        const double expect = i % 2 == 1 ? (w + 1) / 2.0 : 0.0; // weights got no gradient
        EXPECT_TRUE(torch::equal(params[i].grad(), torch::full_like(params[i], expect)))
            << "param " << i;
    }
}

// Conv2d(2 -> 3, 3x3) on [B, 2, 6, 6], then a linear layer: a weight with more than one input
// channel, so channels_last strides differ from contiguous ones.
struct ConvNetImpl : torch::nn::Module {
    ConvNetImpl() {
        conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 3, 3)));
        fc = register_module("fc", torch::nn::Linear(3 * 4 * 4, 2));
    }
    torch::Tensor forward(torch::Tensor x) {        // x: [B, 2, 6, 6]
        return fc(torch::relu(conv(x)).flatten(1)); // [B, 2]
    }
    torch::nn::Conv2d conv{nullptr};
    torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ConvNet);

TEST(GradientSynchronizer, ChannelsLastAndNonDenseParameters) {
    const int r = world_rank(), w = world_size();
    const std::int64_t B = 2;
    auto make = [](bool channels_last) {
        torch::manual_seed(9);
        ConvNet net;
        net->to(torch::kFloat64);
        if (channels_last) {
            torch::NoGradGuard no_grad;
            net->conv->weight.set_data(
                net->conv->weight.contiguous(torch::MemoryFormat::ChannelsLast));
        }
        return net;
    };
    ConvNet reference = make(false);
    ConvNet model = make(true);
    ASSERT_FALSE(model->conv->weight.is_contiguous());
    // A leaf that is a strided slice (not dense: every other element of its storage) cannot be a
    // view with its own strides: it takes the copy path.
    torch::Tensor storage = torch::zeros({4, 8}, torch::kFloat64);
    torch::Tensor sliced = storage.narrow(1, 0, 4);
    sliced.requires_grad_(true);
    ASSERT_TRUE(sliced.is_leaf());
    ASSERT_FALSE(sliced.is_non_overlapping_and_dense());

    auto params = model->parameters();
    params.push_back(sliced);
    auto comm = mpi_communicator();
    dist::GradientSynchronizer sync(*comm, params, 1 << 20);
    const std::size_t conv_w = 0, slice_i = params.size() - 1;
    EXPECT_TRUE(sync.gradient_is_bucket_view(conv_w));
    EXPECT_FALSE(sync.gradient_is_bucket_view(slice_i));
    EXPECT_EQ(params[conv_w].grad().strides(), params[conv_w].strides()); // channels_last grad
    sync.broadcast_parameters(0);

    torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 3; ++step) {
        torch::manual_seed(3000 + step);
        auto x = torch::randn({w * B, 2, 6, 6}, torch::kFloat64);
        auto y = torch::randint(0, 2, {w * B}, torch::kInt64);
        ref_opt.zero_grad(false);
        torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
        ref_opt.step();

        opt.zero_grad(false);
        if (sliced.grad().defined()) sliced.mutable_grad().zero_();
        sync.begin_iteration();
        auto loss = torch::nn::functional::cross_entropy(model->forward(x.narrow(0, r * B, B)),
                                                         y.narrow(0, r * B, B)) +
                    double(r + 1) * sliced.sum();
        loss.backward();
        sync.finish();
        expect_gradients_in_buckets(sync, params);
        EXPECT_EQ(params[conv_w].grad().strides(), params[conv_w].strides());
        EXPECT_FALSE(inside(sliced.grad(), sync.bucket_buffer(0)));
        EXPECT_TRUE(
            torch::equal(sliced.grad(), torch::full({4, 4}, (w + 1) / 2.0, torch::kFloat64)));
        opt.step();
    }
    auto pa = model->parameters(), pb = reference->parameters();
    for (std::size_t i = 0; i < pa.size(); ++i)
        EXPECT_LE((pa[i] - pb[i]).abs().max().item<double>(), 1e-10) << "parameter " << i;
}

TEST(GradientSynchronizer, SixteenBitBucketsAreViewsAndAveraged) {
    // bfloat16 travels as float32 over MPI (a separate wire buffer); .grad is still a bf16 view.
    const int r = world_rank(), w = world_size();
    auto comm = mpi_communicator();
    auto opts = torch::TensorOptions().requires_grad(true);
    auto h = torch::zeros({8}, opts.dtype(torch::kBFloat16));
    auto f = torch::zeros({4}, opts.dtype(torch::kFloat32));
    dist::GradientSynchronizer sync(*comm, {h, f}, 1 << 20);
    ASSERT_EQ(sync.num_buckets(), 2u); // one per dtype, each its dtype's (small) first bucket
    EXPECT_EQ(sync.bucket_bytes(),
              (std::vector<std::size_t>{16, w > 1 ? std::size_t{32} : std::size_t{16}}));
    for (int it = 0; it < 2; ++it) {
        h.mutable_grad().zero_();
        f.mutable_grad().zero_();
        sync.begin_iteration();
        (double(r + 1) * (h.to(torch::kFloat32).sum() + 2.0 * f.sum())).backward();
        sync.finish();
        expect_gradients_in_buckets(sync, {h, f});
        EXPECT_EQ(h.grad().scalar_type(), torch::kBFloat16);
        // 1, 1.5 and 2.5 are exact in bfloat16.
        EXPECT_TRUE(torch::equal(h.grad(), torch::full({8}, (w + 1) / 2.0, torch::kBFloat16)));
        EXPECT_TRUE(torch::equal(f.grad(), torch::full({4}, double(w + 1), torch::kFloat32)));
    }
}

TEST(GradientSynchronizer, BuffersBesideTheGradientsAreWhatMemoryPlansCount) {
    // dist::synchronizer_buffer_bytes, the memory plans' term for the synchronizer, against the
    // host tensor counter: constructing a synchronizer allocates its buckets (the gradients) and
    // exactly that much more. Matrices PowerSGD compresses ([64, 32], a convolution's
    // [8, 4, 3, 3]) and ones it leaves whole ([48, 2] at rank 2, a vector).
    trainscope::prof::install_host_tensor_counter();
    const int w = world_size();
    auto comm = mpi_communicator();
    const std::vector<std::vector<std::int64_t>> sizes = {{64, 32}, {8, 4, 3, 3}, {16}, {48, 2}};
    using K = dist::CompressionKind;
    const std::vector<std::pair<torch::ScalarType, K>> cases = {
        {torch::kFloat32, K::None}, {torch::kBFloat16, K::None}, {torch::kFloat32, K::Fp16},
        {torch::kFloat32, K::Bf16}, {torch::kBFloat16, K::Bf16}, {torch::kFloat32, K::PowerSgd}};
    for (const auto& [dtype, kind] : cases) {
        std::vector<torch::Tensor> params;
        double numel = 0;
        for (const auto& s : sizes) {
            params.push_back(torch::zeros(s, torch::TensorOptions().dtype(dtype)).requires_grad_());
            numel += static_cast<double>(params.back().numel());
        }
        dist::CompressionOptions o;
        o.kind = kind;
        const double before = trainscope::prof::host_tensor_bytes().current;
        dist::GradientSynchronizer sync(*comm, params, 1 << 20, 1 << 20, o);
        const double grown = trainscope::prof::host_tensor_bytes().current - before;
        const double extra = dist::synchronizer_buffer_bytes(sizes, dtype, comm->backend(), w, o);
        EXPECT_EQ(grown, numel * static_cast<double>(c10::elementSize(dtype)) + extra)
            << c10::toString(dtype) << " " << dist::to_string(kind);
        if (w > 1 && (kind != K::None || dtype != torch::kFloat32))
            EXPECT_GT(extra, 0.0) << c10::toString(dtype) << " " << dist::to_string(kind);
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

        const dist::ParallelComm it = sync.last_iteration();
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

// The training loop resolves an iteration's accounting late (issue 25, point 5): the handles
// taken right after finish() know the bytes at once and, resolved after a later iteration, give
// that iteration's figures, as last_iteration() did then.
TEST(GradientSynchronizer, PendingIterationResolvesLaterToItsOwnFigures) {
    const int r = world_rank(), w = world_size();
    auto comm = mpi_communicator();
    Net model = make_net(11);
    dist::GradientSynchronizer sync(*comm, model->parameters(), 1024);
    const dist::PendingParallelComm none = sync.last_iteration_pending();
    EXPECT_EQ(none.known.bucket_bytes.size(), 3u); // one per bucket, none run yet
    EXPECT_EQ(none.known.bytes, 0.0);
    EXPECT_EQ(none.resolve().bucket_s, std::vector<double>(3, 0.0));
    std::vector<dist::PendingParallelComm> pending;
    std::vector<dist::ParallelComm> at_once;
    for (int step = 0; step < 2; ++step) {
        torch::manual_seed(step);
        auto x = torch::randn({4, 1, 8, 8}, torch::kFloat64) + r;
        auto y = torch::randint(0, 3, {4}, torch::kInt64);
        model->zero_grad();
        sync.begin_iteration();
        torch::nn::functional::cross_entropy(model->forward(x), y).backward();
        sync.finish();
        pending.push_back(sync.last_iteration_pending());
        at_once.push_back(sync.last_iteration());
        EXPECT_EQ(pending.back().known.bytes, at_once.back().bytes); // known without waiting
    }
    for (std::size_t k = 0; k < pending.size(); ++k) {
        const dist::ParallelComm later = pending[k].resolve();
        EXPECT_EQ(later.bucket_s, at_once[k].bucket_s) << "iteration " << k;
        EXPECT_EQ(later.bucket_bytes, at_once[k].bucket_bytes);
        EXPECT_EQ(later.collective_s, at_once[k].collective_s);
        EXPECT_EQ(later.exposed_s, at_once[k].exposed_s);
        if (w > 1) EXPECT_GT(later.collective_s, 0.0);
    }
}
