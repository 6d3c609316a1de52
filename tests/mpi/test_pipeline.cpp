// run.strategy=pipeline under MPI (np 2 and 4): the stage plan (contiguous, exact min-max balance,
// explicit cuts, errors), the rank layout, and the GPipe engine checked in fp64 against the unsplit
// MobileNetV2 (same seed) on the same micro-batches: gradients, loss, SGD steps, data-parallel
// replicas with GradientSynchronizer, evaluation logits; and the order in which every rank issues
// its point-to-point and data-parallel operations (recorded, 2 stages x 2 replicas).
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dist_test_util.hpp"
#include "mpi_test_util.hpp"
#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/mpi_util.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/gradient_synchronizer.hpp"
#include "trainscope/models/mobilenet_v2.hpp"
#include "trainscope/train/pipeline.hpp"

namespace core = trainscope::core;
namespace dist = trainscope::dist;
namespace models = trainscope::models;
namespace train = trainscope::train;

namespace {

using trainscope::testing::world_rank;
using trainscope::testing::world_size;

constexpr std::int64_t kImage = 32, kClasses = 10, kBatch = 8;
constexpr double kTol = 1e-10;

models::MobileNetV2Options small_options() {
    models::MobileNetV2Options o;
    o.num_classes = kClasses;
    o.width_mult = 0.25;
    o.dropout = 0.0; // dropout draws differ between one process and several
    return o;
}

// The full model as every rank builds it: same seed, fp64.
models::MobileNetV2 full_model(std::uint64_t seed = 7) {
    torch::manual_seed(seed);
    models::MobileNetV2 m(small_options());
    m->to(torch::kFloat64);
    return m;
}

struct Batch {
    torch::Tensor images, labels; // [B, 3, 32, 32] fp64, [B] int64
};
Batch make_batch(std::uint64_t seed, std::int64_t n = kBatch) {
    auto gen = at::detail::createCPUGenerator(seed);
    Batch b;
    b.images = torch::randn({n, 3, kImage, kImage}, gen, torch::kFloat64);
    b.labels = torch::randint(0, kClasses, {n}, gen, torch::kInt64);
    return b;
}

// Reference GPipe semantics on one process: the same micro-batches (torch::chunk), each loss a
// mean weighted by its share of the batch, gradients accumulated; `scale` divides every loss (for
// averaging over data-parallel replicas). Returns the batch-mean loss.
double reference_step(models::MobileNetV2& model, const Batch& b, int microbatches,
                      double scale = 1.0) {
    const auto xs = b.images.chunk(microbatches), ys = b.labels.chunk(microbatches);
    std::vector<torch::Tensor> losses;
    double total = 0;
    for (std::size_t m = 0; m < xs.size(); ++m) {
        losses.push_back(torch::nn::functional::cross_entropy(model->forward(xs[m]), ys[m]) *
                         (static_cast<double>(xs[m].size(0)) / b.images.size(0)));
        total += losses.back().item<double>();
    }
    // Backward in reverse micro-batch order, as the pipeline does: gradients accumulate in the
    // same order, so rounding agrees too and differences cannot grow over optimizer steps.
    for (auto it = losses.rbegin(); it != losses.rend(); ++it)
        (*it / scale).backward();
    return total;
}

// Largest |a - b| over the stage's named tensors against the same names in the full model;
// fails if a name is missing there.
double max_diff(const torch::OrderedDict<std::string, torch::Tensor>& stage,
                const torch::OrderedDict<std::string, torch::Tensor>& full, bool grads) {
    double worst = 0;
    for (const auto& item : stage) {
        const torch::Tensor* ref = full.find(item.key());
        if (!ref) {
            ADD_FAILURE() << item.key() << " is not a name of the unsplit model";
            return 1e300;
        }
        const torch::Tensor a = grads ? item.value().grad() : item.value();
        const torch::Tensor r = grads ? ref->grad() : *ref;
        if (!a.defined() || !r.defined()) {
            ADD_FAILURE() << item.key() << ": gradient missing";
            return 1e300;
        }
        worst = std::max(
            worst, (a.to(torch::kFloat64) - r.to(torch::kFloat64)).abs().max().item<double>());
    }
    return worst;
}

// One stage per rank of the world (stages = world size, one replica).
struct WorldPipeline {
    train::PipelinePlan plan;
    train::PipelineGroups groups;
    WorldPipeline()
        : plan(train::plan_pipeline(small_options(), kImage, world_size(),
                                    train::PipelineBalance::Flops)),
          groups(train::make_pipeline_groups(MPI_COMM_WORLD, world_size(), "mpi",
                                             torch::Device(torch::kCPU))) {}
};

} // namespace

