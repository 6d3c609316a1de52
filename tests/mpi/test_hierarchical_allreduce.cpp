// dist.allreduce=hierarchical under MPI (np 1 to 4): the two-level allreduce against MPI's own
// (flat) allreduce, over nodes emulated by an explicit node colour (one host is one node to
// MPI_Comm_split_type), its traffic pattern counted by the PMPI counter (only the leaders cross
// nodes), and the MPI communicator with it in both of its modes (with and without dist.timeout).
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "mpi_test_util.hpp"
#include "pmpi_counter.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/hierarchical_allreduce.hpp"

namespace dist = trainscope::dist;
namespace pmpi = trainscope::testing::pmpi;
using trainscope::testing::world_rank;
using trainscope::testing::world_size;

namespace {

// Node splits of the world worth checking at this size, as a colour per rank: every rank its own
// node, blocks of two (np 4: {0,1} {2,3}; np 3: {0,1} {2}), the lone rank 0 beside one node of
// the rest, and one node of all.
std::vector<std::pair<std::string, int>> node_splits() {
    const int r = world_rank();
    return {{"one rank per node", r},
            {"blocks of two", r / 2},
            {"rank 0 alone", r == 0 ? 0 : 1},
            {"one node", 0}};
}

// Whether `v` holds the same bytes on every rank.
template <class T> bool same_on_every_rank(const std::vector<T>& v) {
    std::vector<T> root = v;
    MPI_Bcast(root.data(), static_cast<int>(root.size() * sizeof(T)), MPI_BYTE, 0, MPI_COMM_WORLD);
    int same = root == v ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return same == 1;
}

} // namespace

