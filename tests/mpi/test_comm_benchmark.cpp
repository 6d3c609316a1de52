// The communication benchmark at 2 and 4 ranks: the sweep and per-rank rounding give nccl-tests'
// byte counts, busbw / algbw is exactly each collective's factor, every rank reports the same
// table, and /comm reads back with units. Timing values are only checked to be sane (positive,
// max >= mean): their size depends on the machine.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "dist_test_util.hpp"
#include "h5_test_util.hpp"
#include "mpi_test_util.hpp"
#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/distributed/comm_benchmark.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/options.hpp"
#include "trainscope/io/run_file.hpp"
#include "trainscope/prof/phase_timer.hpp"
#include "trainscope/train/recorder.hpp"
#include "trainscope/train/run_file_tables.hpp"

namespace dist = trainscope::dist;
namespace core = trainscope::core;
namespace io = trainscope::io;
namespace prof = trainscope::prof;
namespace train = trainscope::train;
using dist::Collective;

namespace {

using trainscope::testing::world_rank;
using trainscope::testing::world_size;

using trainscope::testing::mpi_communicator;

core::Config config_with(const std::map<std::string, std::string>& values) {
    // The Config refers to its registry: it must outlive every Config made here.
    static const core::OptionRegistry registry = [] {
        core::OptionRegistry r;
        dist::declare_options(r);
        return r;
    }();
    return core::Config::from_values(registry, values);
}

dist::CommBenchmarkOptions small_sweep() {
    return dist::CommBenchmarkOptions::from_config(config_with({{"comm.min_bytes", "8"},
                                                                {"comm.max_bytes", "4096"},
                                                                {"comm.warmup", "1"},
                                                                {"comm.iters", "3"}}));
}

std::vector<double> read_doubles(hid_t file, const std::string& path) {
    return trainscope::testing::read_dataset<double>(file, path, H5T_NATIVE_DOUBLE);
}

std::string read_string_attr(hid_t file, const std::string& obj, const std::string& name) {
    const hid_t a = H5Aopen_by_name(file, obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0) return "<missing>";
    const hid_t t = H5Aget_type(a);
    char* text = nullptr;
    H5Aread(a, t, &text);
    std::string out = text ? text : "";
    H5free_memory(text);
    H5Tclose(t);
    H5Aclose(a);
    return out;
}

double read_double_attr(hid_t file, const std::string& obj, const std::string& name) {
    double v = -1;
    const hid_t a = H5Aopen_by_name(file, obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0) return v;
    H5Aread(a, H5T_NATIVE_DOUBLE, &v);
    H5Aclose(a);
    return v;
}

} // namespace

TEST(CommBenchmarkOptions, DefaultsAndSweep) {
    const auto o = dist::CommBenchmarkOptions::from_config(config_with({}));
    EXPECT_EQ(o.min_bytes, 8);
    EXPECT_EQ(o.max_bytes, 268435456);
    EXPECT_EQ(o.warmup, 5);
    EXPECT_EQ(o.iters, 20);
    EXPECT_EQ(o.dtype, torch::kFloat32);
    EXPECT_EQ(o.ops, (std::vector<Collective>{Collective::AllReduce, Collective::AllGather,
                                              Collective::ReduceScatter, Collective::Broadcast}));
    const auto sizes = o.sizes(); // 8 B = 2^3 ... 256 MiB = 2^28
    ASSERT_EQ(sizes.size(), 26u);
    for (std::size_t k = 0; k < sizes.size(); ++k)
        EXPECT_EQ(sizes[k], std::int64_t{8} << k);

    const auto odd = dist::CommBenchmarkOptions::from_config(
        config_with({{"comm.min_bytes", "100"},
                     {"comm.max_bytes", "1000"},
                     {"comm.factor", "3"},
                     {"comm.ops", " broadcast , allreduce"}}));
    EXPECT_EQ(odd.sizes(), (std::vector<std::int64_t>{100, 300, 900}));
    EXPECT_EQ(odd.ops, (std::vector<Collective>{Collective::Broadcast, Collective::AllReduce}));
}