// ---- plan
// ----------------------------------------------------------------------------------------

TEST(PipelinePlan, UnitsMatchTheModelsShapesParametersAndCost) {
    const auto o = small_options();
    const auto plan = train::plan_pipeline(o, kImage, 2, train::PipelineBalance::Flops);
    ASSERT_EQ(plan.units.size(), static_cast<std::size_t>(train::kPipelineUnits));
    auto model = full_model();
    model->eval();
    torch::NoGradGuard no_grad;
    // Every feature unit's output shape is what the real layer produces.
    auto h = torch::zeros({2, 3, kImage, kImage}, torch::kFloat64);
    for (int u = 0; u + 1 < train::kPipelineUnits; ++u) {
        h = (model->features->begin() + u)->forward(h);
        std::vector<std::int64_t> expected(h.sizes().begin() + 1, h.sizes().end());
        EXPECT_EQ(plan.units[u].output, expected) << plan.units[u].name;
        EXPECT_EQ(plan.units[u].params, models::count_parameters(*model->features->ptr(u)));
        EXPECT_EQ(plan.units[u].name, "features." + std::to_string(u));
    }
    EXPECT_EQ(plan.units.back().name, "head");
    EXPECT_EQ(plan.units.back().output, std::vector<std::int64_t>{kClasses});
    std::int64_t params = 0, macs = 0;
    for (const auto& u : plan.units) {
        params += u.params;
        macs += u.macs;
        EXPECT_GT(u.macs, 0) << u.name;
    }
    EXPECT_EQ(params, models::count_parameters(*model));
    // The per-unit walk over convolutions agrees with the model's own whole-network count.
    EXPECT_EQ(macs, models::mobilenet_v2_cost(o, kImage).macs);
    EXPECT_EQ(models::mobilenet_v2_cost(o, 64).macs, [&] {
        std::int64_t s = 0;
        for (const auto& u : train::plan_pipeline(o, 64, 2, train::PipelineBalance::Flops).units)
            s += u.macs;
        return s;
    }());
}

TEST(PipelinePlan, BalancedSplitsAreContiguousAndMinimiseTheLargestStage) {
    const auto o = small_options();
    for (auto balance : {train::PipelineBalance::Params, train::PipelineBalance::Flops}) {
        for (int stages = 2; stages <= 5; ++stages) {
            SCOPED_TRACE(std::string(train::to_string(balance)) + " stages " +
                         std::to_string(stages));
            const auto plan = train::plan_pipeline(o, kImage, stages, balance);
            ASSERT_EQ(plan.num_stages(), stages);
            EXPECT_FALSE(plan.explicit_cuts);
            std::vector<std::int64_t> cost;
            for (const auto& u : plan.units)
                cost.push_back(balance == train::PipelineBalance::Params ? u.params : u.macs);
            std::int64_t largest = 0;
            int next = 0;
            for (int s = 0; s < stages; ++s) {
                const auto& st = plan.stages[s];
                EXPECT_EQ(st.first_unit, next);
                EXPECT_LE(st.first_unit, st.last_unit);
                ASSERT_EQ(st.unit_names.size(),
                          static_cast<std::size_t>(st.last_unit - st.first_unit + 1));
                EXPECT_EQ(st.unit_names.front(), plan.units[st.first_unit].name);
                std::int64_t c = 0, p = 0;
                for (int u = st.first_unit; u <= st.last_unit; ++u) {
                    c += cost[u];
                    p += plan.units[u].params;
                }
                EXPECT_EQ(st.params, p);
                EXPECT_EQ(st.input,
                          st.first_unit == 0 ? plan.input : plan.units[st.first_unit - 1].output);
                EXPECT_EQ(st.output, plan.units[st.last_unit].output);
                largest = std::max(largest, c);
                next = st.last_unit + 1;
            }
            EXPECT_EQ(next, train::kPipelineUnits);
            if (stages > 4) continue;
            // Brute force over every placement of the cuts: nothing beats the plan's largest
            // stage.
            std::int64_t best = INT64_MAX;
            std::vector<int> cuts(stages - 1);
            std::function<void(int, int)> search = [&](int k, int from) {
                if (k == stages - 1) {
                    std::int64_t worst = 0;
                    for (int s = 0; s < stages; ++s) {
                        const int a = s == 0 ? 0 : cuts[s - 1];
                        const int b = s == stages - 1 ? train::kPipelineUnits : cuts[s];
                        std::int64_t c = 0;
                        for (int u = a; u < b; ++u)
                            c += cost[u];
                        worst = std::max(worst, c);
                    }
                    best = std::min(best, worst);
                    return;
                }
                for (int c = from; c < train::kPipelineUnits; ++c) {
                    cuts[k] = c;
                    search(k + 1, c + 1);
                }
            };
            search(0, 1);
            EXPECT_EQ(largest, best);
        }
    }
}