// Integer-valued floats and integers sum exactly in any order: the two-level result must equal
// MPI_Allreduce's bit for bit, for Sum, Max and Min, on every split (uneven ones included).
TEST(HierarchicalAllreduce, EqualsTheFlatAllreduceExactlyOnIntegerValues) {
    const int r = world_rank();
    for (const auto& [name, colour] : node_splits()) {
        SCOPED_TRACE(name);
        const dist::HierarchicalAllreduce h(MPI_COMM_WORLD, colour);
        int colours = 0, mine = colour;
        // Nodes = distinct colours; here colours are 0..k-1, so the largest + 1.
        MPI_Allreduce(&mine, &colours, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        EXPECT_EQ(h.nodes(), colours + 1);
        for (const int n : {1, 7, 1000, 70000}) {
            std::vector<double> base(static_cast<std::size_t>(n));
            for (int i = 0; i < n; ++i)
                base[static_cast<std::size_t>(i)] = static_cast<double>((i % 97 - 40) * (r + 1));
            for (MPI_Op op : {MPI_SUM, MPI_MAX, MPI_MIN}) {
                std::vector<double> two_level = base, flat = base;
                h.run(two_level.data(), n, MPI_DOUBLE, op);
                MPI_Allreduce(MPI_IN_PLACE, flat.data(), n, MPI_DOUBLE, op, MPI_COMM_WORLD);
                EXPECT_EQ(two_level, flat) << "n=" << n;
                std::vector<float> f(base.begin(), base.end()), g = f;
                h.run(f.data(), n, MPI_FLOAT, op);
                MPI_Allreduce(MPI_IN_PLACE, g.data(), n, MPI_FLOAT, op, MPI_COMM_WORLD);
                EXPECT_EQ(f, g) << "float32 n=" << n;
            }
            std::vector<std::int64_t> i64(base.begin(), base.end()), flat64 = i64;
            h.run(i64.data(), n, MPI_INT64_T, MPI_SUM);
            MPI_Allreduce(MPI_IN_PLACE, flat64.data(), n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
            EXPECT_EQ(i64, flat64);
        }
    }
}

// Random fp64 data: sums formed in another order agree to rounding (1e-12 relative), and every
// rank holds the same bytes (the leader's result is broadcast), as a flat allreduce guarantees.
TEST(HierarchicalAllreduce, AgreesWithTheFlatAllreduceOnRandomDataAndAcrossRanks) {
    std::mt19937_64 rng(1234 + static_cast<unsigned>(world_rank()));
    std::normal_distribution<double> normal(0.0, 1.0);
    const int n = 4099;
    std::vector<double> base(n);
    for (double& x : base)
        x = normal(rng) * std::exp(normal(rng)); // magnitudes spread over a few decades
    for (const auto& [name, colour] : node_splits()) {
        SCOPED_TRACE(name);
        const dist::HierarchicalAllreduce h(MPI_COMM_WORLD, colour);
        std::vector<double> two_level = base, flat = base, magnitude(n);
        for (int i = 0; i < n; ++i)
            magnitude[i] = std::abs(base[i]);
        h.run(two_level.data(), n, MPI_DOUBLE, MPI_SUM);
        MPI_Allreduce(MPI_IN_PLACE, flat.data(), n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, magnitude.data(), n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        for (int i = 0; i < n; ++i) // relative to the sum of magnitudes: cancellation is no error
            ASSERT_LE(std::abs(two_level[i] - flat[i]), 1e-12 * magnitude[i]) << "element " << i;
        EXPECT_TRUE(same_on_every_rank(two_level));
    }
}

// The traffic pattern: inside a node a reduce and a broadcast, between nodes one allreduce among
// the leaders only; no collective spans the world. Needs two nodes of which one has two ranks.
TEST(HierarchicalAllreduce, OnlyTheLeadersAllreduceAcrossNodes) {
    if (world_size() < 3) GTEST_SKIP() << "needs 3 or more ranks (two nodes, one with 2 ranks)";
    const int r = world_rank();
    const dist::HierarchicalAllreduce h(MPI_COMM_WORLD, r / 2); // {0,1} {2,3}; np 3: {0,1} {2}
    EXPECT_EQ(h.nodes(), (world_size() + 1) / 2);
    EXPECT_TRUE(h.spans_shared_nodes());
    EXPECT_EQ(h.leader(), r % 2 == 0);
    std::vector<float> x(1000, 1.0f);
    pmpi::reset();
    h.run(x.data(), 1000, MPI_FLOAT, MPI_SUM);
    pmpi::stop();
    EXPECT_EQ(x[0], static_cast<float>(world_size()));
    EXPECT_TRUE(pmpi::global_counts().empty()) << pmpi::describe(pmpi::global_counts());
    std::map<std::string, long> expected;
    if (h.node_size() > 1) expected = {{"MPI_Reduce", 1}, {"MPI_Bcast", 1}};
    if (h.leader()) expected["MPI_Allreduce"] = 1;
    EXPECT_EQ(pmpi::subset_counts(), expected) << pmpi::describe(pmpi::subset_counts());
}

// The MPI communicator with dist.allreduce=hierarchical over emulated nodes of two ranks, in both
// modes (WithTimeout: large blocking and asynchronous allreduces on the progress thread, small
// ones nonblocking on the caller's thread): every allreduce path equals its closed form.
class MpiCommunicatorHierarchical : public ::testing::TestWithParam<double> {};

INSTANTIATE_TEST_SUITE_P(Modes, MpiCommunicatorHierarchical, ::testing::Values(0.0, 120.0),
                         [](const ::testing::TestParamInfo<double>& info) {
                             return info.param > 0 ? std::string("WithTimeout")
                                                   : std::string("WithoutTimeout");
                         });

TEST_P(MpiCommunicatorHierarchical, EveryAllreducePathMatchesClosedForms) {
    const dist::AllreduceOptions two_per_node{dist::AllreduceAlgorithm::Hierarchical, 2};
    auto comm = dist::make_communicator("mpi", MPI_COMM_WORLD, torch::Device(torch::kCPU),
                                        GetParam(), two_per_node);
    EXPECT_EQ(comm->allreduce_algorithm(), "hierarchical");
    const int r = world_rank(), w = world_size();
    // 10 and 40000 elements: below and above the 64 KiB of the caller-thread path (timeout mode).
    for (const std::int64_t n : {10, 40000}) {
        SCOPED_TRACE("n=" + std::to_string(n));
        const auto base = torch::arange(n, torch::kFloat64) - 5;
        auto t = (base * (r + 1)).to(torch::kFloat32);
        comm->allreduce(t, dist::ReduceOp::Sum);
        EXPECT_TRUE(torch::equal(t, (base * (w * (w + 1) / 2)).to(torch::kFloat32)));
        auto avg = (base * (r + 1)).to(torch::kFloat64);
        comm->allreduce_async(avg, dist::ReduceOp::Average)->wait();
        EXPECT_TRUE(torch::allclose(avg, base * ((w + 1) / 2.0), 0, 1e-12));
        auto mx = torch::full({n}, static_cast<std::int64_t>(r), torch::kInt64);
        comm->allreduce(mx, dist::ReduceOp::Max);
        EXPECT_EQ(mx.min().item<std::int64_t>(), w - 1);
        auto mn = torch::full({n}, static_cast<double>(r + 3), torch::kFloat64);
        comm->allreduce_async(mn, dist::ReduceOp::Min)->wait();
        EXPECT_EQ(mn.max().item<double>(), 3.0);
    }
    std::vector<double> host = {1.0, static_cast<double>(r)};
    comm->allreduce_host(host, dist::ReduceOp::Sum);
    EXPECT_EQ(host, (std::vector<double>{double(w), double(w * (w - 1) / 2)}));
    // Other collectives are untouched by the option.
    auto b = torch::full({3}, static_cast<float>(r));
    comm->broadcast(b, w - 1);
    EXPECT_EQ(b[2].item<float>(), static_cast<float>(w - 1));
}

// dist.allreduce=auto: two levels only where the ranks span several nodes and some node holds
// several of them; flat and hierarchical are taken as asked.
TEST(HierarchicalAllreduce, AutoChoosesFromTheNodeSplit) {
    const int w = world_size();
    const torch::Device cpu(torch::kCPU);
    auto algorithm = [&](dist::AllreduceAlgorithm a, int node_size) {
        return dist::make_communicator("mpi", MPI_COMM_WORLD, cpu, 0, {a, node_size})
            ->allreduce_algorithm();
    };
    using A = dist::AllreduceAlgorithm;
    // This host is one node to MPI_Comm_split_type: one node is flat.
    EXPECT_EQ(algorithm(A::Auto, 0), "flat");
    EXPECT_EQ(algorithm(A::Auto, 1), "flat"); // one rank per node
    EXPECT_EQ(algorithm(A::Auto, 2), w >= 3 ? "hierarchical" : "flat");
    EXPECT_EQ(algorithm(A::Flat, 2), "flat");
    EXPECT_EQ(algorithm(A::Hierarchical, 0), "hierarchical"); // asked for: even on one node
    EXPECT_EQ(dist::make_communicator("mpi", MPI_COMM_WORLD, cpu)->allreduce_algorithm(), "flat");
}
