// trainscope: one MPI job that trains a configured workload and writes every timing, memory
// counter and per-rank profile into one parallel HDF5 file. Reads top to bottom:
// bootstrap → configuration → build the workload → run → write → finalize.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string_view>
#include <vector>

#include "trainscope/core/build_info.hpp"
#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/distributed/mpi_runtime.hpp"
#include "trainscope/distributed/topology.hpp"
#include "trainscope/io/schema.hpp"
#include "trainscope/prof/memory.hpp"
#include "trainscope/train/options.hpp"
#include "trainscope/train/run_control.hpp"
#include "trainscope/train/session.hpp"

using namespace trainscope;

namespace {

// Not an error: a stop signal (SIGTERM, SIGUSR1, SIGINT) ended training early after every rank
// wrote its checkpoint and the run file says "interrupted". Non-zero so that a scheduler never
// reads a pre-empted or stopped job as finished (Slurm's afterok, sacct's COMPLETED, job chains);
// EX_TEMPFAIL of sysexits.h, "try again later", which --resume does. Slurm sites can requeue on
// it (slurm.conf RequeueExit=75); jobscripts/ requeue on it. docs/faults.md lists every code.
constexpr int kInterruptedExitCode = 75;

// This process's rank as the launcher tells it (mpirun, srun, PMI), without starting MPI: 0 when
// no launcher set one.
int launcher_rank() {
    for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
        if (const char* v = std::getenv(var)) {
            char* end = nullptr;
            const long r = std::strtol(v, &end, 10);
            if (end != v && *end == '\0' && r >= 0) return static_cast<int>(r);
        }
    return 0;
}

// --print-schema: the rest of the command line must be valid (an unknown option is an error, not
// ignored); printed once per job (rank 0), and a failed write (a full disk, a closed pipe) is an
// output error, not a silent truncation.
int print_schema(int argc, char** argv) {
    try {
        std::vector<const char*> rest; // the command line without --print-schema itself
        for (int i = 0; i < argc; ++i)
            if (i == 0 || std::string_view(argv[i]) != "--print-schema") rest.push_back(argv[i]);
        core::CommandLine::parse(train::all_options(), static_cast<int>(rest.size()), rest.data());
    } catch (const core::Error& e) {
        std::cerr << "error: " << core::to_string(e.kind()) << ": " << e.what() << "\n";
        return e.exit_code();
    }
    if (launcher_rank() != 0) return 0;
    std::cout << io::schema::to_json();
    std::cout.flush();
    if (!std::cout) {
        const int err = errno;
        std::cerr << "error: output error: --print-schema could not write to standard output"
                  << (err ? std::string(" (") + std::strerror(err) + ")" : std::string())
                  << ": redirect it to a writable file (scripts/gen_schema reads it from a pipe)\n";
        return static_cast<int>(core::ErrorKind::Output);
    }
    return 0;
}

} // namespace

int main(int argc, char** argv) {
    // Count live CPU tensor bytes from the first allocation on (host_tensor_* in /iterations).
    prof::install_host_tensor_counter();
    // A stop signal (SIGTERM, SIGUSR1, SIGINT) that arrives while the run starts up (MPI, data,
    // model) is kept, not fatal: training stops, checkpointed, after its first iteration. A
    // co-allocation executor or a scheduler may resize or pre-empt a job at any moment.
    train::stop_signals::install();
    // --print-schema: the run file's schema table as JSON (scripts/gen_schema turns it into the
    // readers' Python module and docs/run_file_schema.md); needs neither MPI nor a configuration.
    for (int i = 1; i < argc; ++i)
        if (std::string_view(argv[i]) == "--print-schema") return print_schema(argc, argv);
    // Bootstrap: MPI, this rank's place in the world, log prefix "[rank r/N host]". The MPI thread
    // level depends on the workload, so the command line is read once quietly before MPI starts
    // (errors are reported properly below, on every rank).
    std::string workload = "cv";
    try {
        workload = core::CommandLine::parse(train::all_options(), argc, argv)
                       .config.get_string("run.workload");
    } catch (const std::exception&) {
    }
    dist::MpiRuntime mpi(argc, argv, dist::thread_level_for_workload(workload));
    const dist::Topology topo = dist::discover_topology(MPI_COMM_WORLD);
    core::log::set_identity(topo.rank, topo.world_size, topo.hostname);

    std::unique_ptr<train::Session> session;
    try {
        // Configuration: INI files + command line, validated identically on every rank.
        const core::OptionRegistry options = train::all_options();
        core::CommandLine cli;
        dist::agree_on_errors(MPI_COMM_WORLD,
                              [&] { cli = core::CommandLine::parse(options, argc, argv); });
        if (cli.help || cli.version || cli.print_config) {
            core::Config shown = cli.config; // with the workload's defaults, as a run resolves it
            if (cli.print_config) train::apply_workload_defaults(shown);
            if (topo.rank == 0)
                std::cout << (cli.help      ? core::CommandLine::usage(options)
                              : cli.version ? core::build_info().describe() + "mpi_library: " +
                                                  dist::mpi_library_version() + "\n"
                                            : shown.to_ini(/*with_origins=*/true));
            return 0;
        }

        // Build the workload: device, run file (refuses to overwrite), data, model, communicator.
        session = std::make_unique<train::Session>(cli, topo, MPI_COMM_WORLD);
        if (!cli.dry_run) session->open_run_file();
        session->prepare();
        if (cli.dry_run) {
            if (topo.rank == 0) std::cout << session->plan_text();
            return 0;
        }

        // Run, then write the final status; the file says "completed" only here. A stop signal
        // (SIGTERM, SIGUSR1) ends training early, checkpointed: "interrupted", exit 75
        // (kInterruptedExitCode), so that schedulers and job chains do not take it for done.
        session->run();
        const bool interrupted = session->interrupted();
        session->close_run_file(interrupted ? "interrupted" : "completed");
        if (interrupted) {
            // A non-zero exit makes srun --kill-on-bad-exit (and mpirun) end the ranks still
            // running: every rank tears its run down, then all leave together, right after
            // MPI_Finalize and without the process's static teardown in between, so that each
            // exits 75 itself instead of being killed on its way out (srun would report 143).
            session.reset();
            MPI_Barrier(MPI_COMM_WORLD);
            MPI_Finalize();
            std::fflush(stdout);
            std::fflush(stderr);
            std::_Exit(kInterruptedExitCode);
        }
        return 0;
    } catch (const core::Error& e) {
        core::log::error() << core::to_string(e.kind()) << ": " << e.what();
        if (e.collective()) { // every rank is here together: fail cleanly, keep the file
            try {
                const bool refused =
                    e.kind() == core::ErrorKind::Input || e.kind() == core::ErrorKind::Config;
                if (session && session->run_file_open() && refused && session->refused_resume())
                    session->discard_run_file(); // a refused --resume leaves no continuation
                else if (session && session->run_file_open())
                    session->close_run_file("failed", e.what());
            } catch (const std::exception& close_error) {
                // A failed HDF5 write (full disk) may leave the peers inside a collective call:
                // finalizing would wait for them forever.
                core::log::error() << "output error: " << close_error.what();
                dist::MpiRuntime::abort(e.exit_code());
            }
            return e.exit_code();
        }
        dist::MpiRuntime::abort(e.exit_code()); // other ranks may wait in a collective
    } catch (const std::exception& e) {
        core::log::error() << "unexpected failure: " << e.what();
        dist::MpiRuntime::abort(static_cast<int>(core::ErrorKind::Internal));
    }
}