TEST(PipelinePlan, ExplicitCutsAndTheirErrors) {
    const auto o = small_options();
    const auto plan = train::plan_pipeline(o, kImage, 3, train::PipelineBalance::Params, " 5,12");
    EXPECT_TRUE(plan.explicit_cuts);
    ASSERT_EQ(plan.num_stages(), 3);
    EXPECT_EQ(plan.stages[0].first_unit, 0);
    EXPECT_EQ(plan.stages[0].last_unit, 4);
    EXPECT_EQ(plan.stages[1].first_unit, 5);
    EXPECT_EQ(plan.stages[1].last_unit, 11);
    EXPECT_EQ(plan.stages[2].first_unit, 12);
    EXPECT_EQ(plan.stages[2].last_unit, 19);
    EXPECT_EQ(plan.stages[2].unit_names.back(), "head");
    const auto last = train::plan_pipeline(o, kImage, 2, train::PipelineBalance::Flops, "19");
    EXPECT_EQ(last.stages[1].unit_names, std::vector<std::string>{"head"});

    for (const std::string bad :
         {"5", "5,12,15", "12,5", "5,5", "0,5", "5,20", "a,5", "5,,7", "5,12,", "-3,5", "5;12"}) {
        try {
            train::plan_pipeline(o, kImage, 3, train::PipelineBalance::Flops, bad);
            ADD_FAILURE() << "pipeline.cuts='" << bad << "' must be rejected";
        } catch (const core::ConfigError& e) {
            const std::string m = e.what();
            EXPECT_EQ(m.rfind("pipeline.cuts = '" + bad + "': ", 0), 0u) << m;
            EXPECT_NE(m.find("give 2 strictly increasing unit indices in [1, 19]"),
                      std::string::npos)
                << m;
        }
    }
    try {
        train::plan_pipeline(o, kImage, 21, train::PipelineBalance::Flops);
        ADD_FAILURE() << "21 stages must be rejected";
    } catch (const core::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("pipeline.stages=21"), std::string::npos);
        EXPECT_NE(std::string(e.what()).find("use 2..20"), std::string::npos);
    }
    EXPECT_EQ(train::plan_pipeline(o, kImage, 20, train::PipelineBalance::Flops).num_stages(), 20);
}

