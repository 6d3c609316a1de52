// MPI tests of io::RunFile at 1, 2 and 4 ranks: every rank writes collectively, then rank 0 reads
// the closed file back with the serial HDF5 C API and checks values, shapes, NaN padding,
// attributes and units; refusals (existing file, missing or unwritable directory) must be the same
// OutputError on every rank.
#include "h5_test_util.hpp"
#include "mpi_test_util.hpp"
#include "pmpi_counter.hpp"
#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/io/options.hpp"
#include "trainscope/io/run_file.hpp"
#include "trainscope/io/schema.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace io = trainscope::io;
namespace core = trainscope::core;
namespace fs = std::filesystem;

namespace {

using trainscope::testing::world_rank;
using trainscope::testing::world_size;

std::string bcast_from_0(std::string text) {
    int n = static_cast<int>(text.size());
    MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
    text.resize(n);
    MPI_Bcast(text.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
    return text;
}

std::string file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// --- serial read-back helpers (rank 0, after the file is closed) --------------------------------

struct Reader {
    hid_t file;
    explicit Reader(const std::string& path)
        : file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)) {}
    ~Reader() {
        if (file >= 0) H5Fclose(file);
    }

    hid_t open_attr(const std::string& obj, const std::string& name) const {
        return H5Aopen_by_name(file, obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    }
    bool has_attr(const std::string& obj, const std::string& name) const {
        return H5Aexists_by_name(file, obj.c_str(), name.c_str(), H5P_DEFAULT) > 0;
    }
    std::string str_attr(const std::string& obj, const std::string& name) const {
        return trainscope::testing::read_string_attr(file, obj, name);
    }
    std::int64_t int_attr(const std::string& obj, const std::string& name) const {
        return trainscope::testing::read_int_attr(file, obj, name);
    }
    double float_attr(const std::string& obj, const std::string& name) const {
        double v = -12345;
        const hid_t a = open_attr(obj, name);
        if (a >= 0) {
            const hid_t t = H5Aget_type(a);
            if (H5Tget_class(t) == H5T_FLOAT) H5Aread(a, H5T_NATIVE_DOUBLE, &v);
            H5Tclose(t);
            H5Aclose(a);
        }
        return v;
    }
    struct Array {
        std::vector<hsize_t> dims, max_dims, chunk;
        std::vector<double> values; // row-major
        double at(hsize_t r, hsize_t c) const { return values[r * dims[1] + c]; }
    };
    Array doubles(const std::string& path) const {
        Array out;
        const hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
        if (d < 0) return out;
        const hid_t s = H5Dget_space(d);
        const int rank = H5Sget_simple_extent_ndims(s);
        out.dims.resize(rank);
        out.max_dims.resize(rank);
        H5Sget_simple_extent_dims(s, out.dims.data(), out.max_dims.data());
        const hid_t plist = H5Dget_create_plist(d);
        if (H5Pget_layout(plist) == H5D_CHUNKED) {
            out.chunk.resize(rank);
            H5Pget_chunk(plist, rank, out.chunk.data());
        }
        out.values.resize(H5Sget_simple_extent_npoints(s));
        if (!out.values.empty())
            H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.values.data());
        H5Pclose(plist);
        H5Sclose(s);
        H5Dclose(d);
        return out;
    }
    std::vector<std::int64_t> ints(const std::string& path) const {
        const hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
        if (d < 0) return {};
        const hid_t s = H5Dget_space(d);
        std::vector<std::int64_t> v(H5Sget_simple_extent_npoints(s));
        H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
        H5Sclose(s);
        H5Dclose(d);
        return v;
    }
    // An aggregate dataset (/<group>/aggregate/<column>) read as io::AggregateRow (by field name).
    std::vector<io::AggregateRow> aggregates(const std::string& path) const {
        const hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
        if (d < 0) return {};
        const hid_t s = H5Dget_space(d);
        std::vector<io::AggregateRow> v(H5Sget_simple_extent_npoints(s));
        const hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(io::AggregateRow));
        H5Tinsert(t, "min", HOFFSET(io::AggregateRow, min), H5T_NATIVE_DOUBLE);
        H5Tinsert(t, "mean", HOFFSET(io::AggregateRow, mean), H5T_NATIVE_DOUBLE);
        H5Tinsert(t, "max", HOFFSET(io::AggregateRow, max), H5T_NATIVE_DOUBLE);
        H5Tinsert(t, "argmax", HOFFSET(io::AggregateRow, argmax), H5T_NATIVE_INT64);
        H5Tinsert(t, "count", HOFFSET(io::AggregateRow, count), H5T_NATIVE_INT64);
        H5Tinsert(t, "slowest", HOFFSET(io::AggregateRow, slowest), H5T_NATIVE_DOUBLE);
        if (!v.empty()) H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
        H5Tclose(t);
        H5Sclose(s);
        H5Dclose(d);
        return v;
    }
    std::string fixed_string(const std::string& path) const {
        const hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
        if (d < 0) return "<missing " + path + ">";
        const hid_t t = H5Dget_type(d);
        std::string v(H5Tget_size(t), '\0');
        H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
        H5Tclose(t);
        H5Dclose(d);
        return v.substr(0, v.find('\0'));
    }
};

// Every test works in a fresh directory made by rank 0 and shared with the other ranks.
class RunFileTest : public ::testing::Test {
  protected:
    void SetUp() override {
        std::string made;
        if (world_rank() == 0) {
            const char* tmp = std::getenv("TMPDIR");
            std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/ts_io_XXXXXX";
            made = mkdtemp(pattern.data()) ? pattern : "";
        }
        dir_ = bcast_from_0(made);
        ASSERT_FALSE(dir_.empty());
    }
    void TearDown() override {
        MPI_Barrier(MPI_COMM_WORLD);
        if (world_rank() == 0) {
            std::error_code ec;
            fs::remove_all(dir_, ec);
        }
    }

    // Runs `create`; expects an OutputError raised collectively with the same message everywhere.
    template <class F> std::string expect_collective_output_error(F&& create) {
        std::string message;
        bool threw = false, collective = false;
        int exit_code = 0;
        try {
            create();
        } catch (const core::OutputError& e) {
            threw = true;
            collective = e.collective();
            exit_code = e.exit_code();
            message = e.what();
        }
        EXPECT_TRUE(threw);
        EXPECT_TRUE(collective);
        EXPECT_EQ(exit_code, 4);
        EXPECT_EQ(message, bcast_from_0(message)) << "ranks disagree on the error";
        return message;
    }

    std::string dir_;
};

