// MPI tests of the profiler window (np 1, 2): a few CPU iterations of a small MobileNetV2 run
// through ProfilerWindow, the summary holds convolution forward and backward operators with the
// counts the model implies and times inside the window, and /profile reads back with units on every
// dataset; plus the summary arithmetic (nesting, categories, HTA breakdown) on synthetic events.
#include "h5_test_util.hpp"
#include "mpi_test_util.hpp"
#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/io/run_file.hpp"
#include "trainscope/models/mobilenet_v2.hpp"
#include "trainscope/prof/options.hpp"
#include "trainscope/prof/profile_summary.hpp"
#include "trainscope/prof/profiler_window.hpp"
#include "trainscope/train/run_file_tables.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

namespace core = trainscope::core;
namespace io = trainscope::io;
namespace models = trainscope::models;
namespace prof = trainscope::prof;
namespace fs = std::filesystem;

namespace {

using trainscope::testing::world_rank;
using trainscope::testing::world_size;

std::string shared_tmp_dir() {
    return trainscope::testing::shared_tmp_dir("prof");
}

const prof::CategoryStats* category(const prof::ProfileSummary& s, const std::string& name) {
    for (const auto& c : s.categories)
        if (c.name == name) return &c;
    return nullptr;
}

const prof::TopEntry* op(const std::vector<prof::TopEntry>& rows, const std::string& name) {
    for (const auto& r : rows)
        if (r.name == name) return &r;
    return nullptr;
}

prof::ProfileEvent ev(prof::EventKind kind, std::string name, std::int64_t start, std::int64_t end,
                      std::uint64_t thread = 1) {
    return prof::ProfileEvent{kind, std::move(name), thread, start, end};
}

// --- options ------------------------------------------------------------------------------------

TEST(ProfileOptions, DefaultsAndRanges) {
    core::OptionRegistry registry;
    prof::declare_options(registry);
    const auto o = prof::ProfileOptions::from_config(core::Config::from_values(registry, {}));
    EXPECT_FALSE(o.enabled);
    EXPECT_EQ(o.start_iter, 10);
    EXPECT_EQ(o.iters, 5);
    EXPECT_EQ(o.top_n, 20);
    EXPECT_FALSE(o.trace);
    EXPECT_THROW(core::Config::from_values(registry, {{"profile.start_iter", "-1"}}),
                 core::ConfigError);
    EXPECT_THROW(core::Config::from_values(registry, {{"profile.iters", "0"}}), core::ConfigError);
    EXPECT_THROW(core::Config::from_values(registry, {{"profile.top_n", "0"}}), core::ConfigError);
    // profile.warmup_iters belongs to the train module: declaring it here would clash.
    EXPECT_EQ(registry.find("profile.warmup_iters"), nullptr);
}

// --- summary arithmetic on synthetic events -----------------------------------------------------

TEST(ProfileSummary, NestingGivesSelfTimeAndTopLevelOperators) {
    using K = prof::EventKind;
    // Thread 1: A [0,100) > B [10,40) > C [20,30), then D [100,150). Thread 2: E [0,50).
    const std::vector<prof::ProfileEvent> events = {
        ev(K::CpuOp, "A", 0, 100),
        ev(K::CpuOp, "B", 10, 40),
        ev(K::CpuOp, "C", 20, 30),
        ev(K::CpuOp, "D", 100, 150),
        ev(K::CpuOp, "A", 200, 210, 2),
        ev(K::ProfilerStep, "ProfilerStep#3", 0, 160),
        ev(K::CudaRuntime, "cudaLaunchKernel", 0, 4),
        ev(K::CudaRuntime, "cudaLaunchKernel", 10, 12),
        ev(K::Memcpy, "Memcpy HtoD (Pageable -> Device)", 0, 3),
        ev(K::Memcpy, "Memcpy DtoH (Device -> Pinned)", 5, 6),
        ev(K::Memset, "Memset (Device)", 7, 8),
        ev(K::Kernel, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long)", 0,
           40),
        ev(K::Kernel, "void at::native::conv_depthwise2d_forward_kernel<float>", 0, 20),
        ev(K::Other, "ignored", 0, 1000)};
    const auto s = prof::summarise_events(events, /*top_n=*/3);