TEST(PipelinePlan, ReplicasDescribeAndOptions) {
    EXPECT_EQ(train::pipeline_replicas(8, 4), 2);
    EXPECT_EQ(train::pipeline_replicas(2, 2), 1);
    try {
        train::pipeline_replicas(6, 4);
        ADD_FAILURE() << "6 ranks cannot hold 4-stage pipelines";
    } catch (const core::ConfigError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("pipeline.stages=4"), std::string::npos) << m;
        EXPECT_NE(m.find("6 ranks were launched: launch 4, 8, ... ranks"), std::string::npos) << m;
        EXPECT_NE(m.find("divisor of 6 (2, 3, 6)"), std::string::npos) << m;
    }

    // Planning builds a model but leaves the global random stream where it was.
    torch::manual_seed(3);
    const auto a = torch::randn({4});
    torch::manual_seed(3);
    const auto plan =
        train::plan_pipeline(small_options(), kImage, 3, train::PipelineBalance::Flops);
    EXPECT_TRUE(torch::equal(a, torch::randn({4})));

    const std::string text = train::describe(plan);
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3 + 3); // title, header, stages, total
    EXPECT_NE(text.find("balanced by flops"), std::string::npos) << text;
    EXPECT_NE(text.find("(features.0.."), std::string::npos) << text;
    EXPECT_NE(text.find("..head)"), std::string::npos) << text;
    EXPECT_NE(text.find(std::to_string(plan.stages[1].params)), std::string::npos) << text;

    core::OptionRegistry reg;
    train::declare_pipeline_options(reg);
    auto cfg = core::Config::from_values(reg, {});
    auto po = train::PipelineOptions::from_config(cfg);
    EXPECT_EQ(po.stages, 2);
    EXPECT_EQ(po.microbatches, 4);
    EXPECT_EQ(po.balance, train::PipelineBalance::Flops);
    EXPECT_EQ(po.cuts, "");
    po = train::PipelineOptions::from_config(core::Config::from_values(
        reg, {{"pipeline.stages", "3"}, {"pipeline.balance", "params"}, {"pipeline.cuts", "4,9"}}));
    EXPECT_EQ(po.stages, 3);
    EXPECT_EQ(po.balance, train::PipelineBalance::Params);
    EXPECT_EQ(po.cuts, "4,9");
    EXPECT_THROW(core::Config::from_values(reg, {{"pipeline.stages", "1"}}), core::ConfigError);
    EXPECT_THROW(core::Config::from_values(reg, {{"pipeline.microbatches", "0"}}),
                 core::ConfigError);
    EXPECT_THROW(core::Config::from_values(reg, {{"pipeline.balance", "layers"}}),
                 core::ConfigError);
}

// ---- groups and stage module -----------------------------------------------------------------

TEST(PipelineGroups, StageMajorLayoutWithinReplicas) {
    const int r = world_rank(), w = world_size();
    for (int stages : {2, w}) {
        auto g =
            train::make_pipeline_groups(MPI_COMM_WORLD, stages, "mpi", torch::Device(torch::kCPU));
        EXPECT_EQ(g.stage, r % stages);
        EXPECT_EQ(g.replica, r / stages);
        EXPECT_EQ(g.replicas, w / stages);
        ASSERT_EQ(g.pipe->size(), stages);
        EXPECT_EQ(g.pipe->rank(), g.stage);
        ASSERT_EQ(g.dp->size(), w / stages);
        EXPECT_EQ(g.dp->rank(), g.replica);
        // Who is in which group: the world ranks gathered in group order.
        auto mine = torch::full({1}, r, torch::kInt64);
        auto pipe_ranks = torch::zeros({stages}, torch::kInt64);
        g.pipe->allgather(mine, pipe_ranks);
        EXPECT_TRUE(torch::equal(pipe_ranks, torch::arange(stages) + g.replica * stages));
        auto dp_ranks = torch::zeros({w / stages}, torch::kInt64);
        g.dp->allgather(mine, dp_ranks);
        EXPECT_TRUE(torch::equal(dp_ranks, torch::arange(w / stages) * stages + g.stage));
    }
    if (w % 3 != 0)
        EXPECT_THROW(
            train::make_pipeline_groups(MPI_COMM_WORLD, 3, "mpi", torch::Device(torch::kCPU)),
            core::ConfigError);
}