double iteration_value(int rank, int row, int column) {
    return rank * 1000.0 + row + column * 0.25;
}
int iteration_rows(int rank) {
    return 5 + 3 * rank;
} // 5 + r before the first flush, 2r after
int epoch_rows(int rank, int size) {
    return (rank == 0 ? 1 : 0) + (rank == size - 1 ? 6 : 0);
}

TEST_F(RunFileTest, WritesAttributesStringsRanksAndSeriesFromEveryRank) {
    const int r = world_rank(), n = world_size();
    const std::string path = dir_ + "/run.h5";
    const std::string ini = "[train]\nlr = 0.2\nbatch_size = 64\n# ünïcode\n";
    {
        auto file = io::RunFile::create(MPI_COMM_WORLD, path, false,
                                        {{"workload", "cv"},
                                         {"num_nodes", std::int64_t{1}},
                                         {"lr0", 0.05},
                                         {"decided_by", r == 0 ? "rank 0" : "another rank"}},
                                        io::SchemaCheck::off);
        EXPECT_EQ(file.path(), path);
        // Values are rank 0's even where other ranks pass different ones.
        file.set_attributes("/config", {{"train.batch_size", std::int64_t{r == 0 ? 64 : 999}},
                                        {"train.lr", 0.1},
                                        {"train.epochs", std::int64_t{3}}});
        file.set_attributes("config", {{"train.lr", 0.2}});           // same type: in place
        file.set_attributes("/config/", {{"train.epochs", "three"}}); // int -> string
        file.write_string_dataset("/config/ini", r == 0 ? ini : "not rank 0's text");
        file.write_ranks({r, r % 2, r / 2, "host" + std::string(r, 'x'), 1000L + r, "cpu",
                          "test CPU", "", std::to_string(r)});

        file.declare_series("iterations", {{"iteration", "1"}, {"forward_s", "s"}, {"loss", "1"}});
        file.declare_series("/epochs", {{"epoch_s", "s"}, {"val_accuracy", "1"}}, 4);
        auto add_iterations = [&](int from, int to) {
            for (int i = from; i < to; ++i)
                file.append("iterations", {iteration_value(r, i, 0), iteration_value(r, i, 1),
                                           iteration_value(r, i, 2)});
        };
        auto add_epochs = [&](int count) {
            for (int i = 0; i < count; ++i) {
                const int row = static_cast<int>(file.rows("epochs"));
                file.append("epochs", {10.0 * r + row, 0.5 + row});
            }
        };
        add_iterations(0, 5 + r);
        if (r == 0) add_epochs(1);
        file.flush();
        add_iterations(5 + r, iteration_rows(r));
        if (r == n - 1) add_epochs(6); // crosses the 4-row chunk
        file.flush();
        file.flush(); // nothing new anywhere
        EXPECT_EQ(file.rows("iterations"), static_cast<std::size_t>(iteration_rows(r)));
        EXPECT_EQ(file.rows("epochs"), static_cast<std::size_t>(epoch_rows(r, n)));
        file.set_status("completed");
        file.close();
        EXPECT_FALSE(file.is_open());
        file.close(); // idempotent
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r != 0) return;

    Reader f(path);
    ASSERT_GE(f.file, 0);
    EXPECT_EQ(f.str_attr("/", "schema"), "trainscope/1");
    EXPECT_EQ(f.str_attr("/", "status"), "completed");
    const std::regex iso(R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z)");
    EXPECT_TRUE(std::regex_match(f.str_attr("/", "created_utc"), iso));
    EXPECT_TRUE(std::regex_match(f.str_attr("/", "flushed_utc"), iso));
    EXPECT_TRUE(std::regex_match(f.str_attr("/", "finished_utc"), iso));
    EXPECT_EQ(f.int_attr("/", "world_size"), n);
    EXPECT_EQ(f.str_attr("/", "workload"), "cv");
    EXPECT_EQ(f.int_attr("/", "num_nodes"), 1);
    EXPECT_DOUBLE_EQ(f.float_attr("/", "lr0"), 0.05);
    EXPECT_EQ(f.str_attr("/", "decided_by"), "rank 0");

    EXPECT_EQ(f.int_attr("/config", "train.batch_size"), 64);
    EXPECT_DOUBLE_EQ(f.float_attr("/config", "train.lr"), 0.2);
    EXPECT_EQ(f.str_attr("/config", "train.epochs"), "three");
    EXPECT_EQ(f.fixed_string("/config/ini"), ini);
    EXPECT_EQ(f.str_attr("/config/ini", "units"), "text");

    // /ranks: read a subset of the compound's fields into a native struct (matched by name).
    struct RankMem {
        int rank, local_rank, node;
        long long pid;
        char hostname[32], cpu_affinity[8], pci_bus_id[8], device[8];
    };
    const hid_t ranks = H5Dopen2(f.file, "/ranks", H5P_DEFAULT);
    ASSERT_GE(ranks, 0);
    const hid_t ftype = H5Dget_type(ranks);
    ASSERT_EQ(H5Tget_nmembers(ftype), 9);
    const char* expected_fields[9] = {"rank",   "local_rank",  "node",       "hostname",    "pid",
                                      "device", "device_name", "pci_bus_id", "cpu_affinity"};
    for (unsigned i = 0; i < 9; ++i) {
        char* name = H5Tget_member_name(ftype, i);
        EXPECT_STREQ(name, expected_fields[i]);
        H5free_memory(name);
    }
    auto str_type = [](std::size_t n) {
        hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, n);
        H5Tset_strpad(t, H5T_STR_NULLTERM);
        H5Tset_cset(t, H5T_CSET_UTF8); // HDF5 does not convert between character sets
        return t;
    };
    const hid_t mtype = H5Tcreate(H5T_COMPOUND, sizeof(RankMem));
    const hid_t s32 = str_type(32), s8 = str_type(8);
    H5Tinsert(mtype, "rank", HOFFSET(RankMem, rank), H5T_NATIVE_INT);
    H5Tinsert(mtype, "local_rank", HOFFSET(RankMem, local_rank), H5T_NATIVE_INT);
    H5Tinsert(mtype, "node", HOFFSET(RankMem, node), H5T_NATIVE_INT);
    H5Tinsert(mtype, "pid", HOFFSET(RankMem, pid), H5T_NATIVE_LLONG);
    H5Tinsert(mtype, "hostname", HOFFSET(RankMem, hostname), s32);
    H5Tinsert(mtype, "cpu_affinity", HOFFSET(RankMem, cpu_affinity), s8);
    H5Tinsert(mtype, "pci_bus_id", HOFFSET(RankMem, pci_bus_id), s8);
    H5Tinsert(mtype, "device", HOFFSET(RankMem, device), s8);
    std::vector<RankMem> rows(n);
    EXPECT_GE(H5Dread(ranks, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, rows.data()), 0);
    for (int k = 0; k < n; ++k) {
        EXPECT_EQ(rows[k].rank, k);
        EXPECT_EQ(rows[k].local_rank, k % 2);
        EXPECT_EQ(rows[k].node, k / 2);
        EXPECT_EQ(rows[k].pid, 1000 + k);
        EXPECT_EQ(std::string(rows[k].hostname), "host" + std::string(k, 'x'));
        EXPECT_EQ(std::string(rows[k].cpu_affinity), std::to_string(k));
        EXPECT_EQ(std::string(rows[k].pci_bus_id), "");
        EXPECT_EQ(std::string(rows[k].device), "cpu");
    }
    H5Tclose(s32);
    H5Tclose(s8);
    H5Tclose(mtype);
    H5Tclose(ftype);
    H5Dclose(ranks);
    EXPECT_EQ(f.str_attr("/ranks", "units"), "1");

    // /iterations: [n, longest rank], rank k's row holds iteration_rows(k) values, then NaN.
    const hsize_t longest = iteration_rows(n - 1);
    EXPECT_EQ(f.str_attr("/iterations", "columns"), "iteration,forward_s,loss");
    EXPECT_EQ(f.int_attr("/iterations", "rows"), static_cast<std::int64_t>(longest));
    std::vector<std::int64_t> expected_rank_rows;
    for (int k = 0; k < n; ++k)
        expected_rank_rows.push_back(iteration_rows(k));
    EXPECT_EQ(f.ints("/iterations/rank_rows"), expected_rank_rows);
    EXPECT_FALSE(f.has_attr("/iterations", "rank_rows")); // a dataset since issue 39
    const char* names[3] = {"iteration", "forward_s", "loss"};
    const char* units[3] = {"1", "s", "1"};
    for (int c = 0; c < 3; ++c) {
        const std::string ds = std::string("/iterations/") + names[c];
        const auto a = f.doubles(ds);
        ASSERT_EQ(a.dims, (std::vector<hsize_t>{hsize_t(n), longest})) << ds;
        EXPECT_EQ(a.max_dims, (std::vector<hsize_t>{hsize_t(n), H5S_UNLIMITED})) << ds;
        // Chunks span every rank; rows: declare_series' default (64).
        EXPECT_EQ(a.chunk, (std::vector<hsize_t>{hsize_t(n), 64})) << ds;
        EXPECT_EQ(f.str_attr(ds, "units"), units[c]);
        for (int k = 0; k < n; ++k)
            for (hsize_t i = 0; i < longest; ++i) {
                if (static_cast<int>(i) < iteration_rows(k))
                    EXPECT_EQ(a.at(k, i), iteration_value(k, static_cast<int>(i), c))
                        << ds << "[" << k << "," << i << "]";
                else
                    EXPECT_TRUE(std::isnan(a.at(k, i))) << ds << "[" << k << "," << i << "]";
            }
    }

    // /epochs: chunk [ranks, 4]; rank 0 has one row, rank n-1 six more; everything else NaN.
    int epochs_longest = 0;
    for (int k = 0; k < n; ++k)
        epochs_longest = std::max(epochs_longest, epoch_rows(k, n));
    const auto e = f.doubles("/epochs/epoch_s");
    const auto acc = f.doubles("/epochs/val_accuracy");
    ASSERT_EQ(e.dims, (std::vector<hsize_t>{hsize_t(n), hsize_t(epochs_longest)}));
    EXPECT_EQ(e.chunk, (std::vector<hsize_t>{hsize_t(n), 4}));
    EXPECT_EQ(f.str_attr("/epochs/epoch_s", "units"), "s");
    EXPECT_EQ(f.str_attr("/epochs/val_accuracy", "units"), "1");
    for (int k = 0; k < n; ++k)
        for (int i = 0; i < epochs_longest; ++i) {
            if (i < epoch_rows(k, n)) {
                EXPECT_EQ(e.at(k, i), 10.0 * k + i);
                EXPECT_EQ(acc.at(k, i), 0.5 + i);
            } else {
                EXPECT_TRUE(std::isnan(e.at(k, i))) << "epochs[" << k << "," << i << "]";
            }
        }
}

