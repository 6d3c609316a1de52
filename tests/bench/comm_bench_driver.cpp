// Driver for scripts/bench comm_mpi (a benchmark program, not a test) until run.workload=comm is
// wired into the application: runs dist::CommBenchmark over the MPI communicator with comm.*
// options given as key=value arguments, prints rank 0's table and, with out=<file.h5>, writes /comm
// into a run file with the application's writer (train/run_file_tables.hpp).
//   comm_bench_driver comm.min_bytes=8 comm.max_bytes=67108864 comm.ops=allreduce [out=comm.h5]
// Prints "op bytes count time_s time_max_s algbw_GBps busbw_GBps" per size on rank 0.
#include <mpi.h>
#include <torch/torch.h>

#include <cstdio>
#include <map>
#include <string>

#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/distributed/comm_benchmark.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/mpi_runtime.hpp"
#include "trainscope/distributed/options.hpp"
#include "trainscope/io/run_file.hpp"
#include "trainscope/train/run_file_tables.hpp"

namespace dist = trainscope::dist;
namespace core = trainscope::core;
namespace io = trainscope::io;
namespace train = trainscope::train;

int main(int argc, char** argv) {
    int provided = 0;
    // As the app runs run.workload=comm.
    MPI_Init_thread(&argc, &argv, dist::thread_level_for_workload("comm"), &provided);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int rc = 0;
    try {
        std::map<std::string, std::string> values;
        std::string out;
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            const auto eq = a.find('=');
            if (eq == std::string::npos)
                throw core::ConfigError("argument '" + a + "': expected key=value");
            if (a.substr(0, eq) == "out")
                out = a.substr(eq + 1);
            else
                values[a.substr(0, eq)] = a.substr(eq + 1);
        }
        core::OptionRegistry registry;
        dist::declare_options(registry);
        const auto config = core::Config::from_values(registry, values);
        torch::set_num_threads(1);
        {
            auto comm = dist::make_communicator("mpi", MPI_COMM_WORLD, torch::Device(torch::kCPU));
            const dist::CommBenchmark bench(dist::CommBenchmarkOptions::from_config(config));
            const auto results = bench.run(*comm);
            if (rank == 0) {
                std::printf("# op bytes count time_s time_max_s algbw_GBps busbw_GBps (%s, %d "
                            "ranks)\n",
                            comm->backend().c_str(), comm->size());
                for (const auto& r : results)
                    std::printf("%s %lld %lld %.9g %.9g %.6g %.6g\n", dist::to_string(r.op),
                                static_cast<long long>(r.bytes), static_cast<long long>(r.count),
                                r.time_s, r.time_max_s, r.algbw_GBps, r.busbw_GBps);
            }
            if (!out.empty()) {
                auto file = io::RunFile::create(MPI_COMM_WORLD, out, /*overwrite=*/true,
                                                {{"workload", std::string("comm")}});
                train::write_comm_benchmark(file, bench.options(), results, comm->backend(),
                                            comm->size(), comm->allreduce_algorithm());
                file.set_status("completed");
                file.close();
            }
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "comm_bench_driver: %s\n", e.what());
        rc = 1;
    }
    if (rc != 0) MPI_Abort(MPI_COMM_WORLD, rc);
    MPI_Finalize();
    return rc;
}