TEST(PipelineStage, KeepsItsUnitsUnderTheFullModelsNames) {
    WorldPipeline wp;
    auto full = full_model();
    train::PipelineStage stage(full, wp.plan, wp.groups.stage);
    const auto& sp = wp.plan.stages[wp.groups.stage];
    std::int64_t mine = models::count_parameters(*stage);
    EXPECT_EQ(mine, sp.params);
    EXPECT_EQ(stage->has_head(), sp.last_unit == train::kPipelineUnits - 1);
    // Shared with the full model, not copied.
    const auto full_params = full->named_parameters();
    for (const auto& p : stage->named_parameters()) {
        const torch::Tensor* f = full_params.find(p.key());
        ASSERT_NE(f, nullptr) << p.key();
        EXPECT_EQ(f->data_ptr(), p.value().data_ptr()) << p.key();
    }
    EXPECT_FALSE(stage->named_buffers().is_empty()); // batch-norm statistics come along
    // The stages together hold the whole model exactly once.
    std::int64_t total = 0;
    MPI_Allreduce(&mine, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(total, models::count_parameters(*full));
}

// ---- GPipe engine ---------------------------------------------------------------------------

TEST(PipelineEngine, MicrobatchSizesFollowTorchChunk) {
    WorldPipeline wp;
    train::PipelineStage stage(full_model(), wp.plan, wp.groups.stage);
    for (int m : {1, 2, 3, 4, 5, 7, 8, 11}) {
        train::PipelineEngine engine(stage, wp.plan, *wp.groups.pipe, m, kBatch);
        for (std::int64_t b : {1, 5, 8, 13}) {
            std::vector<std::int64_t> expected;
            for (const auto& c : torch::zeros({b}).chunk(m))
                expected.push_back(c.size(0));
            EXPECT_EQ(engine.microbatch_sizes(b), expected) << "M=" << m << " B=" << b;
        }
    }
}

// (a) gradients and (c) loss of one step equal the unsplit model's, M = 1, 3 (uneven last
// micro-batch) and 5 (fewer chunks than asked: 2+2+2+2). Stages between the first and the last
// get neither images nor labels (np 4): they size buffers from the plan and the batch size.
TEST(PipelineEngine, GradientsAndLossEqualTheUnsplitModel) {
    WorldPipeline wp;
    const auto batch = make_batch(11);
    for (int m : {1, 3, 5}) {
        SCOPED_TRACE("microbatches " + std::to_string(m));
        train::PipelineStage stage(full_model(), wp.plan, wp.groups.stage);
        train::PipelineEngine engine(stage, wp.plan, *wp.groups.pipe, m, kBatch);
        int forwards_done = 0;
        const auto loss = engine.step(engine.is_first() ? batch.images : torch::Tensor(),
                                      engine.is_last() ? batch.labels : torch::Tensor(), 0,
                                      [&] { ++forwards_done; });
        EXPECT_EQ(forwards_done, 1);

        auto ref = full_model();
        const double ref_loss = reference_step(ref, batch, m);
        EXPECT_LE(max_diff(stage->named_parameters(), ref->named_parameters(), true), kTol);
        if (engine.is_last()) {
            ASSERT_TRUE(loss.defined());
            EXPECT_EQ(loss.dim(), 0);
            EXPECT_FALSE(loss.requires_grad());
            EXPECT_NEAR(loss.item<double>(), ref_loss, 1e-12);
        } else {
            EXPECT_FALSE(loss.defined());
        }
        // Batch-norm running statistics were updated per micro-batch, as in the reference.
        EXPECT_LE(max_diff(stage->named_buffers(), ref->named_buffers(), false), kTol);
    }
}

// (b) three SGD steps (momentum, weight decay) keep the split parameters equal to the unsplit
// model's; (f) afterwards, evaluation logits equal the unsplit model's in eval mode.
TEST(PipelineEngine, SgdStepsAndEvaluationMatchTheUnsplitModel) {
    WorldPipeline wp;
    const int m = 3;
    auto sgd = [](std::vector<torch::Tensor> params) {
        return torch::optim::SGD(params,
                                 torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4));
    };
    train::PipelineStage stage(full_model(), wp.plan, wp.groups.stage);
    train::PipelineEngine engine(stage, wp.plan, *wp.groups.pipe, m, kBatch);
    auto ref = full_model();
    auto opt = sgd(stage->parameters());
    auto ref_opt = sgd(ref->parameters());
    for (int step = 0; step < 3; ++step) {
        const auto batch = make_batch(100 + step);
        opt.zero_grad();
        ref_opt.zero_grad();
        // Every stage may pass the whole batch: each uses only what its position needs.
        const auto loss = engine.step(batch.images, batch.labels);
        const double ref_loss = reference_step(ref, batch, m);
        if (engine.is_last()) EXPECT_NEAR(loss.item<double>(), ref_loss, 1e-12) << step;
        opt.step();
        ref_opt.step();
    }
    EXPECT_LE(max_diff(stage->named_parameters(), ref->named_parameters(), false), kTol);
    EXPECT_LE(max_diff(stage->named_buffers(), ref->named_buffers(), false), kTol);
    // The parameters moved (the comparison above is not trivially between initial values).
    auto initial = full_model();
    EXPECT_GT(max_diff(stage->named_parameters(), initial->named_parameters(), false), 1e-4);

    stage->eval();
    ref->eval();
    const auto batch = make_batch(200, 7); // 3+3+1 micro-batches
    const auto logits = engine.forward_only(engine.is_first() ? batch.images : torch::Tensor(), 7);
    torch::NoGradGuard no_grad;
    const auto expected = ref->forward(batch.images);
    if (engine.is_last()) {
        ASSERT_TRUE(logits.defined());
        ASSERT_EQ(logits.sizes(), expected.sizes());
        EXPECT_LE((logits - expected).abs().max().item<double>(), kTol);
    } else {
        EXPECT_FALSE(logits.defined());
    }
}