TEST_F(RunFileTest, ExistingFileIsRefusedWithoutOverwriteAndReplacedWithIt) {
    const std::string path = dir_ + "/run.h5";
    io::RunFile::create(MPI_COMM_WORLD, path, false, {{"workload", "first"}}).close();
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string before = world_rank() == 0 ? file_bytes(path) : "";

    const std::string message = expect_collective_output_error([&] {
        io::RunFile::create(MPI_COMM_WORLD, path, false, {{"workload", "second"}});
    });
    EXPECT_EQ(message, "output file '" + path +
                           "' exists; set output.overwrite=true or choose another output.file");
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) {
        EXPECT_FALSE(before.empty());
        EXPECT_EQ(file_bytes(path), before) << "refused create touched the existing file";
    }
    MPI_Barrier(MPI_COMM_WORLD);

    io::RunFile::create(MPI_COMM_WORLD, path, true, {{"workload", "second"}}).close();
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) {
        Reader f(path);
        EXPECT_EQ(f.str_attr("/", "workload"), "second");
        EXPECT_EQ(f.str_attr("/", "status"), "running"); // closed without a final status
    }
}

TEST_F(RunFileTest, MissingDirectoryIsNamedInTheError) {
    const std::string path = dir_ + "/no/such/dir/run.h5";
    const std::string message =
        expect_collective_output_error([&] { io::RunFile::create(MPI_COMM_WORLD, path, false); });
    EXPECT_NE(message.find("'" + path + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("directory '" + dir_ + "/no/such/dir' does not exist"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("mkdir -p"), std::string::npos) << message;
}

TEST_F(RunFileTest, ParentThatIsAFileIsRefused) {
    if (world_rank() == 0) std::ofstream(dir_ + "/plain") << "x";
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string path = dir_ + "/plain/run.h5";
    const std::string message =
        expect_collective_output_error([&] { io::RunFile::create(MPI_COMM_WORLD, path, true); });
    EXPECT_NE(message.find("'" + dir_ + "/plain' is not a directory"), std::string::npos)
        << message;
}

TEST_F(RunFileTest, UnwritableDirectoryIsNamedWithTheOsError) {
    // root ignores directory permissions, so it uses sysfs, where creating files is refused.
    std::string path;
    if (world_rank() == 0) {
        if (geteuid() != 0) {
            fs::create_directory(dir_ + "/ro");
            chmod((dir_ + "/ro").c_str(), 0555);
            path = dir_ + "/ro/run.h5";
        } else {
            path = "/sys/trainscope_io_test.h5";
            const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
            if (fd >= 0) { // not refused here: cannot test
                close(fd);
                unlink(path.c_str());
                path.clear();
            }
        }
    }
    path = bcast_from_0(path);
    if (path.empty()) GTEST_SKIP() << "no unwritable directory available";
    const std::string message =
        expect_collective_output_error([&] { io::RunFile::create(MPI_COMM_WORLD, path, false); });
    EXPECT_NE(message.find("cannot create output file '" + path + "'"), std::string::npos)
        << message;
    EXPECT_NE(message.find(geteuid() != 0 ? "Permission denied" : "denied"), std::string::npos)
        << message;
    EXPECT_NE(message.find("choose a writable directory"), std::string::npos) << message;
    if (world_rank() == 0 && geteuid() != 0) chmod((dir_ + "/ro").c_str(), 0755);
}

TEST_F(RunFileTest, HdfFailuresBecomeOutputErrorsWithoutPrintingTheErrorStack) {
    const std::string path = dir_ + "/run.h5";
    auto file = io::RunFile::create(MPI_COMM_WORLD, path, false, {}, io::SchemaCheck::off);
    file.write_string_dataset("/notes", "a dataset, not a group");

    // Capture stderr while HDF5 fails: nothing may be printed, the exception carries it all.
    std::fflush(stderr);
    const std::string capture = dir_ + "/stderr." + std::to_string(world_rank());
    const int saved = dup(2);
    const int fd = open(capture.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    std::string message;
    try {
        file.set_attributes("/notes/inner", {{"x", std::int64_t{1}}});
    } catch (const core::OutputError& e) {
        message = e.what();
    }
    std::fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);

    EXPECT_NE(message.find("HDF5 H5Gopen2 failed on '" + path + "' (/notes)"), std::string::npos)
        << message;
    EXPECT_EQ(file_bytes(capture), "");
    // The failure was the same on every rank, so the file is still usable and closes normally.
    file.set_attributes("/", {{"after_error", "ok"}});
    file.close();
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) EXPECT_EQ(Reader(path).str_attr("/", "after_error"), "ok");
}

TEST_F(RunFileTest, MisuseIsAnInternalError) {
    auto file =
        io::RunFile::create(MPI_COMM_WORLD, dir_ + "/run.h5", false, {}, io::SchemaCheck::off);
    file.declare_series("iterations", {{"a", "s"}, {"b", "s"}});
    EXPECT_THROW(file.append("iterations", {1.0}), core::InternalError);
    EXPECT_THROW(file.append("epochs", {1.0}), core::InternalError);
    EXPECT_THROW(file.declare_series("iterations", {{"a", "s"}}), core::InternalError);
    EXPECT_THROW(file.declare_series("x", {{"a", "s"}, {"a", "1"}}), core::InternalError);
    EXPECT_THROW(file.set_status("done"), core::InternalError);
    file.close();
    EXPECT_THROW(file.flush(), core::InternalError);
}

// Every attribute in the file, as "object@name" -> number of elements (H5Ovisit + H5Aiterate).
std::map<std::string, hssize_t> attribute_sizes(hid_t file) {
    std::map<std::string, hssize_t> out;
    struct Ctx {
        std::map<std::string, hssize_t>* out;
        std::string object;
    };
    auto per_attribute = [](hid_t loc, const char* name, const H5A_info_t*, void* data) -> herr_t {
        auto* ctx = static_cast<Ctx*>(data);
        const hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
        const hid_t space = H5Aget_space(a);
        (*ctx->out)[ctx->object + "@" + name] = H5Sget_simple_extent_npoints(space);
        H5Sclose(space);
        H5Aclose(a);
        return 0;
    };
    struct Visit {
        std::map<std::string, hssize_t>* out;
        H5A_operator2_t per_attribute;
    } visit{&out, per_attribute};
    H5Ovisit(
        file, H5_INDEX_NAME, H5_ITER_NATIVE,
        [](hid_t root, const char* name, const H5O_info_t*, void* data) -> herr_t {
            auto* v = static_cast<Visit*>(data);
            const hid_t obj = H5Oopen(root, name, H5P_DEFAULT);
            Ctx ctx{v->out, name};
            H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, v->per_attribute, &ctx);
            H5Oclose(obj);
            return 0;
        },
        &visit);
    return out;
}

