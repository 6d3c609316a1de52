// Test helper (not installed): writes a run file the way the app will, from every rank, so tests
// can read it back with h5py/h5dump, including after the job was SIGKILLed mid-run.
//   mpirun -np N io_runfile_writer <path> <rows> <flush_every> [completed|kill]
// Rank r appends rows + r rows of 15 columns (value r*1000 + i + c/100, column "iteration" = i) and
// flushes every flush_every rows. "kill" buffers 3 more rows after the last flush and SIGKILLs
// every rank; "completed" (default) sets status=completed and closes. Rank 0 prints flush timings.
#include "trainscope/core/error.hpp"
#include "trainscope/io/run_file.hpp"

#include <mpi.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace io = trainscope::io;

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 4) {
        if (rank == 0)
            std::fprintf(stderr, "usage: %s <path> <rows> <flush_every> [completed|kill]\n",
                         argv[0]);
        MPI_Finalize();
        return 2;
    }
    const std::string path = argv[1];
    const int rows = std::atoi(argv[2]);
    const int flush_every = std::max(1, std::atoi(argv[3]));
    const std::string mode = argc > 4 ? argv[4] : "completed";

    try {
        auto file = io::RunFile::create(MPI_COMM_WORLD, path, /*overwrite=*/true,
                                        {{"workload", std::string("io_runfile_writer")}},
                                        io::SchemaCheck::off);
        file.set_attributes("/config", {{"train.lr", 0.1}, {"train.epochs", std::int64_t{2}}});
        file.write_string_dataset("/config/ini", "[train]\nlr = 0.1\nepochs = 2\n");
        char host[256] = {0};
        gethostname(host, sizeof host - 1);
        file.write_ranks({rank, rank, 0, host, static_cast<long>(getpid()), "cpu", "test CPU", "",
                          std::to_string(rank)});

        const std::vector<io::Column> columns = {
            {"iteration", "1"},   {"epoch", "1"},     {"t_start", "s"},      {"data_s", "s"},
            {"h2d_s", "s"},       {"forward_s", "s"}, {"backward_s", "s"},   {"comm_wait_s", "s"},
            {"optimizer_s", "s"}, {"step_s", "s"},    {"loss", "1"},         {"samples", "samples"},
            {"tokens", "tokens"}, {"lr", "1"},        {"mem_bytes", "bytes"}};
        file.declare_series("iterations", columns);

        auto row = [&](int i) {
            std::vector<double> values(columns.size());
            for (std::size_t c = 0; c < columns.size(); ++c)
                values[c] = rank * 1000.0 + i + static_cast<double>(c) / 100.0;
            values[0] = i;
            return values;
        };
        const int my_rows = rows + rank, max_rows = rows + size - 1;
        double flush_seconds = 0;
        int flushes = 0;
        for (int i = 0; i < max_rows; ++i) {
            if (i < my_rows) file.append("iterations", row(i));
            if ((i + 1) % flush_every == 0) { // the same on every rank: flush is collective
                const double t0 = MPI_Wtime();
                file.flush();
                flush_seconds += MPI_Wtime() - t0;
                ++flushes;
            }
        }
        const double t0 = MPI_Wtime();
        file.flush();
        flush_seconds += MPI_Wtime() - t0;
        ++flushes;
        if (rank == 0)
            std::printf("flushes=%d columns=%zu mean_flush_ms=%.3f\n", flushes, columns.size(),
                        1e3 * flush_seconds / flushes);

        if (mode == "kill") {
            for (int i = my_rows; i < my_rows + 3; ++i)
                file.append("iterations", row(i));
            MPI_Barrier(MPI_COMM_WORLD); // every rank flushed before anyone dies
            std::fflush(stdout);
            std::raise(SIGKILL);
        }
        file.set_status("completed");
        file.close();
    } catch (const trainscope::core::Error& e) {
        std::fprintf(stderr, "[rank %d] %s\n", rank, e.what());
        MPI_Finalize();
        return e.exit_code();
    }
    MPI_Finalize();
    return 0;
}