// (d) 2 stages x 2 replicas: each replica runs its half of a joint batch through its pipeline;
// a GradientSynchronizer over the data-parallel communicator, armed after the step (pipeline.cpp:
// the allreduces follow the step's point-to-point on every rank), averages the stage gradients
// across replicas: they equal the unsplit model's gradients of the joint batch's per-replica
// micro-batches, averaged over replicas.
TEST(PipelineEngine, DataParallelReplicasAverageGradients) {
    if (world_size() != 4) GTEST_SKIP() << "needs 2 stages x 2 replicas = 4 ranks";
    const int stages = 2, m = 3;
    const auto plan =
        train::plan_pipeline(small_options(), kImage, stages, train::PipelineBalance::Params);
    auto g = train::make_pipeline_groups(MPI_COMM_WORLD, stages, "mpi", torch::Device(torch::kCPU));
    ASSERT_EQ(g.replicas, 2);
    std::vector<Batch> halves{make_batch(31), make_batch(32)};
    const Batch& mine = halves[g.replica];

    train::PipelineStage stage(full_model(), plan, g.stage);
    train::PipelineEngine engine(stage, plan, *g.pipe, m, kBatch);
    dist::GradientSynchronizer sync(*g.dp, stage->parameters(), /*bucket_cap_bytes=*/16 * 1024);
    ASSERT_GT(sync.num_buckets(), 1u);
    for (int step = 0; step < 2; ++step) { // twice: the synchronizer is re-armed cleanly
        stage->zero_grad();
        const auto loss = engine.step(engine.is_first() ? mine.images : torch::Tensor(),
                                      engine.is_last() ? mine.labels : torch::Tensor());
        sync.begin_iteration();
        sync.finish();
        EXPECT_EQ(sync.buckets_launched_in_backward(), 0u);
        EXPECT_EQ(sync.buckets_launched_in_finish(), sync.num_buckets());

        auto ref = full_model();
        double local_loss = 0;
        for (int rep = 0; rep < 2; ++rep) {
            const double l = reference_step(ref, halves[rep], m, /*scale=*/2.0);
            if (rep == g.replica) local_loss = l;
        }
        EXPECT_LE(max_diff(stage->named_parameters(), ref->named_parameters(), true), kTol);
        if (engine.is_last()) EXPECT_NEAR(loss.item<double>(), local_loss, 1e-12);
    }
}