// Issue 39: a flush costs at most 5 collectives on the world communicator and no fsync, counted
// by the PMPI counter (tests/mpi/pmpi_counter.cpp) around each flush of three series shaped like
// a training run's (80 iteration columns, every rank a row per flush, crossing 8-row chunks;
// telemetry rows that differ between ranks, so the row counts are gathered), with per-rank rows
// from every second rank only (output.per_rank=every:2) and aggregates of /iterations and
// /epochs over all ranks. Measured: one MPI_Allreduce (the extents; a write error of the previous
// flush) and one MPI_Ireduce (the aggregates and the uneven row counts, completed at a later
// flush) per flush, also where the extents grow after a sync (flushes 1 and 8; the group's `rows`
// is written at syncs only, and HDF5's dirty-metadata threshold is raised so that its metadata
// writes come at the syncs). The timed sync (flush 6) and the status change at the end must sync,
// which shows the counter sees HDF5's MPI-IO calls. No attribute has more than one element. The
// aggregates are checked against every rank's known values: min, mean, max, argmax, count (NaN left
// out) and the slowest rank's row.
TEST_F(RunFileTest, FlushCostsAtMostFiveGlobalCollectivesAndNoSync) {
    namespace pmpi = trainscope::testing::pmpi;
    const std::string path = dir_ + "/collectives.h5";
    const int r = world_rank(), n = world_size();
    std::vector<io::Column> columns;
    for (int c = 0; c < 80; ++c)
        columns.push_back({"c" + std::to_string(c), "1"});
    constexpr int kFlushes = 12, kRowsPerFlush = 5, kSyncAt = 6;
    std::vector<std::map<std::string, long>> counts;
    std::vector<std::int64_t> written; // this rank's rows in the file after each flush
    {
        auto file = io::RunFile::create(MPI_COMM_WORLD, path, false, {}, io::SchemaCheck::off);
        file.set_sync_interval(3600);
        file.select_per_rank(r % 2 == 0);
        EXPECT_EQ(file.per_rank_count(), (n + 1) / 2);
        // 8-row chunks: flushes cross chunk boundaries (allocating chunks as the extent grows).
        // The slowest rank of a row: the one with the largest c79 (rank 1 on even rows).
        file.declare_series("iterations", columns, 8, "c79");
        file.declare_series("epochs", {{"epoch", "1"}, {"loss", "1"}}, 8, "epoch");
        file.declare_series("telemetry", {{"t_s", "s"}, {"cpu", "percent"}});
        file.flush(); // the first flush syncs (a run's preamble: /config, /ranks)
        EXPECT_EQ(file.flush_stats().syncs, 1);
        double row = 0;
        for (int f = 0; f < kFlushes; ++f) {
            for (int i = 0; i < kRowsPerFlush; ++i, ++row) {
                std::vector<double> values(columns.size());
                for (std::size_t c = 0; c < values.size(); ++c)
                    values[c] = 1000.0 * r + row + 0.001 * static_cast<double>(c);
                // c79: rank 1 is the slowest on even rows, the highest rank on odd ones.
                values[79] = (static_cast<int>(row) % 2 == 0 && r == 1) ? 1e9 : r;
                file.append("iterations", values);
            }
            // Odd ranks have no loss (NaN): the aggregate counts the even ones only.
            if (f % 4 == 3)
                file.append("epochs",
                            {static_cast<double>(f / 4), r % 2 ? std::nan("") : 1.0 / (f + 1) + r});
            for (int i = 0; i < 1 + (r + f) % 3; ++i) // uneven between ranks
                file.append("telemetry", {row + 0.1 * i, 50.0 + r});
            // Flush 6 syncs (an interval of 0 s), as output.sync_every_s does in a run: flush 8
            // is the first after it to grow the extents.
            if (f == kSyncAt) file.set_sync_interval(0);
            pmpi::reset();
            file.flush();
            pmpi::stop();
            if (f == kSyncAt) file.set_sync_interval(3600);
            counts.push_back(pmpi::global_counts());
            written.push_back(file.flush_stats().rows_written);
        }
        EXPECT_EQ(file.flush_stats().flushes, kFlushes + 1);
        EXPECT_EQ(file.flush_stats().syncs, 2); // the preamble's and flush 6's
        EXPECT_GT(file.flush_stats().total_s, 0.0);
        pmpi::reset();
        file.set_status("completed");
        pmpi::stop();
        EXPECT_GE(pmpi::global_counts()["MPI_File_sync"], 1)
            << pmpi::describe(pmpi::global_counts());
        EXPECT_EQ(file.flush_stats().syncs, 3);
        // A rank keeps its per-rank rows until 512 of a series are pending or a sync: none are
        // written before flush 6, every row so far at it, the rest at the status change.
        if (r % 2 == 0) {
            for (int f = 0; f < kFlushes; ++f)
                EXPECT_EQ(written[f], f < kSyncAt ? 0 : written[kSyncAt]) << "flush " << f;
            EXPECT_GE(written[kSyncAt], (kSyncAt + 1) * kRowsPerFlush);
            EXPECT_GT(file.flush_stats().rows_written, written[kSyncAt]);
        }
    }
    EXPECT_GE(counts[kSyncAt]["MPI_File_sync"], 1) << pmpi::describe(counts[kSyncAt]);
    for (int f = 0; f < kFlushes; ++f) {
        if (f == kSyncAt) continue; // a timed sync: an fsync and HDF5's metadata writes
        long total = 0;
        for (const auto& [name, count] : counts[f])
            total += count;
        // The rows of flush 0 fit the chunk allocated at declaration; flushes 1, 3, 4, 8, 9 and
        // 11 grow the extents (1 and 8 the first after a sync), which with HDF5's default
        // dirty-metadata threshold ran a metadata sync point (a barrier and broadcasts).
        EXPECT_LE(total, 5) << "flush " << f << ": " << pmpi::describe(counts[f]);
        EXPECT_EQ(counts[f]["MPI_Allreduce"], 1) << pmpi::describe(counts[f]);
        EXPECT_EQ(counts[f]["MPI_Ireduce"], 1) << pmpi::describe(counts[f]);
        EXPECT_EQ(counts[f].count("MPI_Gather"), 0u) << pmpi::describe(counts[f]);
        // No metadata sync point (barrier) and no re-read object header (broadcast).
        EXPECT_EQ(counts[f].count("MPI_Barrier"), 0u) << pmpi::describe(counts[f]);
        EXPECT_EQ(counts[f].count("MPI_Bcast"), 0u) << pmpi::describe(counts[f]);
        EXPECT_EQ(counts[f].count("MPI_File_sync"), 0u) << pmpi::describe(counts[f]);
    }
    if (r == 0) {
        std::string total_line;
        for (int f = 0; f < kFlushes; ++f)
            total_line += " [" + pmpi::describe(counts[f]) + "]";
        std::printf("global collectives per flush at %d ranks:%s\n", n, total_line.c_str());
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r != 0) return;
    Reader f(path);
    for (const auto& [where, elements] : attribute_sizes(f.file))
        EXPECT_LE(elements, 1) << where << " has " << elements << " elements";
    const int rows = kFlushes * kRowsPerFlush;
    const int detail = (n + 1) / 2;
    std::vector<std::int64_t> ranks;
    for (int k = 0; k < n; k += 2)
        ranks.push_back(k);
    EXPECT_EQ(f.ints("/iterations/ranks"), ranks);
    const auto a = f.doubles("/iterations/c7");
    ASSERT_EQ(a.dims, (std::vector<hsize_t>{hsize_t(detail), hsize_t(rows)}));
    for (int j = 0; j < detail; ++j)
        for (int i = 0; i < rows; ++i)
            EXPECT_DOUBLE_EQ(a.at(j, i), 2000.0 * j + i + 0.007) << j << "," << i;
    const auto agg = f.aggregates("/iterations/aggregate/c7");
    ASSERT_EQ(agg.size(), static_cast<std::size_t>(rows));
    for (int i = 0; i < rows; ++i) {
        EXPECT_DOUBLE_EQ(agg[i].min, i + 0.007) << i;
        EXPECT_DOUBLE_EQ(agg[i].max, 1000.0 * (n - 1) + i + 0.007) << i;
        EXPECT_NEAR(agg[i].mean, 500.0 * (n - 1) + i + 0.007, 1e-9) << i;
        EXPECT_EQ(agg[i].argmax, n - 1) << i;
        EXPECT_EQ(agg[i].count, n) << i;
        const int slowest = (i % 2 == 0 && n > 1) ? 1 : n - 1;
        EXPECT_DOUBLE_EQ(agg[i].slowest, 1000.0 * slowest + i + 0.007) << i;
    }
    const auto loss = f.aggregates("/epochs/aggregate/loss");
    ASSERT_EQ(loss.size(), static_cast<std::size_t>(kFlushes / 4));
    for (std::size_t e = 0; e < loss.size(); ++e) {
        const double base = 1.0 / (4 * e + 4);
        const int last_even = (n - 1) / 2 * 2;
        EXPECT_EQ(loss[e].count, detail) << e;
        EXPECT_DOUBLE_EQ(loss[e].min, base) << e;
        EXPECT_DOUBLE_EQ(loss[e].max, base + last_even) << e;
        EXPECT_EQ(loss[e].argmax, last_even) << e;
        EXPECT_NEAR(loss[e].mean, base + (last_even / 2.0), 1e-12) << e;
    }
    std::vector<std::int64_t> telemetry_rows;
    for (int k = 0; k < n; k += 2) {
        std::int64_t count = 0;
        for (int fl = 0; fl < kFlushes; ++fl)
            count += 1 + (k + fl) % 3;
        telemetry_rows.push_back(count);
    }
    EXPECT_EQ(f.ints("/telemetry/rank_rows"), telemetry_rows);
    const auto t = f.doubles("/telemetry/cpu");
    ASSERT_EQ(t.dims[0], hsize_t(detail));
    for (int j = 0; j < detail; ++j)
        for (hsize_t i = 0; i < t.dims[1]; ++i) {
            if (static_cast<std::int64_t>(i) < telemetry_rows[j])
                EXPECT_EQ(t.at(j, i), 50.0 + 2 * j);
            else
                EXPECT_TRUE(std::isnan(t.at(j, i))) << "telemetry padding of row " << j;
        }
    EXPECT_EQ(f.ints("/iterations/rank_rows"), std::vector<std::int64_t>(detail, rows));
}