    const auto* cpu = category(s, "cpu_op");
    ASSERT_NE(cpu, nullptr);
    EXPECT_EQ(cpu->count, 5);
    EXPECT_DOUBLE_EQ(cpu->total_s, 200e-9);
    EXPECT_DOUBLE_EQ(cpu->min_s, 10e-9);
    EXPECT_DOUBLE_EQ(cpu->max_s, 100e-9);
    const auto* top_level = category(s, "cpu_op_top_level");
    ASSERT_NE(top_level, nullptr);
    EXPECT_EQ(top_level->count, 3); // A, D and thread 2's A
    EXPECT_DOUBLE_EQ(top_level->total_s, 160e-9);
    EXPECT_EQ(category(s, "profiler_step")->count, 1);
    const auto* launch = category(s, "cuda_runtime:cudaLaunchKernel");
    ASSERT_NE(launch, nullptr);
    EXPECT_EQ(launch->count, 2);
    EXPECT_DOUBLE_EQ(launch->max_s, 4e-9);
    EXPECT_EQ(category(s, "memcpy_htod")->count, 1);
    EXPECT_EQ(category(s, "memcpy_dtoh")->count, 1);
    EXPECT_EQ(category(s, "memcpy_dtod"), nullptr);
    EXPECT_EQ(category(s, "memset")->count, 1);
    EXPECT_EQ(category(s, "nccl_kernel")->count, 1);
    EXPECT_EQ(category(s, "gpu_kernel")->count, 1);
    EXPECT_TRUE(std::is_sorted(s.categories.begin(), s.categories.end(),
                               [](const prof::CategoryStats& a, const prof::CategoryStats& b) {
                                   return a.name < b.name;
                               }));

    // Top 3 of A (110 total, 70 + 10 self), D (50), B (30) and C (10): C is cut.
    ASSERT_EQ(s.top_ops.size(), 3u);
    EXPECT_EQ(s.top_ops[0].name, "A");
    EXPECT_EQ(s.top_ops[0].count, 2);
    EXPECT_DOUBLE_EQ(s.top_ops[0].total_s, 110e-9);
    EXPECT_DOUBLE_EQ(s.top_ops[0].self_s, 80e-9);
    EXPECT_EQ(s.top_ops[1].name, "D");
    EXPECT_EQ(s.top_ops[2].name, "B");
    EXPECT_DOUBLE_EQ(s.top_ops[2].self_s, 20e-9);
    ASSERT_EQ(s.top_kernels.size(), 2u);
    EXPECT_EQ(s.top_kernels[0].name.rfind("ncclDevKernel", 0), 0u);
    EXPECT_TRUE(std::isnan(s.top_kernels[0].self_s));
}

// Issue 25, point 5: the profiler counts the CUDA runtime calls that blocked the host (what a
// `.item()` costs), not the asynchronous ones around them.
TEST(ProfileSummary, CountsTheRuntimeCallsThatBlockTheHost) {
    using K = prof::EventKind;
    for (const char* name :
         {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
          "cudaMemset", "cudaMemcpy_ptds", "cudaStreamSynchronize_ptsz"})
        EXPECT_TRUE(prof::is_host_synchronising_call(name)) << name;
    for (const char* name : {"cudaMemcpyAsync", "cudaStreamWaitEvent", "cudaEventQuery",
                             "cudaLaunchKernel", "cudaEventRecord", "cudaMemsetAsync", "_ptsz", ""})
        EXPECT_FALSE(prof::is_host_synchronising_call(name)) << name;

    // Two iterations: one `.item()` (copy + stream sync) each, plus a synchronous cudaMemcpy in
    // the second; asynchronous calls and a CUDA sync activity record are not host calls.
    const std::vector<prof::ProfileEvent> events = {
        ev(K::CudaRuntime, "cudaLaunchKernel", 0, 2),
        ev(K::CudaRuntime, "cudaMemcpyAsync", 3, 4),
        ev(K::CudaRuntime, "cudaStreamSynchronize", 4, 9),
        ev(K::CudaSync, "Stream Sync", 4, 9),
        ev(K::CudaRuntime, "cudaStreamWaitEvent", 10, 11),
        ev(K::CudaRuntime, "cudaMemcpyAsync", 20, 21),
        ev(K::CudaRuntime, "cudaStreamSynchronize", 21, 25),
        ev(K::CudaRuntime, "cudaMemcpy", 30, 40),
        ev(K::CudaDriver, "cuStreamSynchronize", 41, 42)};
    EXPECT_EQ(prof::summarise_events(events, 3).host_sync_calls, 3);
    EXPECT_EQ(prof::summarise_events({}, 3).host_sync_calls, 0);
}

