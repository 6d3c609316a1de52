// Peer for scripts/bench flush_scaling (a benchmark program, not a test): what the collectives of
// a run-file flush and sync cost on this machine at this rank count, without HDF5 or trainscope.
//   mpi_collective_latency FILE [reps=20]
// Every measurement starts after a barrier (as the flush's work starts after its first
// allreduce), and a repeat's time is the largest over ranks; the median over repeats is printed.
// Measured:
//   allreduce    MPI_Allreduce of 12 doubles (a flush's agreement: 2G + 4, G = 4 series)
//   barrier      MPI_Barrier
//   bcast        MPI_Bcast of 4 KiB from rank 0 (a metadata entry HDF5 reads collectively)
//   file_sync    each rank pwrites 8 bytes into FILE through MPI-IO, then MPI_File_sync
//   sync_like    the collectives of one sync as the PMPI counter of tests/mpi/test_run_file.cpp
//                counts them (3 allreduces, 2 barriers, 10 broadcasts, one collective write,
//                MPI_File_sync), back to back: a sync's floor on this machine at this N
// Prints one line on rank 0: JSON {"ranks": N, "<name>_s": median seconds, ...}.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace {

double median_of_largest(MPI_Comm comm, int reps, const std::function<void()>& op) {
    for (int i = 0; i < 3; ++i) // warm-up: connections, buffers
        op();
    std::vector<double> largest;
    for (int i = 0; i < reps; ++i) {
        MPI_Barrier(comm);
        const double t0 = MPI_Wtime();
        op();
        double t = MPI_Wtime() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm);
        largest.push_back(t);
    }
    std::sort(largest.begin(), largest.end());
    return largest[largest.size() / 2];
}

} // namespace

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    if (argc < 2) {
        std::fprintf(stderr, "usage: mpi_collective_latency FILE [reps=20]\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const std::string path = argv[1];
    const int reps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 20;
    int rank = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    MPI_File fh;
    if (MPI_File_open(comm, path.c_str(), MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &fh) !=
        MPI_SUCCESS) {
        if (rank == 0) std::fprintf(stderr, "mpi_collective_latency: cannot open %s\n", argv[1]);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    std::vector<double> small(12, 1.0);
    std::vector<char> entry(4096, 'x');
    const double value = rank;
    const MPI_Offset at = static_cast<MPI_Offset>(rank) * 8;

    auto allreduce = [&] {
        MPI_Allreduce(MPI_IN_PLACE, small.data(), 12, MPI_DOUBLE, MPI_MAX, comm);
    };
    auto barrier = [&] { MPI_Barrier(comm); };
    auto bcast = [&] { MPI_Bcast(entry.data(), 4096, MPI_CHAR, 0, comm); };
    auto file_sync = [&] {
        MPI_File_write_at(fh, at, &value, 1, MPI_DOUBLE, MPI_STATUS_IGNORE);
        MPI_File_sync(fh);
    };
    auto sync_like = [&] {
        for (int i = 0; i < 3; ++i)
            allreduce();
        for (int i = 0; i < 2; ++i)
            barrier();
        for (int i = 0; i < 10; ++i)
            bcast();
        MPI_File_write_at_all(fh, at, &value, 1, MPI_DOUBLE, MPI_STATUS_IGNORE);
        MPI_File_sync(fh);
    };
    const std::vector<std::pair<const char*, std::function<void()>>> ops = {
        {"allreduce", allreduce}, {"barrier", barrier},     {"bcast", bcast},
        {"file_sync", file_sync}, {"sync_like", sync_like},
    };
    std::string json = "{\"ranks\": " + std::to_string(n);
    for (const auto& [name, op] : ops) {
        const double s = median_of_largest(comm, reps, op);
        char buf[96];
        std::snprintf(buf, sizeof buf, ", \"%s_s\": %.9g", name, s);
        json += buf;
    }
    json += "}";
    MPI_File_close(&fh);
    if (rank == 0) std::printf("%s\n", json.c_str());
    MPI_Comm_free(&comm);
    MPI_Finalize();
    return 0;
}