// Rows only some ranks have (rank r appends r + 1 rows): a flush aggregates the rows every rank
// has, the close the rest, each row over the ranks that have it. With output.per_rank=none no
// rank writes per-rank rows: the series' datasets are [0, n] and the aggregates hold everything.
TEST_F(RunFileTest, AggregatesCoverRowsOnlySomeRanksHaveAndNoPerRankRows) {
    const std::string path = dir_ + "/aggregates.h5";
    const int r = world_rank(), n = world_size();
    {
        auto file = io::RunFile::create(MPI_COMM_WORLD, path, false, {}, io::SchemaCheck::off);
        file.select_per_rank(false);
        EXPECT_EQ(file.per_rank_count(), 0);
        file.declare_series("iterations", {{"step_s", "s"}, {"x", "1"}}, 4, "step_s");
        file.append("iterations", {1.0 + r, 10.0 * r});
        file.flush(); // row 0: every rank has it
        for (int i = 1; i <= r; ++i)
            file.append("iterations", {1.0 + r, 10.0 * r + i});
        file.flush(); // nothing new every rank has (unless n == 1)
        file.close();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r != 0) return;
    Reader f(path);
    EXPECT_EQ(f.doubles("/iterations/x").dims, (std::vector<hsize_t>{0, hsize_t(n)}));
    EXPECT_TRUE(f.ints("/iterations/ranks").empty());
    const auto x = f.aggregates("/iterations/aggregate/x");
    ASSERT_EQ(x.size(), static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) { // row i: ranks i..n-1
        EXPECT_EQ(x[i].count, n - i) << i;
        EXPECT_DOUBLE_EQ(x[i].min, 10.0 * i + i) << i;
        EXPECT_DOUBLE_EQ(x[i].max, 10.0 * (n - 1) + i) << i;
        EXPECT_EQ(x[i].argmax, n - 1) << i;
        EXPECT_DOUBLE_EQ(x[i].slowest, 10.0 * (n - 1) + i) << i; // the largest step_s: rank n-1
    }
    EXPECT_EQ(f.int_attr("/iterations/aggregate", "rows"), n);
}