TEST(ProfileSummary, TemporalBreakdownFollowsHta) {
    using K = prof::EventKind;
    // compute [0,10) and [12,14); NCCL [5,20); memcpy [25,30) and [8,9) (under compute); idle
    // [20,25). Span 30: compute 12, communication (not computing) 10-12 and 14-20 = 8, memory 5,
    // idle 5; overlap = computing while communicating (5-10, 12-14 = 7) / communicating (15).
    const std::vector<prof::ProfileEvent> events = {
        ev(K::Kernel, "volta_sgemm_128x64_nn", 100, 110),
        ev(K::Kernel, "elementwise_kernel", 112, 114),
        ev(K::Kernel, "ncclKernel_AllReduce_RING_LL_Sum_float", 105, 120),
        ev(K::Memcpy, "Memcpy DtoD (Device -> Device)", 125, 130),
        ev(K::Memset, "Memset (Device)", 108, 109),
        ev(K::CpuOp, "aten::mm", 0, 1000)};
    const auto b = prof::temporal_breakdown(events);
    EXPECT_EQ(b.gpu_kernels, 3);
    EXPECT_EQ(b.gpu_events, 5);
    EXPECT_DOUBLE_EQ(b.span_s, 30e-9);
    EXPECT_DOUBLE_EQ(b.compute_s, 12e-9);
    EXPECT_DOUBLE_EQ(b.communication_s, 8e-9);
    EXPECT_DOUBLE_EQ(b.memory_s, 5e-9);
    EXPECT_DOUBLE_EQ(b.idle_s, 5e-9);
    EXPECT_DOUBLE_EQ(b.compute_s + b.communication_s + b.memory_s + b.idle_s, b.span_s);
    EXPECT_DOUBLE_EQ(b.overlap_ratio, 7.0 / 15.0);

    EXPECT_EQ(prof::classify_kernel("ncclDevKernel_Broadcast_RING_LL"),
              prof::KernelClass::Communication);
    EXPECT_EQ(prof::classify_kernel("Memcpy HtoD (Pinned -> Device)"), prof::KernelClass::Memory);
    EXPECT_EQ(prof::classify_kernel("void gemm_kernel<float>"), prof::KernelClass::Compute);

    // No device events (a CPU run): NaN and zero kernels, never invented numbers.
    const auto cpu = prof::temporal_breakdown({ev(K::CpuOp, "aten::mm", 0, 10)});
    EXPECT_EQ(cpu.gpu_kernels, 0);
    EXPECT_TRUE(std::isnan(cpu.compute_s));
    EXPECT_TRUE(std::isnan(cpu.idle_s));
    EXPECT_TRUE(std::isnan(cpu.overlap_ratio));
}

TEST(ProfileSummary, TracePathSitsBesideTheRunFile) {
    EXPECT_EQ(prof::trace_path_for("/scratch/runs/job42.h5", 3),
              "/scratch/runs/job42.rank3.trace.json");
    EXPECT_EQ(prof::trace_path_for("run.h5", 0), "run.rank0.trace.json");
}

