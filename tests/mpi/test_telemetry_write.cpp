// MPI test of /telemetry at 1 and 2 ranks: each rank samples at its own rate (so the ranks hold
// different sample counts) while a PhaseTimer times a few iterations of busy work; train's
// run-file writers (run_file_tables.hpp) write the series collectively, and rank 0 reads the closed
// file back with the serial HDF5 C API: shapes, rank_rows, NaN padding, units, the NVML-absent
// attributes, and t_s on the clock of t_start.
#include "mpi_test_util.hpp"
#include "trainscope/io/run_file.hpp"
#include "trainscope/prof/phase_timer.hpp"
#include "trainscope/prof/telemetry.hpp"
#include "trainscope/train/run_file_tables.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace io = trainscope::io;
namespace prof = trainscope::prof;
namespace train = trainscope::train;
namespace fs = std::filesystem;
using trainscope::testing::world_rank;
using trainscope::testing::world_size;

namespace {

std::string str_attr(hid_t file, const std::string& obj, const std::string& name) {
    const hid_t a = H5Aopen_by_name(file, obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0) return "<missing " + obj + "@" + name + ">";
    const hid_t t = H5Aget_type(a);
    char* text = nullptr;
    std::string v = "<not a vlen string>";
    if (H5Tis_variable_str(t) > 0 && H5Aread(a, t, &text) >= 0) v = text ? text : "";
    H5free_memory(text);
    H5Tclose(t);
    H5Aclose(a);
    return v;
}

std::vector<std::int64_t> int_attr(hid_t file, const std::string& obj, const std::string& name) {
    const hid_t a = H5Aopen_by_name(file, obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0) return {};
    const hid_t sp = H5Aget_space(a);
    const hssize_t n = H5Sget_simple_extent_npoints(sp);
    std::vector<std::int64_t> v(static_cast<std::size_t>(n));
    H5Aread(a, H5T_NATIVE_INT64, v.data());
    H5Sclose(sp);
    H5Aclose(a);
    return v;
}

// A 1-D int64 dataset (e.g. /telemetry/rank_rows).
std::vector<std::int64_t> int_dataset(hid_t file, const std::string& path) {
    const hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
    if (d < 0) return {};
    const hid_t sp = H5Dget_space(d);
    std::vector<std::int64_t> v(static_cast<std::size_t>(H5Sget_simple_extent_npoints(sp)));
    H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Sclose(sp);
    H5Dclose(d);
    return v;
}

// [rows, cols] of a 2-D float64 dataset, row-major.
std::vector<double> read_2d(hid_t file, const std::string& path, hsize_t dims[2]) {
    const hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
    const hid_t sp = H5Dget_space(d);
    H5Sget_simple_extent_dims(sp, dims, nullptr);
    std::vector<double> v(dims[0] * dims[1]);
    H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Sclose(sp);
    H5Dclose(d);
    return v;
}

} // namespace