// output.per_rank and output.mpi_hints as the session resolves them; bad values name the option.
TEST(RunFileOptions, PerRankModesAndHintsParse) {
    EXPECT_EQ(io::parse_per_rank("auto", io::kPerRankAutoRanks).str(), "all");
    EXPECT_EQ(io::parse_per_rank("auto", 64).str(), "every:2");
    EXPECT_EQ(io::parse_per_rank("auto", 16384).str(), "every:512");
    const io::PerRank every = io::parse_per_rank("every:3", 64);
    EXPECT_TRUE(every.writes(0, 0) && every.writes(3, 3) && !every.writes(4, 0));
    const io::PerRank node = io::parse_per_rank("node", 64);
    EXPECT_TRUE(node.writes(5, 0) && !node.writes(5, 1));
    EXPECT_FALSE(io::parse_per_rank("none", 2).writes(0, 0));
    for (const char* bad : {"every:0", "every:", "every:2x", "some", ""}) {
        try {
            io::parse_per_rank(bad, 8);
            ADD_FAILURE() << bad << " was accepted";
        } catch (const core::ConfigError& e) {
            EXPECT_NE(std::string(e.what()).find("output.per_rank"), std::string::npos) << e.what();
        }
    }
    const auto hints = io::parse_mpi_hints("striping_factor=8,romio_cb_write=disable");
    ASSERT_EQ(hints.size(), 2u);
    EXPECT_EQ(hints[1], (std::pair<std::string, std::string>{"romio_cb_write", "disable"}));
    EXPECT_TRUE(io::parse_mpi_hints("").empty());
    for (const char* bad : {"striping_factor", "=8", "a=1,b", "a = 1"})
        EXPECT_THROW(io::parse_mpi_hints(bad), core::ConfigError) << bad;
}

// output.alignment_bytes reaches HDF5: a dataset of at least that size starts on a multiple of it
// (and, as a control, does not without the hint); MPI-IO hints are accepted.
TEST_F(RunFileTest, AlignmentHintAlignsLargeDatasets) {
    std::vector<haddr_t> offsets;
    for (const std::int64_t alignment : {std::int64_t{0}, std::int64_t{4096}}) {
        const std::string path = dir_ + "/aligned" + std::to_string(alignment) + ".h5";
        io::AccessHints hints;
        hints.mpi_hints = {{"cb_nodes", "1"}};
        hints.alignment_bytes = alignment;
        {
            auto file =
                io::RunFile::create(MPI_COMM_WORLD, path, false, {}, io::SchemaCheck::off, hints);
            file.write_vector("small", {1.0, 2.0, 3.0}, "1");
            file.write_vector("large", std::vector<double>(1000, 0.5), "1");
        }
        MPI_Barrier(MPI_COMM_WORLD);
        if (world_rank() != 0) continue;
        Reader f(path);
        const hid_t d = H5Dopen2(f.file, "/large", H5P_DEFAULT);
        offsets.push_back(H5Dget_offset(d));
        H5Dclose(d);
    }
    if (world_rank() != 0) return;
    ASSERT_EQ(offsets.size(), 2u);
    EXPECT_NE(offsets[0] % 4096, 0u) << "the control is aligned by chance: " << offsets[0];
    EXPECT_EQ(offsets[1] % 4096, 0u) << offsets[1];
}