// --- the window on a real model -----------------------------------------------------------------

// Serial HDF5 reads of the closed file (rank 0).
struct H5Reader {
    hid_t file;
    explicit H5Reader(const std::string& path)
        : file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)) {}
    ~H5Reader() {
        if (file >= 0) H5Fclose(file);
    }
    bool exists(const std::string& path) const {
        return H5Lexists(file, path.c_str(), H5P_DEFAULT) > 0;
    }
    std::vector<double> doubles(const std::string& path) const {
        return trainscope::testing::read_dataset<double>(file, path, H5T_NATIVE_DOUBLE);
    }
    std::vector<std::int64_t> ints(const std::string& path) const {
        return trainscope::testing::read_dataset<std::int64_t>(file, path, H5T_NATIVE_INT64);
    }
    std::vector<std::string> strings(const std::string& path) const {
        const hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
        if (d < 0) return {};
        const hid_t t = H5Dget_type(d);
        const hid_t s = H5Dget_space(d);
        const std::size_t width = H5Tget_size(t), n = H5Sget_simple_extent_npoints(s);
        std::vector<char> raw(width * n + 1, '\0');
        if (n > 0) H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data());
        std::vector<std::string> out;
        for (std::size_t i = 0; i < n; ++i) {
            std::string cell(raw.data() + i * width, width);
            out.push_back(cell.substr(0, cell.find('\0')));
        }
        H5Sclose(s);
        H5Tclose(t);
        H5Dclose(d);
        return out;
    }
    std::string str_attr(const std::string& obj, const std::string& name) const {
        return trainscope::testing::read_string_attr(file, obj, name);
    }
    std::int64_t int_attr(const std::string& obj, const std::string& name) const {
        return trainscope::testing::read_int_attr(file, obj, name);
    }
    // Every dataset below `group` (full paths).
    std::vector<std::string> datasets(const std::string& group) const {
        std::vector<std::string> out;
        auto visit = [](hid_t, const char* name, const H5O_info_t* info, void* data) -> herr_t {
            if (info->type == H5O_TYPE_DATASET)
                static_cast<std::vector<std::string>*>(data)->push_back(name);
            return 0;
        };
        const hid_t g = H5Gopen2(file, group.c_str(), H5P_DEFAULT);
        if (g < 0) return out;
#if H5_VERSION_GE(1, 12, 0)
        H5Ovisit(g, H5_INDEX_NAME, H5_ITER_NATIVE, visit, &out, H5O_INFO_BASIC);
#else
        H5Ovisit(g, H5_INDEX_NAME, H5_ITER_NATIVE, visit, &out);
#endif
        H5Gclose(g);
        for (auto& d : out)
            d = group + "/" + d;
        return out;
    }
};

// Per-rank rows of a ragged column: values[offset[r] .. offset[r] + count[r]).
template <class T>
std::vector<T> rank_rows(const std::vector<T>& all, const H5Reader& f, const std::string& column,
                         int r) {
    const auto offsets = f.ints(column + "_offset");
    const auto counts = f.ints(column + "_count");
    return std::vector<T>(all.begin() + offsets.at(r), all.begin() + offsets.at(r) + counts.at(r));
}

class ProfilerWindowTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = shared_tmp_dir();
        ASSERT_FALSE(dir_.empty());
    }
    void TearDown() override {
        MPI_Barrier(MPI_COMM_WORLD);
        if (world_rank() == 0) {
            std::error_code ec;
            fs::remove_all(dir_, ec);
        }
    }

    // `iterations` training steps of MobileNetV2 (width 0.35, 32x32 inputs, batch 8, CPU), each
    // between window.begin_iteration and window.end_iteration as the trainer calls them.
    // last_iterations: the iterations in which the window said it was in its last one.
    static std::int64_t train(prof::ProfilerWindow& window, int iterations,
                              std::vector<int>* last_iterations = nullptr) {
        torch::manual_seed(7 + world_rank());
        models::MobileNetV2 model(models::MobileNetV2Options{10, 0.35, 0.2, 3});
        torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01));
        std::int64_t convolutions = 0;
        for (const auto& m : model->modules(/*include_self=*/false))
            if (m->as<torch::nn::Conv2d>()) ++convolutions;
        for (int it = 0; it < iterations; ++it) {
            window.begin_iteration(it);
            torch::Tensor x = torch::randn({8, 3, 32, 32});             // [B, C, S, S]
            torch::Tensor y = torch::randint(0, 10, {8}, torch::kLong); // [B]
            torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
            optimizer.zero_grad();
            loss.backward();
            optimizer.step();
            if (last_iterations && window.in_last_iteration()) last_iterations->push_back(it);
            window.end_iteration(it);
        }
        return convolutions;
    }

    std::string dir_;
};