TEST(CommBenchmarkOptions, RejectsImpossibleValuesNamingTheOption) {
    auto message = [](const std::map<std::string, std::string>& values) {
        try {
            dist::CommBenchmarkOptions::from_config(config_with(values));
        } catch (const core::ConfigError& e) {
            return std::string(e.what());
        }
        return std::string("no ConfigError");
    };
    EXPECT_NE(message({{"comm.min_bytes", "64"}, {"comm.max_bytes", "32"}}).find("comm.max_bytes"),
              std::string::npos);
    EXPECT_NE(message({{"comm.factor", "1"}}).find("comm.factor"), std::string::npos);
    EXPECT_NE(message({{"comm.ops", "allreduce,alltoall"}}).find("'alltoall'"), std::string::npos);
    EXPECT_NE(message({{"comm.ops", " , "}}).find("comm.ops"), std::string::npos);
}

TEST(CommBenchmark, CountsRoundDownToWholeElementsPerRank) {
    // float32: 4-byte elements. allreduce/broadcast keep every whole element; allgather and
    // reduce_scatter give each rank count / ranks elements.
    EXPECT_EQ(dist::comm_benchmark_count(Collective::AllReduce, 8, 4, 4), 2);
    EXPECT_EQ(dist::comm_benchmark_count(Collective::Broadcast, 10, 4, 4), 2);
    EXPECT_EQ(dist::comm_benchmark_count(Collective::AllGather, 8, 4, 4), 0); // skipped
    EXPECT_EQ(dist::comm_benchmark_count(Collective::AllGather, 8, 4, 2), 2);
    EXPECT_EQ(dist::comm_benchmark_count(Collective::ReduceScatter, 40, 4, 4), 8);
    EXPECT_EQ(dist::comm_benchmark_count(Collective::ReduceScatter, 40, 4, 3), 9);
    EXPECT_EQ(dist::comm_benchmark_count(Collective::AllGather, 1 << 20, 8, 3), 131070);
}