TEST_F(RunFileTest, DestructorWritesBufferedRowsAndCloses) {
    const std::string path = dir_ + "/run.h5";
    const int r = world_rank();
    {
        auto file = io::RunFile::create(MPI_COMM_WORLD, path, false, {}, io::SchemaCheck::off);
        file.declare_series("telemetry/cpu", {{"util", "percent"}});
        for (int i = 0; i <= r; ++i)
            file.append("telemetry/cpu", {r + 0.5 * i});
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r != 0) return;
    Reader f(path);
    const auto a = f.doubles("/telemetry/cpu/util");
    const int n = world_size();
    ASSERT_EQ(a.dims, (std::vector<hsize_t>{hsize_t(n), hsize_t(n)}));
    for (int k = 0; k < n; ++k)
        for (int i = 0; i < n; ++i) {
            if (i <= k)
                EXPECT_EQ(a.at(k, i), k + 0.5 * i);
            else
                EXPECT_TRUE(std::isnan(a.at(k, i)));
        }
    EXPECT_EQ(f.str_attr("/", "status"), "running");
}

TEST_F(RunFileTest, RaggedTableUsesRankOffsetsAndIndexes) {
    const std::string path = dir_ + "/run.h5";
    const int r = world_rank(), n = world_size();
    auto count = [](int k) { return k == 1 ? 0 : k + 2; }; // rank 1 has nothing
    {
        auto file = io::RunFile::create(MPI_COMM_WORLD, path, false, {}, io::SchemaCheck::off);
        std::vector<double> mine;
        for (int j = 0; j < count(r); ++j)
            mine.push_back(100.0 * r + j);
        file.write_ragged("/profile/op_ms", mine, "ms");
        file.close();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r != 0) return;
    Reader f(path);
    const auto values = f.doubles("/profile/op_ms");
    const auto offsets = f.ints("/profile/op_ms_offset");
    const auto counts = f.ints("/profile/op_ms_count");
    ASSERT_EQ(offsets.size(), static_cast<std::size_t>(n));
    ASSERT_EQ(counts.size(), static_cast<std::size_t>(n));
    std::int64_t total = 0;
    for (int k = 0; k < n; ++k) {
        EXPECT_EQ(offsets[k], total);
        EXPECT_EQ(counts[k], count(k));
        for (int j = 0; j < count(k); ++j)
            EXPECT_EQ(values.values.at(total + j), 100.0 * k + j);
        total += count(k);
    }
    EXPECT_EQ(values.dims, std::vector<hsize_t>{hsize_t(total)});
    EXPECT_EQ(f.str_attr("/profile/op_ms", "units"), "ms");
    EXPECT_EQ(f.str_attr("/profile/op_ms_offset", "units"), "1");
    EXPECT_EQ(f.str_attr("/profile/op_ms_count", "units"), "1");
}

TEST_F(RunFileTest, RaggedStringsAndPerRankValues) {
    const std::string path = dir_ + "/run.h5";
    const int r = world_rank(), n = world_size();
    // Rank k writes k strings (rank 0 none), one of them longer than any other rank's, with UTF-8.
    auto text = [](int k, int j) {
        return "op" + std::to_string(k) + "." + std::to_string(j) + std::string(k + j, 'x') +
               (j == 0 ? "\xc2\xb5s" : "");
    };
    {
        auto file = io::RunFile::create(MPI_COMM_WORLD, path, false, {}, io::SchemaCheck::off);
        std::vector<std::string> mine;
        for (int j = 0; j < r; ++j)
            mine.push_back(text(r, j));
        file.write_ragged_strings("/profile/top_ops/name", mine);
        file.write_per_rank("/profile/window_s", 0.5 + r, "s");
        file.close();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r != 0) return;
    Reader f(path);
    const auto offsets = f.ints("/profile/top_ops/name_offset");
    const auto counts = f.ints("/profile/top_ops/name_count");
    ASSERT_EQ(counts.size(), static_cast<std::size_t>(n));
    const hid_t d = H5Dopen2(f.file, "/profile/top_ops/name", H5P_DEFAULT);
    ASSERT_GE(d, 0);
    const hid_t t = H5Dget_type(d);
    const hid_t s = H5Dget_space(d);
    EXPECT_EQ(H5Tget_class(t), H5T_STRING);
    EXPECT_EQ(H5Tget_cset(t), H5T_CSET_UTF8);
    EXPECT_EQ(H5Tis_variable_str(t), 0);
    const std::size_t width = H5Tget_size(t);
    std::size_t longest = 1, total = 0;
    for (int k = 0; k < n; ++k)
        for (int j = 0; j < k; ++j, ++total)
            longest = std::max(longest, text(k, j).size());
    EXPECT_EQ(width, longest);
    ASSERT_EQ(H5Sget_simple_extent_npoints(s), static_cast<hssize_t>(total));
    std::vector<char> raw(width * total + 1, '\0');
    if (total > 0) H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data());
    H5Sclose(s);
    H5Tclose(t);
    H5Dclose(d);
    std::int64_t expected_offset = 0;
    for (int k = 0; k < n; ++k) {
        EXPECT_EQ(offsets[k], expected_offset);
        EXPECT_EQ(counts[k], k);
        for (int j = 0; j < k; ++j) {
            const std::string cell(raw.data() + (expected_offset + j) * width, width);
            EXPECT_EQ(cell.substr(0, cell.find('\0')), text(k, j));
        }
        expected_offset += k;
    }
    EXPECT_EQ(f.str_attr("/profile/top_ops/name", "units"), "text");
    EXPECT_EQ(f.str_attr("/profile/top_ops/name_count", "units"), "1");

    const auto window = f.doubles("/profile/window_s");
    EXPECT_EQ(window.dims, std::vector<hsize_t>{hsize_t(n)});
    for (int k = 0; k < n; ++k)
        EXPECT_EQ(window.values.at(k), 0.5 + k);
    EXPECT_EQ(f.str_attr("/profile/window_s", "units"), "s");
}

TEST_F(RunFileTest, VectorHoldsRankZerosValues) {
    const std::string path = dir_ + "/run.h5";
    const int r = world_rank();
    {
        auto file = io::RunFile::create(MPI_COMM_WORLD, path, false, {}, io::SchemaCheck::off);
        // Other ranks pass different (even longer) vectors: only rank 0's count and values count.
        std::vector<double> mine =
            r == 0 ? std::vector<double>{8, 16, 32} : std::vector<double>(5, -1.0 * r);
        file.write_vector("/comm/allreduce/bytes", mine, "B");
        file.write_vector("/comm/allreduce/bytes", mine, "B"); // replaces, no error
        file.write_vector("/comm/empty", {}, "s");
        file.close();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r != 0) return;
    Reader f(path);
    const auto bytes = f.doubles("/comm/allreduce/bytes");
    EXPECT_EQ(bytes.dims, std::vector<hsize_t>{3});
    EXPECT_EQ(bytes.values, (std::vector<double>{8, 16, 32}));
    EXPECT_EQ(f.str_attr("/comm/allreduce/bytes", "units"), "B");
    EXPECT_EQ(f.doubles("/comm/empty").dims, std::vector<hsize_t>{0});
    EXPECT_EQ(f.str_attr("/comm/empty", "units"), "s");
}