TEST_F(ProfilerWindowTest, CpuWindowHoldsConvolutionsForwardAndBackwardAndReadsBack) {
    const int r = world_rank(), n = world_size();
    prof::ProfileOptions options;
    options.enabled = true;
    options.start_iter = 1;
    options.iters = 2;
    options.top_n = 1000; // keep every operator
    options.trace = true;
    prof::ProfilerWindow window(options, r, n, /*cuda=*/false);
    std::vector<int> last;
    const std::int64_t convolutions = train(window, 4, &last);
    // The loop synchronises the device (bounded) in the window's last iteration, and only there.
    EXPECT_EQ(last, std::vector<int>{2});
    EXPECT_FALSE(window.active());
    EXPECT_FALSE(torch::profiler::impl::profilerEnabled()); // stopped after iteration 2

    const prof::ProfileSummary& s = window.summarise();
    EXPECT_EQ(s.status, "complete");
    EXPECT_EQ(s.first_iteration, 1);
    EXPECT_EQ(s.iterations, 2);
    ASSERT_GT(s.window_s, 0);

    // Two ProfilerStep scopes, together nearly the whole window.
    const auto* steps = category(s, "profiler_step");
    ASSERT_NE(steps, nullptr);
    EXPECT_EQ(steps->count, 2);
    EXPECT_LE(steps->total_s, s.window_s * 1.05);
    EXPECT_GE(steps->total_s, s.window_s * 0.5);

    // CPU operators carry the profile; top-level operators never overlap on a thread, so their
    // time fits in the window (the loader's threads are not profiled).
    const auto* cpu = category(s, "cpu_op");
    ASSERT_NE(cpu, nullptr);
    EXPECT_GT(cpu->count, 100);
    const auto* top_level = category(s, "cpu_op_top_level");
    ASSERT_NE(top_level, nullptr);
    EXPECT_GT(top_level->total_s, 0);
    EXPECT_LE(top_level->total_s, s.window_s * 1.05);
    EXPECT_GE(top_level->max_s, top_level->min_s);

    // Each of the two profiled iterations runs every Conv2d once forward and once backward.
    const auto* forward = op(s.top_ops, "aten::convolution");
    const auto* backward = op(s.top_ops, "aten::convolution_backward");
    const auto* node = op(s.top_ops, "ConvolutionBackward0");
    ASSERT_NE(forward, nullptr);
    ASSERT_NE(backward, nullptr);
    ASSERT_NE(node, nullptr);
    EXPECT_EQ(forward->count, 2 * convolutions);
    EXPECT_EQ(backward->count, 2 * convolutions);
    EXPECT_EQ(node->count, 2 * convolutions);
    for (const auto* row : {forward, backward, node}) {
        EXPECT_GT(row->total_s, 0) << row->name;
        EXPECT_GE(row->self_s, 0) << row->name;
        EXPECT_LE(row->self_s, row->total_s) << row->name;
        EXPECT_LE(row->total_s, s.window_s) << row->name;
    }
    EXPECT_TRUE(std::is_sorted(
        s.top_ops.begin(), s.top_ops.end(),
        [](const prof::TopEntry& a, const prof::TopEntry& b) { return a.total_s > b.total_s; }));

    if (r == 0)
        std::printf("[profile] window %.4f s, steps %.4f s, top-level ops %.4f s, %lld operators, "
                    "aten::convolution %lld x %.4f s, aten::convolution_backward %lld x %.4f s\n",
                    s.window_s, steps->total_s, top_level->total_s,
                    static_cast<long long>(cpu->count), static_cast<long long>(forward->count),
                    forward->total_s, static_cast<long long>(backward->count), backward->total_s);

    // No GPU: no kernels, and the breakdown says so with NaN.
    EXPECT_TRUE(s.top_kernels.empty());
    EXPECT_EQ(s.breakdown.gpu_kernels, 0);
    EXPECT_TRUE(std::isnan(s.breakdown.compute_s));

    const std::string path = dir_ + "/run.h5";
    {
        auto file = io::RunFile::create(MPI_COMM_WORLD, path, false);
        trainscope::train::write_profile(file, window);
        file.close();
    }
    EXPECT_EQ(window.summarise().trace_path,
              dir_ + "/run.rank" + std::to_string(r) + ".trace.json");
    MPI_Barrier(MPI_COMM_WORLD);

    // Each rank's Chrome trace carries the distributed metadata HTA parses ("rank": N).
    {
        std::ifstream in(window.summarise().trace_path);
        const std::string trace((std::istreambuf_iterator<char>(in)), {});
        EXPECT_NE(trace.find("\"distributedInfo\""), std::string::npos);
        EXPECT_NE(trace.find("\"rank\": " + std::to_string(r)), std::string::npos);
        EXPECT_NE(trace.find("\"world_size\": " + std::to_string(n)), std::string::npos);
        EXPECT_NE(trace.find("ProfilerStep#1"), std::string::npos);
    }
    if (r != 0) return;

    H5Reader f(path);
    ASSERT_GE(f.file, 0);
    EXPECT_EQ(f.int_attr("/profile", "enabled"), 1);
    EXPECT_EQ(f.int_attr("/profile", "start_iter"), 1);
    EXPECT_EQ(f.int_attr("/profile", "iters"), 2);
    EXPECT_EQ(f.str_attr("/profile", "status"), "complete");
    const std::string traces = f.str_attr("/profile", "trace_files");
    for (int k = 0; k < n; ++k)
        EXPECT_NE(traces.find("run.rank" + std::to_string(k) + ".trace.json"), std::string::npos)
            << traces;

    // Every dataset under /profile has units.
    const auto all = f.datasets("/profile");
    EXPECT_GE(all.size(), 30u);
    for (const auto& d : all)
        EXPECT_EQ(f.str_attr(d, "units").rfind("<missing", 0), std::string::npos) << d;
    EXPECT_EQ(f.str_attr("/profile/window_s", "units"), "s");
    EXPECT_EQ(f.str_attr("/profile/top_ops/name", "units"), "text");
    EXPECT_EQ(f.str_attr("/profile/breakdown/overlap_ratio", "units"), "1");

    const auto window_s = f.doubles("/profile/window_s");
    const auto iterations = f.doubles("/profile/iterations");
    ASSERT_EQ(window_s.size(), static_cast<std::size_t>(n));
    EXPECT_EQ(f.str_attr("/profile/host_sync_calls", "units"), "calls");
    EXPECT_EQ(f.doubles("/profile/host_sync_calls"), std::vector<double>(n, 0.0)); // CPU: none
    EXPECT_DOUBLE_EQ(window_s[0], s.window_s);
    const auto names = f.strings("/profile/top_ops/name");
    const auto counts = f.doubles("/profile/top_ops/count");
    const auto totals = f.doubles("/profile/top_ops/total_s");
    const auto cat_names = f.strings("/profile/categories/name");
    const auto compute = f.doubles("/profile/breakdown/compute_s");
    const auto kernels = f.doubles("/profile/breakdown/gpu_kernels");
    ASSERT_EQ(compute.size(), static_cast<std::size_t>(n));
    for (int k = 0; k < n; ++k) {
        EXPECT_EQ(iterations[k], 2);
        EXPECT_GT(window_s[k], 0);
        EXPECT_TRUE(std::isnan(compute[k]));
        EXPECT_EQ(kernels[k], 0);
        const auto my_names = rank_rows(names, f, "/profile/top_ops/name", k);
        const auto my_counts = rank_rows(counts, f, "/profile/top_ops/count", k);
        const auto my_totals = rank_rows(totals, f, "/profile/top_ops/total_s", k);
        ASSERT_EQ(my_names.size(), my_counts.size());
        const auto at = std::find(my_names.begin(), my_names.end(), "aten::convolution_backward");
        ASSERT_NE(at, my_names.end()) << "rank " << k;
        EXPECT_EQ(my_counts[at - my_names.begin()], 2.0 * convolutions);
        EXPECT_GT(my_totals[at - my_names.begin()], 0);
        const auto my_cats = rank_rows(cat_names, f, "/profile/categories/name", k);
        EXPECT_NE(std::find(my_cats.begin(), my_cats.end(), "cpu_op"), my_cats.end());
    }
    // Rank 0's rows are exactly its summary.
    const auto mine = rank_rows(names, f, "/profile/top_ops/name", 0);
    ASSERT_EQ(mine.size(), s.top_ops.size());
    for (std::size_t i = 0; i < mine.size(); ++i)
        EXPECT_EQ(mine[i], s.top_ops[i].name);
}