// Issue 25, point 10: the order of every rank's operations over the two communicators, recorded
// at 2 stages x 2 replicas (and 4 stages x 1 replica, whose middle stages batch a send with a
// receive), two steps each, as the trainer drives them (buffer broadcast, step, then the
// gradient allreduce):
//   - each step's point-to-point operations all come before its data-parallel allreduces, on
//     every rank (one global order of the two communicators: no NCCL deadlock);
//   - the data-parallel operations are the same sequence (kind and size) on every replica of a
//     stage;
//   - between neighbours, sends match receives one for one, in order and size;
//   - a batch holds at most one send and one receive, and a middle stage's steady-state batches
//     pair a send with a receive (no send waits for the next receive behind it).
TEST(PipelineEngine, PointToPointThenAllreduceInOneOrderOnEveryRank) {
    if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
    const int m = 3;
    for (int stages : {2, 4}) {
        SCOPED_TRACE("stages " + std::to_string(stages));
        const auto plan =
            train::plan_pipeline(small_options(), kImage, stages, train::PipelineBalance::Params);
        auto g =
            train::make_pipeline_groups(MPI_COMM_WORLD, stages, "mpi", torch::Device(torch::kCPU));
        trainscope::testing::OperationLog log;
        trainscope::testing::RecordingCommunicator pipe(*g.pipe, "pipe", log);
        trainscope::testing::RecordingCommunicator dp(*g.dp, "dp", log);
        train::PipelineStage stage(full_model(), plan, g.stage);
        train::PipelineEngine engine(stage, plan, pipe, m, kBatch);
        dist::GradientSynchronizer sync(dp, stage->parameters(), /*bucket_cap_bytes=*/16 * 1024);
        const Batch batch = make_batch(41 + static_cast<std::uint64_t>(g.replica));
        for (int step = 0; step < 2; ++step) {
            stage->zero_grad();
            if (g.replicas > 1) { // the trainer's batch-norm buffer broadcast, before the step
                torch::Tensor buffers = torch::zeros({5}, torch::kFloat64);
                dp.broadcast(buffers, 0);
            }
            engine.step(batch.images, batch.labels);
            sync.begin_iteration();
            sync.finish();
        }

        // This rank: runs of operations per communicator, in issue order.
        const std::vector<trainscope::testing::RecordedOp> mine = log.ops();
        std::vector<std::string> runs;
        for (const auto& op : mine)
            if (runs.empty() || runs.back() != op.comm) runs.push_back(op.comm);
        const std::vector<std::string> expected =
            g.replicas > 1 ? std::vector<std::string>{"dp", "pipe", "dp", "dp", "pipe", "dp"}
                           : std::vector<std::string>{"pipe"};
        // Runs of the same communicator merge: [dp bcast][pipe step][dp allreduce][dp bcast]...
        std::vector<std::string> merged;
        for (const auto& r : expected)
            if (merged.empty() || merged.back() != r) merged.push_back(r);
        EXPECT_EQ(runs, merged);
        // Batches: at most one send and one receive each.
        std::map<int, std::pair<int, int>> per_batch; // batch -> (sends, recvs)
        for (const auto& op : mine)
            if (op.comm == "pipe") {
                auto& [sends, recvs] = per_batch[op.batch];
                (op.op == "send" ? sends : recvs) += 1;
            }
        int paired = 0;
        for (const auto& [batch_id, count] : per_batch) {
            EXPECT_LE(count.first, 1) << "batch " << batch_id;
            EXPECT_LE(count.second, 1) << "batch " << batch_id;
            paired += count.first == 1 && count.second == 1;
        }
        const bool middle = g.stage > 0 && g.stage < stages - 1;
        // Per step: m - 1 forward and m - 1 backward batches pair a send with a receive.
        if (middle) EXPECT_EQ(paired, 2 * 2 * (m - 1));

        // Every rank's log, to compare with its peers'.
        const std::vector<std::string> all = core::allgather_strings(MPI_COMM_WORLD, log.text());
        auto log_of = [&](int replica, int st) {
            return trainscope::testing::OperationLog::parse(
                all[static_cast<std::size_t>(replica * stages + st)]);
        };
        auto dp_sequence = [](const std::vector<trainscope::testing::RecordedOp>& ops) {
            std::vector<std::string> seq;
            for (const auto& op : ops)
                if (op.comm == "dp") seq.push_back(op.op + ":" + std::to_string(op.numel));
            return seq;
        };
        const auto dp_mine = dp_sequence(mine);
        if (g.replicas > 1) EXPECT_FALSE(dp_mine.empty());
        for (int r = 0; r < g.replicas; ++r)
            EXPECT_EQ(dp_sequence(log_of(r, g.stage)), dp_mine) << "replica " << r;
        // Sends from stage a to stage b, and receives of b from a, in order (element counts).
        auto p2p = [&](int replica, int from, int to, const char* kind) {
            const auto ops = log_of(replica, std::string(kind) == "send" ? from : to);
            const int peer = std::string(kind) == "send" ? to : from;
            std::vector<std::int64_t> sizes;
            for (const auto& op : ops)
                if (op.comm == "pipe" && op.op == kind && op.peer == peer)
                    sizes.push_back(op.numel);
            return sizes;
        };
        for (int st = 0; st + 1 < stages; ++st) {
            const auto forward = p2p(g.replica, st, st + 1, "send");
            EXPECT_EQ(forward.size(), static_cast<std::size_t>(2 * m));
            EXPECT_EQ(forward, p2p(g.replica, st, st + 1, "recv")) << "stage " << st << " -> +1";
            const auto backward = p2p(g.replica, st + 1, st, "send");
            EXPECT_EQ(backward.size(), static_cast<std::size_t>(2 * m));
            EXPECT_EQ(backward, p2p(g.replica, st + 1, st, "recv"))
                << "stage " << st + 1 << " -> -1";
        }
    }
}
