// Issue 39 (e): the memory a rank spends on recording a long run, measured against the model of
// docs/scaling.md. The Recorder and the RunFile of a real run (a real parallel HDF5 file, every
// flush, the aggregates' reductions, /summary) record T iterations of an LLM-sized /iterations
// series (C = 78 columns) at output.flush_every = 50, with no training around them; each rank's
// peak resident set (VmHWM, reset first through /proc/self/clear_refs) minus its resident set
// before is compared with the model's bytes at that T. Run in its own process (ctest entry
// mpi_tests_recorder_memory), so no earlier test's heap hides the growth. T defaults to 20,000;
// TRAINSCOPE_MEMORY_ITERS sets it (docs/scaling.md quotes 100,000).
#include "mpi_test_util.hpp"

#include "trainscope/io/run_file.hpp"
#include "trainscope/prof/phase_timer.hpp"
#include "trainscope/train/recorder.hpp"

#include <gtest/gtest.h>
#include <malloc.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace io = trainscope::io;
namespace prof = trainscope::prof;
namespace train = trainscope::train;
using trainscope::testing::world_rank;
using trainscope::testing::world_size;

namespace {

// A field of /proc/self/status in bytes (the kernel gives kB).
double status_bytes(const std::string& key) {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(key + ":", 0) == 0) {
            std::istringstream fields(line.substr(key.size() + 1));
            double kb = 0;
            fields >> kb;
            return kb * 1024.0;
        }
    return std::nan("");
}

} // namespace

TEST(RecorderMemory, PerRankPeakStaysWithinTheModelOverManyIterations) {
    const char* env = std::getenv("TRAINSCOPE_MEMORY_ITERS");
    const std::int64_t T = env ? std::atoll(env) : 20000;
    constexpr int F = 50;      // output.flush_every
    constexpr int kExtra = 30; // an LLM run's workload columns (padding, lengths, memory, ...)
    const int r = world_rank(), n = world_size();
    const std::string dir = trainscope::testing::shared_tmp_dir("memory");
    std::vector<io::Column> extra;
    for (int k = 0; k < kExtra; ++k)
        extra.push_back({"extra_" + std::to_string(k), "1"});

    malloc_trim(0);
    {
        std::ofstream clear("/proc/self/clear_refs");
        clear << "5"; // resets VmHWM to the current resident set (Linux >= 4.0)
    }
    const double before = status_bytes("VmRSS");
    const double file_before = status_bytes("RssFile");
    const double reset_peak = status_bytes("VmHWM");
    ASSERT_TRUE(std::isfinite(before) && std::isfinite(reset_peak));
    ASSERT_LE(reset_peak, before * 1.05) << "VmHWM was not reset: the measurement would be void";
    std::size_t columns = 0;
    {
        auto file =
            io::RunFile::create(MPI_COMM_WORLD, dir + "/memory.h5", true, {}, io::SchemaCheck::off);
        prof::PhaseTimer timer;
        train::Recorder recorder(file, MPI_COMM_WORLD, timer, F, /*warmup_iters=*/0, extra, T);
        train::IterationValues v;
        v.extra.assign(kExtra, 0.0);
        for (std::int64_t it = 0; it < T; ++it) {
            timer.begin_iteration(it);
            timer.end_iteration();
            v.iteration = it;
            v.loss = 1.0 / static_cast<double>(it + 1) + r;
            v.samples = 4;
            v.lr = 1e-3;
            v.tokens = 512;
            v.label_tokens = 500;
            for (int k = 0; k < kExtra; ++k)
                v.extra[static_cast<std::size_t>(k)] = static_cast<double>(it + k);
            recorder.record_iteration(v);
            if (recorder.flush_due()) recorder.flush();
        }
        train::Recorder::RunInfo info;
        info.wall_seconds = 1;
        info.global_batch = 4.0 * n;
        info.device_name = "cpu";
        info.precision = "fp32";
        recorder.finish(info);
        columns = file.columns("iterations");
        EXPECT_EQ(static_cast<std::int64_t>(file.rows("iterations")), T);
        file.set_status("completed");
        file.close();
    }
    const double growth = status_bytes("VmHWM") - before;
    const double library_pages = status_bytes("RssFile") - file_before;

    // docs/scaling.md's model (bytes per rank): the recorder's series 88 T, held in vectors
    // grown by doubling (capacity up to 2 x 88 T), finish's reductions 88 T, its per-iteration
    // vectors 24 T; the rows kept for a batched write max(F, 512) C 8 and for the aggregates
    // F C 8; up to 4 reductions of F (6C + 2) 8 in flight; HDF5's metadata cache 0.5 MB plus at
    // most 4 MiB dirty; rank 0 also the reductions' results, F C 48 of aggregate rows and
    // 8 N + 8 R (G + 1) of rank-indexed values. Beyond the code's own: 12 MB for the pages of
    // HDF5's and MPI-IO's code that the first flushes page in (RssFile, ~5 MB) and their
    // internal buffers (measured 12.6 MB in all at T = 1,000).
    const double C = static_cast<double>(columns), Td = static_cast<double>(T);
    double model = (2 * 88 + 88 + 24) * Td + std::max(F, 512) * C * 8 + F * C * 8 +
                   4 * F * (6 * C + 2) * 8 + 0.5e6 + 4.0 * 1024 * 1024 + 12e6;
    if (r == 0) model += 4 * F * (6 * C + 2) * 8 + F * C * 48 + 8.0 * n * 6;
    double worst[3] = {growth, growth / model, library_pages};
    MPI_Allreduce(MPI_IN_PLACE, worst, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r == 0)
        std::printf("[memory] T = %lld iterations, C = %.0f columns, %d ranks: peak growth %.2f MB "
                    "per rank (largest; %.2f MB of it library pages), model %.2f MB (%.2f of "
                    "it)\n",
                    static_cast<long long>(T), C, n, worst[0] / 1e6, worst[2] / 1e6, model / 1e6,
                    worst[1]);
    EXPECT_LE(growth, model) << "rank " << r << ": " << growth / 1e6 << " MB, model " << model / 1e6
                             << " MB";
    MPI_Barrier(MPI_COMM_WORLD);
    if (r == 0) std::filesystem::remove_all(dir);
}