TEST(CommBenchmark, ByteCountsAndBusFactorsAtThisRankCount) {
    const int n = world_size();
    auto comm = mpi_communicator();
    const dist::CommBenchmark bench(small_sweep());
    const auto results = bench.run(*comm);

    // Expected table: sizes 8 .. 4096 (x2), float32, per-rank rounding for allgather/
    // reduce_scatter (at 4 ranks 8 B is 2 elements, fewer than one per rank: skipped).
    std::vector<std::pair<Collective, std::int64_t>> expected;
    for (Collective op : bench.options().ops)
        for (std::int64_t bytes = 8; bytes <= 4096; bytes *= 2) {
            const std::int64_t count = dist::comm_benchmark_count(op, bytes, 4, n);
            if (count > 0) expected.emplace_back(op, count);
        }
    ASSERT_EQ(results.size(), expected.size());
    const double factors[] = {2.0 * (n - 1) / n, double(n - 1) / n, double(n - 1) / n, 1.0};
    for (std::size_t k = 0; k < results.size(); ++k) {
        const auto& r = results[k];
        SCOPED_TRACE(std::string(dist::to_string(r.op)) + " " + std::to_string(r.bytes) + " B");
        EXPECT_EQ(r.op, expected[k].first);
        EXPECT_EQ(r.count, expected[k].second);
        EXPECT_EQ(r.bytes, 4 * r.count);
        if (r.op == Collective::AllGather || r.op == Collective::ReduceScatter)
            EXPECT_EQ(r.count % n, 0);
        EXPECT_GT(r.time_s, 0);
        EXPECT_GE(r.time_max_s, r.time_s * (1 - 1e-12));
        EXPECT_DOUBLE_EQ(r.algbw_GBps, r.bytes / r.time_s / 1e9);
        EXPECT_DOUBLE_EQ(r.busbw_GBps, r.algbw_GBps * factors[static_cast<int>(r.op)]);
    }
    // Ranks agree on the whole table (times combined over ranks inside run()).
    std::vector<double> mine;
    for (const auto& r : results)
        mine.insert(mine.end(), {double(r.bytes), r.time_s, r.time_max_s, r.busbw_GBps});
    std::vector<double> lo(mine.size()), hi(mine.size());
    MPI_Allreduce(mine.data(), lo.data(), int(mine.size()), MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(mine.data(), hi.data(), int(mine.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    EXPECT_EQ(lo, hi);
    // The benchmark's collectives went through the communicator's accounting, warm-up included:
    // every allreduce carried its buffer's bytes: the sweep warm-up (1 at 4096 B, 100 at 8 B),
    // 1 + 3 per size, and the two combining allreduces of one double per result at the end.
    const auto stats = comm->stats();
    std::uint64_t allreduce_bytes = 4096 + 100 * 8;
    for (const auto& [op, count] : expected)
        if (op == Collective::AllReduce) allreduce_bytes += 4 * count * (1 + 3);
    allreduce_bytes += 2 * 8 * expected.size();
    EXPECT_EQ(stats.at("allreduce").bytes, allreduce_bytes);
}

TEST(CommBenchmark, MpiBackendRefusesHalfPrecisionReductions) {
    auto comm = mpi_communicator();
    auto o = small_sweep();
    o.dtype = torch::kBFloat16;
    try {
        dist::CommBenchmark(o).run(*comm);
        FAIL() << "no ConfigError";
    } catch (const core::ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("comm.dtype=bfloat16"), std::string::npos) << e.what();
    }
    // Bytewise collectives do not reduce: bfloat16 broadcast runs on the MPI backend.
    o.ops = {Collective::Broadcast};
    const auto results = dist::CommBenchmark(o).run(*comm);
    ASSERT_EQ(results.size(), 10u); // 8 .. 4096 B
    EXPECT_EQ(results.front().count, 4);
}

TEST(CommBenchmark, WritesCommTablesWithUnits) {
    const int n = world_size();
    const std::string dir = trainscope::testing::shared_tmp_dir("comm");
    ASSERT_FALSE(dir.empty());
    const std::string path = dir + "/comm.h5";

    auto comm = mpi_communicator();
    auto o = small_sweep();
    o.ops = {Collective::AllReduce, Collective::AllGather};
    const dist::CommBenchmark bench(o);
    const auto results = bench.run(*comm);
    {
        auto file = io::RunFile::create(MPI_COMM_WORLD, path, false);
        train::write_comm_benchmark(file, bench.options(), results, comm->backend(), comm->size(),
                                    comm->allreduce_algorithm());
        file.close();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) {
        const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
        ASSERT_GE(f, 0);
        const auto bytes = read_doubles(f, "/comm/allreduce/bytes");
        EXPECT_EQ(bytes, (std::vector<double>{8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096}));
        const auto gathered = read_doubles(f, "/comm/allgather/bytes");
        ASSERT_FALSE(gathered.empty());
        EXPECT_EQ(gathered.front(), n == 4 ? 16 : 8);
        const auto busbw = read_doubles(f, "/comm/allreduce/busbw_GBps");
        const auto algbw = read_doubles(f, "/comm/allreduce/algbw_GBps");
        const auto time = read_doubles(f, "/comm/allreduce/time_s");
        ASSERT_EQ(busbw.size(), bytes.size());
        for (std::size_t k = 0; k < bytes.size(); ++k) {
            EXPECT_DOUBLE_EQ(algbw[k], bytes[k] / time[k] / 1e9);
            EXPECT_DOUBLE_EQ(busbw[k], algbw[k] * 2.0 * (n - 1) / n);
        }
        EXPECT_DOUBLE_EQ(read_double_attr(f, "/comm/allreduce", "busbw_factor"), 2.0 * (n - 1) / n);
        EXPECT_DOUBLE_EQ(read_double_attr(f, "/comm/allgather", "busbw_factor"), double(n - 1) / n);
        EXPECT_EQ(read_string_attr(f, "/comm/allreduce/bytes", "units"), "B");
        EXPECT_EQ(read_string_attr(f, "/comm/allreduce/count", "units"), "1");
        EXPECT_EQ(read_string_attr(f, "/comm/allreduce/time_s", "units"), "s");
        EXPECT_EQ(read_string_attr(f, "/comm/allreduce/time_max_s", "units"), "s");
        EXPECT_EQ(read_string_attr(f, "/comm/allgather/busbw_GBps", "units"), "GB/s");
        EXPECT_EQ(read_string_attr(f, "/comm", "backend"), "mpi");
        EXPECT_EQ(read_string_attr(f, "/comm", "dtype"), "float32");
        H5Fclose(f);
        std::filesystem::remove_all(dir);
    }
}

TEST(GradientCommRecord, BucketTablesReadBack) {
    const int r = world_rank(), n = world_size();
    const std::string dir = trainscope::testing::shared_tmp_dir("comm");
    const std::string path = dir + "/buckets.h5";

    auto comm = mpi_communicator();
    torch::manual_seed(3);
    torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                              torch::nn::Linear(16, 2));
    // float32 parameters in reverse order: 8, 128, 64 B (bucket of 200 B), then 512 B, which
    // would overflow a 600 B cap: a second bucket.
    dist::GradientSynchronizer sync(*comm, net->parameters(), 600);
    ASSERT_EQ(sync.num_buckets(), 2u);
    {
        // The Recorder is the only writer of per-iteration series, /comm/buckets included.
        auto file = io::RunFile::create(MPI_COMM_WORLD, path, false);
        prof::PhaseTimer timer;
        train::Recorder recorder(file, MPI_COMM_WORLD, timer, /*flush_every=*/2,
                                 /*warmup_iters=*/0);
        recorder.declare_buckets(sync.bucket_bytes());
        for (int it = 0; it < 3; ++it) {
            timer.begin_iteration(it);
            net->zero_grad();
            sync.begin_iteration();
            net->forward(torch::randn({4, 8}) + r).sum().backward();
            sync.finish();
            timer.end_iteration();
            train::IterationValues v;
            v.iteration = it;
            v.bucket_s = sync.last_iteration().bucket_s;
            recorder.record_iteration(v);
            if (recorder.flush_due()) recorder.flush();
        }
        recorder.flush();
        file.close();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r != 0) return;
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    EXPECT_EQ(read_doubles(f, "/comm/buckets/bytes"), (std::vector<double>{200, 512}));
    EXPECT_EQ(read_string_attr(f, "/comm/buckets/bytes", "units"), "B");
    for (const char* column : {"/comm/buckets/bucket_0_s", "/comm/buckets/bucket_1_s"}) {
        const auto s = read_doubles(f, column); // [n, 3]
        ASSERT_EQ(s.size(), std::size_t(3 * n)) << column;
        for (double v : s)
            EXPECT_GT(v, 0.0) << column; // n >= 2 here: every bucket was allreduced
        EXPECT_EQ(read_string_attr(f, column, "units"), "s");
    }
    H5Fclose(f);
    std::filesystem::remove_all(dir);
}

TEST(GradientCommRecord, BucketColumnsCoverTheRankWithTheMostBuckets) {
    // Pipeline stages hold different parameters, so ranks have different bucket counts; the
    // series must still have the same columns everywhere (declare_series is collective). Rank r
    // has r + 1 buckets here (one 8-byte parameter each).
    const int r = world_rank(), n = world_size();
    const std::string dir = trainscope::testing::shared_tmp_dir("comm");
    const std::string path = dir + "/uneven_buckets.h5";
    auto comm = mpi_communicator();
    std::vector<torch::Tensor> params;
    for (int k = 0; k <= r; ++k)
        params.push_back(torch::zeros({2}, torch::TensorOptions().requires_grad(true)));
    dist::GradientSynchronizer sync(*comm, params, /*bucket_cap_bytes=*/8);
    ASSERT_EQ(sync.num_buckets(), std::size_t(r + 1));
    {
        auto file = io::RunFile::create(MPI_COMM_WORLD, path, false);
        prof::PhaseTimer timer;
        train::Recorder recorder(file, MPI_COMM_WORLD, timer, /*flush_every=*/1,
                                 /*warmup_iters=*/0);
        recorder.declare_buckets(sync.bucket_bytes());
        EXPECT_EQ(file.columns("/comm/buckets"), std::size_t(n));
        timer.begin_iteration(0);
        timer.end_iteration();
        train::IterationValues v;
        v.bucket_s.assign(r + 1, 1.0 + r);
        recorder.record_iteration(v);
        recorder.flush();
        file.close();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r != 0) return;
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    for (int k = 0; k < n; ++k) {
        const auto s = read_doubles(f, "/comm/buckets/bucket_" + std::to_string(k) + "_s");
        ASSERT_EQ(s.size(), std::size_t(n)); // [n, 1]
        for (int rank = 0; rank < n; ++rank)
            if (k <= rank)
                EXPECT_EQ(s[rank], 1.0 + rank) << "bucket " << k << " rank " << rank;
            else
                EXPECT_TRUE(std::isnan(s[rank])) << "bucket " << k << " rank " << rank;
    }
    H5Fclose(f);
    std::filesystem::remove_all(dir);
}