TEST_F(ProfilerWindowTest, DisabledWindowRecordsNothingAndWritesOnlyTheFlag) {
    const int r = world_rank(), n = world_size();
    prof::ProfileOptions options; // enabled = false
    options.start_iter = 0;
    prof::ProfilerWindow window(options, r, n, /*cuda=*/false);
    for (int it = 0; it < 3; ++it) {
        window.begin_iteration(it);
        EXPECT_FALSE(window.active());
        EXPECT_FALSE(torch::profiler::impl::profilerEnabled());
        window.end_iteration(it);
    }
    EXPECT_EQ(window.summarise().status, "disabled");
    EXPECT_TRUE(window.summarise().categories.empty());
    const std::string path = dir_ + "/off.h5";
    {
        auto file = io::RunFile::create(MPI_COMM_WORLD, path, false);
        trainscope::train::write_profile(file, window);
        file.close();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r != 0) return;
    H5Reader f(path);
    EXPECT_EQ(f.int_attr("/profile", "enabled"), 0);
    EXPECT_TRUE(f.datasets("/profile").empty());
}

TEST_F(ProfilerWindowTest, RunEndingInsideTheWindowIsIncompleteAndNeverReachedIsSaidSo) {
    const int r = world_rank(), n = world_size();
    prof::ProfileOptions options;
    options.enabled = true;
    options.start_iter = 2;
    options.iters = 5;
    {
        prof::ProfilerWindow window(options, r, n, /*cuda=*/false);
        train(window, 3); // iteration 2 only
        EXPECT_TRUE(window.active());
        window.finish(dir_ + "/incomplete.h5"); // profile.trace is off: nothing is saved
        EXPECT_FALSE(window.active());
        EXPECT_FALSE(torch::profiler::impl::profilerEnabled());
        const auto& s = window.summarise();
        EXPECT_EQ(s.status, "incomplete");
        EXPECT_EQ(s.iterations, 1);
        EXPECT_EQ(category(s, "profiler_step")->count, 1);
    }
    options.start_iter = 100;
    prof::ProfilerWindow never(options, r, n, /*cuda=*/false);
    never.begin_iteration(0);
    never.cancel_iteration(); // e.g. the loader was exhausted
    never.finish(dir_ + "/never.h5");
    EXPECT_EQ(never.summarise().status, "not_reached");
    EXPECT_TRUE(std::isnan(never.summarise().window_s));
}

} // namespace