TEST(TelemetryMpi, WritesSeriesWithUnitsAndSaysNvmlIsAbsent) {
    const int rank = world_rank(), size = world_size();
    std::string dir = fs::temp_directory_path() / "trainscope_telemetry_XXXXXX";
    if (rank == 0 && !mkdtemp(dir.data())) FAIL() << "mkdtemp";
    int n = static_cast<int>(dir.size());
    MPI_Bcast(dir.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
    const std::string path = dir + "/telemetry.h5";

    std::vector<double> t_start, sampler_span(2);
    {
        io::RunFile file = io::RunFile::create(MPI_COMM_WORLD, path, false);
        prof::TelemetryOptions o;
        o.interval_ms = 20 + 15 * (rank % 2); // different sample counts on neighbouring ranks
        o.nvml_library = "libtrainscope-test-no-such-nvml.so.1";
        // Rank 1 claims a GPU (so it tries NVML and fails), rank 0 is a CPU rank.
        prof::TelemetrySampler sampler(o, rank == 1 ? 0 : -1, "");
        prof::PhaseTimer timer;
        train::declare_telemetry(file, sampler);
        sampler.start();
        for (int it = 0; it < 4; ++it) {
            timer.begin_iteration(it);
            {
                prof::PhaseScope fwd(timer, prof::Phase::Forward);
                std::this_thread::sleep_for(std::chrono::milliseconds(30));
            }
            timer.end_iteration();
            if (it == 1) { // mid-run flush, as the recorder does every output.flush_every
                train::append_telemetry(file, sampler);
                file.flush();
            }
        }
        sampler.stop();
        train::write_telemetry(file, sampler, MPI_COMM_WORLD);
        for (const auto& t : timer.collect(true))
            t_start.push_back(t.t_start);
        sampler_span = {sampler.started_at(), sampler.stopped_at()};
        file.close();
    }
    // Rank 0 checks every rank's samples against that rank's clock readings.
    std::vector<double> spans(2 * size), starts(4 * size);
    MPI_Gather(sampler_span.data(), 2, MPI_DOUBLE, spans.data(), 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Gather(t_start.data(), 4, MPI_DOUBLE, starts.data(), 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
        ASSERT_GE(f, 0);
        const auto cols = prof::TelemetrySampler::columns();
        std::string names;
        for (const auto& c : cols) {
            names += (names.empty() ? "" : ",") + c.name;
            EXPECT_EQ(str_attr(f, "/telemetry/" + c.name, "units"), c.units) << c.name;
        }
        EXPECT_EQ(str_attr(f, "/telemetry", "columns"), names);
        EXPECT_EQ(str_attr(f, "/telemetry/t_s", "units"), "s");
        EXPECT_EQ(str_attr(f, "/telemetry/power_w", "units"), "W");
        EXPECT_EQ(int_attr(f, "/telemetry", "gpu_available"), (std::vector<std::int64_t>{0}));
        EXPECT_EQ(int_attr(f, "/telemetry", "gpu_available_ranks"), (std::vector<std::int64_t>{0}));
        EXPECT_EQ(str_attr(f, "/telemetry", "reason"),
                  "rank 0: CPU run: no CUDA device bound to this rank");
        EXPECT_EQ(int_attr(f, "/telemetry", "interval_ms"), (std::vector<std::int64_t>{20}));

        const auto rank_rows = int_dataset(f, "/telemetry/rank_rows");
        ASSERT_EQ(rank_rows.size(), static_cast<std::size_t>(size));
        hsize_t dims[2];
        const auto t = read_2d(f, "/telemetry/t_s", dims);
        const auto cpu = read_2d(f, "/telemetry/cpu_percent", dims);
        const auto power = read_2d(f, "/telemetry/power_w", dims);
        ASSERT_EQ(dims[0], static_cast<hsize_t>(size));
        for (int r = 0; r < size; ++r) {
            const auto rows = static_cast<hsize_t>(rank_rows[r]);
            EXPECT_GE(rows, 4u) << "rank " << r; // ~120 ms at 20-35 ms + first + last
            EXPECT_LE(rows, dims[1]);
            for (hsize_t i = 0; i < dims[1]; ++i) {
                const double ti = t[r * dims[1] + i];
                if (i >= rows) {
                    EXPECT_TRUE(std::isnan(ti)) << "padding of rank " << r;
                    continue;
                }
                EXPECT_GE(ti, spans[2 * r]) << "rank " << r << " sample " << i;
                EXPECT_LE(ti, spans[2 * r + 1]) << "rank " << r << " sample " << i;
                if (i > 0) EXPECT_GT(ti, t[r * dims[1] + i - 1]);
                if (i > 0) EXPECT_GE(cpu[r * dims[1] + i], 0.0);
                EXPECT_TRUE(std::isnan(power[r * dims[1] + i]));
            }
            // The iterations ran inside the sampled span, on the same clock.
            EXPECT_GE(starts[4 * r], spans[2 * r]);
            EXPECT_LE(starts[4 * r + 3], spans[2 * r + 1]);
        }
        if (size > 1) EXPECT_NE(rank_rows[0], rank_rows[1]); // 20 vs 35 ms periods
        H5Fclose(f);
        fs::remove_all(dir);
    }
}

TEST(TelemetryMpi, DisabledWritesNoGroup) {
    const int rank = world_rank();
    std::string dir = fs::temp_directory_path() / "trainscope_telemetry_off_XXXXXX";
    if (rank == 0 && !mkdtemp(dir.data())) FAIL() << "mkdtemp";
    MPI_Bcast(dir.data(), static_cast<int>(dir.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
    const std::string path = dir + "/off.h5";
    {
        io::RunFile file = io::RunFile::create(MPI_COMM_WORLD, path, false);
        prof::TelemetryOptions o;
        o.enabled = false;
        prof::TelemetrySampler sampler(o, -1, "");
        train::declare_telemetry(file, sampler);
        sampler.start();
        sampler.stop();
        train::append_telemetry(file, sampler);
        train::write_telemetry(file, sampler, MPI_COMM_WORLD);
        file.close();
    }
    if (rank == 0) {
        const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
        ASSERT_GE(f, 0);
        EXPECT_EQ(H5Lexists(f, "/telemetry", H5P_DEFAULT), 0);
        H5Fclose(f);
        fs::remove_all(dir);
    }
}
