// Reference for scripts/bench comm_mpi (a benchmark program, not a test): a plain MPI_Allreduce
// loop (float32, sum, in place, like trainscope's MPI backend) over the same sizes and with the
// same timing rules as dist::CommBenchmark: a warm-up at the largest and smallest size, then per
// size warm-up, barrier, timed loop; each rank's mean time per operation averaged over ranks;
// busbw = bytes / time x 2(n-1)/n.
//   mpi_allreduce_ref [min_bytes=8] [max_bytes=67108864] [warmup=5] [iters=20]
// Prints "bytes time_s busbw_GBps" per size on rank 0.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    // TS_REF_THREAD_MULTIPLE=1 initialises MPI at MPI_THREAD_MULTIPLE, to show what that level
    // costs per call (trainscope itself runs at MPI_THREAD_SERIALIZED).
    const char* tm = std::getenv("TS_REF_THREAD_MULTIPLE");
    if (tm && std::string(tm) == "1") {
        int provided = 0;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    } else {
        MPI_Init(&argc, &argv);
    }
    auto arg = [&](int i, long long def) { return argc > i ? std::atoll(argv[i]) : def; };
    const long long min_bytes = arg(1, 8), max_bytes = arg(2, 64LL << 20);
    const int warmup = static_cast<int>(arg(3, 5)), iters = static_cast<int>(arg(4, 20));
    int rank = 0, n = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    if (rank == 0) std::printf("# bytes time_s busbw_GBps (MPI_Allreduce, %d ranks)\n", n);
    // The same sweep warm-up as CommBenchmark: the largest size, then 100 of the smallest.
    for (long long bytes : {max_bytes / 4 * 4, min_bytes / 4 * 4}) {
        std::vector<float> buf(std::max<long long>(bytes / 4, 1), 0.0f);
        for (int i = 0; i < (bytes == max_bytes / 4 * 4 ? warmup : std::max(warmup, 100)); ++i)
            MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT,
                          MPI_SUM, comm);
    }
    for (long long bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
        const int count = static_cast<int>(bytes / 4);
        if (count == 0) continue;
        std::vector<float> buf(count, 0.0f);
        for (int i = 0; i < warmup; ++i)
            MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, comm);
        MPI_Barrier(comm);
        const double t0 = MPI_Wtime();
        for (int i = 0; i < iters; ++i)
            MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, comm);
        const double mine = (MPI_Wtime() - t0) / iters;
        double sum = 0;
        MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, comm);
        const double time = sum / n;
        const double busbw = 4.0 * count / time / 1e9 * 2.0 * (n - 1) / n;
        if (rank == 0) std::printf("%lld %.9g %.6g\n", 4LL * count, time, busbw);
    }
    MPI_Comm_free(&comm);
    MPI_Finalize();
    return 0;
}