TEST(IoOptions, DeclaresOutputSection) {
    core::OptionRegistry registry;
    io::declare_options(registry);
    const auto config = core::Config::from_values(registry, {});
    EXPECT_EQ(config.get_string("output.file"), "trainscope_run.h5");
    EXPECT_FALSE(config.get_bool("output.overwrite"));
    EXPECT_EQ(config.get_int("output.flush_every"), 50);
    EXPECT_THROW(core::Config::from_values(registry, {{"output.flush_every", "0"}}),
                 core::ConfigError);
}

// The schema table (modules/io/src/schema_table.cpp) is the one description of the run file: every
// attribute, column and field belongs to an object the table declares, nothing is declared twice,
// datasets and columns carry units and attributes a type, and paths are in normal form.
TEST(SchemaTable, IsConsistent) {
    namespace schema = io::schema;
    std::set<std::string> seen;
    for (const schema::Entry& e : schema::table()) {
        const std::string where = std::string(schema::to_string(e.kind)) + " " +
                                  std::string(e.path) + (e.name.empty() ? "" : "@") +
                                  std::string(e.name);
        EXPECT_TRUE(seen.insert(where).second) << "declared twice: " << where;
        EXPECT_EQ(schema::normalize(e.path), e.path) << where;
        EXPECT_FALSE(e.meaning.empty()) << where << " has no meaning";
        EXPECT_EQ(std::string(e.meaning).find('\n'), std::string::npos) << where;
        EXPECT_EQ(std::string(e.meaning).find('|'), std::string::npos) << where;
        switch (e.kind) {
        case schema::Kind::attribute:
        case schema::Kind::field:
            EXPECT_FALSE(e.name.empty()) << where;
            EXPECT_FALSE(e.type.empty()) << where << " has no type";
            EXPECT_NE(schema::find_object(e.path), nullptr) << where << ": no such object";
            break;
        case schema::Kind::column:
            EXPECT_FALSE(e.name.empty()) << where;
            EXPECT_FALSE(e.units.empty()) << where << " has no units";
            EXPECT_NE(schema::find_object(e.path, {schema::Kind::series, schema::Kind::table}),
                      nullptr)
                << where << ": not a column of a series or table";
            break;
        case schema::Kind::group:
        case schema::Kind::series:
        case schema::Kind::table:
            EXPECT_TRUE(e.name.empty() && e.units.empty()) << where;
            break;
        default: // datasets
            EXPECT_TRUE(e.name.empty()) << where;
            EXPECT_FALSE(e.units.empty()) << where << " has no units";
        }
    }
    // Placeholders match one name; filled paths resolve to the template's entry.
    const schema::Entry* bytes =
        schema::find_object(schema::with_part(schema::kCommOpBytes, "allreduce"));
    ASSERT_NE(bytes, nullptr);
    EXPECT_EQ(bytes->path, schema::kCommOpBytes);
    EXPECT_EQ(schema::find_object("/comm/all/reduce/bytes"), nullptr);
    EXPECT_NE(schema::find_member(schema::Kind::column, schema::kCommBuckets, "bucket_12_s"),
              nullptr);
    EXPECT_EQ(schema::find_member(schema::Kind::column, schema::kCommBuckets, "bucket__s"),
              nullptr);
    EXPECT_EQ(schema::child("profile/top_ops/", "count"), "/profile/top_ops/count");
    // An exact spelling wins over a placeholder: /comm/buckets is not a /comm/{op}.
    EXPECT_EQ(schema::find_member(schema::Kind::attribute, "/comm/buckets", "busbw_factor"),
              nullptr);
    EXPECT_NE(schema::find_member(schema::Kind::attribute, "/comm/allreduce", "busbw_factor"),
              nullptr);
    EXPECT_EQ(schema::find_member(schema::Kind::attribute, schema::kSummary, "median_step_s")->name,
              "median_step_s");
}

// A strict file (the application's) refuses, on every rank and before touching the file, what the
// table does not declare, so the page generated from the table cannot fall behind the writers.
TEST_F(RunFileTest, StrictFilesRefuseWhatTheSchemaTableDoesNotDeclare) {
    namespace schema = io::schema;
    const std::string path = dir_ + "/run.h5";
    auto expect_refused = [](auto&& write, const std::string& says) {
        try {
            write();
            ADD_FAILURE() << "accepted; expected a refusal naming " << says;
        } catch (const core::InternalError& e) {
            const std::string m = e.what();
            EXPECT_NE(m.find(says), std::string::npos) << m;
            EXPECT_NE(m.find("schema_table.cpp"), std::string::npos) << m;
        }
    };
    EXPECT_THROW(io::RunFile::create(MPI_COMM_WORLD, dir_ + "/bad.h5", false, {{"lr0", 0.1}}),
                 core::InternalError);
    EXPECT_FALSE(fs::exists(dir_ + "/bad.h5"));
    auto file = io::RunFile::create(MPI_COMM_WORLD, path, false, {{"workload", "cv"}});
    expect_refused(
        [&] {
            file.set_attributes(schema::kPlan, {{"not_planned", std::int64_t{1}}});
        },
        "'not_planned' of /plan");
    expect_refused(
        [&] {
            file.declare_series(schema::kIterations, {{"step_s", "ms"}});
        },
        "units 'ms'");
    expect_refused(
        [&] {
            file.declare_series(schema::kIterations, {{"stepp_s", "s"}});
        },
        "'stepp_s' of /iterations");
    expect_refused([&] { file.write_per_rank("/profile/made_up_s", 1.0, "s"); },
                   "/profile/made_up_s");
    expect_refused([&] { file.write_vector("/comm/allreduce/bytes", {1.0}, "1"); }, "units '1'");
    // What the table declares is written, placeholders filled.
    file.set_attributes(schema::kPlan, {{"global_batch", std::int64_t{64}}});
    file.declare_series(schema::kIterations, {{"iteration", "1"}, {"step_s", "s"}});
    file.write_vector(schema::with_part(schema::kCommOpBytes, "allreduce"), {8.0}, "B");
    file.close();
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) {
        Reader f(path);
        EXPECT_EQ(f.str_attr("/comm/allreduce/bytes", "units"), "B");
    }
}

} // namespace
