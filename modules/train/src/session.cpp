// Session (see session.hpp): the environment every workload shares, the run file's metadata
// (root attributes, /config, /build, /ranks, /plan), checkpoints and --resume, and the hand-over
// to the workload.
#include "trainscope/train/session.hpp"

#include <ATen/Parallel.h>
#include <sched.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <sstream>
#include <thread>

#include "trainscope/core/build_info.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/core/mpi_util.hpp"
#include "trainscope/distributed/device.hpp"
#include "trainscope/distributed/mpi_runtime.hpp"
#include "trainscope/io/options.hpp"
#include "trainscope/io/run_file.hpp"
#include "trainscope/io/schema.hpp"
#include "trainscope/prof/memory.hpp"
#include "trainscope/train/checkpoint.hpp"
#include "trainscope/train/options.hpp"
#include "trainscope/train/run_control.hpp"
#include "trainscope/train/workload.hpp"

namespace trainscope::train {

namespace schema = io::schema;
namespace {

// run.threads=0: a rank bound to a CPU set (srun --cpu-bind, mpirun --bind-to) gets that set's
// size; an unbound rank an equal share of the node's cores. Counting the node's cores for a bound
// rank would put several busy threads on its one core.
int threads_per_rank(std::int64_t requested, int local_size) {
    if (requested > 0) return static_cast<int>(requested);
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    cpu_set_t set;
    CPU_ZERO(&set);
    const int allowed =
        sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : static_cast<int>(cores);
    return allowed < static_cast<int>(cores)
               ? std::max(1, allowed)
               : static_cast<int>(std::max<unsigned>(1, cores / std::max(1, local_size)));
}

} // namespace

struct Session::State {
    RunEnvironment env;
    std::string command_line;
    bool resume = false;
    std::unique_ptr<Workload> workload;
    std::unique_ptr<io::RunFile> file;
    std::unique_ptr<Checkpointer> checkpointer;
    std::string path;     // the run file this job writes
    bool resumed = false; // --resume: the checkpoint's state is restored in prepare()
    bool restored = false;
};

Session::Session(const core::CommandLine& cli, const dist::Topology& topo, MPI_Comm world)
    : s_(std::make_unique<State>()) {
    State& s = *s_;
    RunEnvironment& env = s.env;
    env.cfg = cli.config;
    env.topo = topo;
    env.world = world;
    env.dry_run = cli.dry_run;
    s.command_line = cli.command_line;
    s.resume = cli.resume;
    core::Config& c = env.cfg;
    core::log::set_level(core::log::parse_level(c.get_string("log.level")));
    // The workload's own defaults first: what reads the options, and /config, see what runs.
    if (const std::vector<std::string> applied = apply_workload_defaults(c); !applied.empty()) {
        std::string list;
        for (const auto& d : applied)
            list += (list.empty() ? "" : ", ") + d;
        core::log::info() << "run.workload=" << c.get_string("run.workload")
                          << " defaults (torchtune) for options left unset: " << list;
    }

    dist::agree_on_errors(world, [&] {
        RunControlOptions::from_config(c);  // checkpoint.every and the run.* fault options
        FaultInjection::from_environment(); // a malformed test hook fails here, on every rank
        if (s.resume && env.dry_run)
            throw core::ConfigError("--resume and --dry-run together: a dry run trains nothing; "
                                    "drop one of them");
        env.layout = ParallelLayout::kinds(c); // the workloads check the kinds
        env.train = read_train_config(c);
        s.workload = make_workload(env);
        env.layout = ParallelLayout::resolve(c, topo.world_size, s.workload->pipeline_stages(),
                                             s.workload->sharded_data(),
                                             s.workload->gradient_accumulation());
        env.threads_per_rank = threads_per_rank(c.get_int("run.threads"), topo.local_size);
        const int gpus = dist::cuda_device_count();
        env.dist = dist::resolve_options(c, gpus, gpus > 0 ? "" : dist::cuda_unavailable_reason(),
                                         dist::launch_environment());
        if (c.get_bool("run.deterministic")) {
            if (c.get_bool("run.cudnn_benchmark"))
                throw core::ConfigError("run.deterministic=true and run.cudnn_benchmark=true "
                                        "conflict: benchmark mode picks algorithms by timing; "
                                        "set one of them to false");
            // cuBLAS needs a fixed workspace for reproducible results; before any CUDA use.
            ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
        }
        if (const std::string m = dist::launch_problem(topo, dist::launch_environment());
            !m.empty())
            throw core::ConfigError(m);
    });
    // A phase of its own: bind_device is collective (the ranks compare the GPUs they chose), so
    // every rank must get there, which the agreement above guarantees.
    dist::agree_on_errors(world, [&] {
        env.device = dist::bind_device(env.dist.device, topo, env.dist.backend == "nccl", world);
        if (!env.dist.auto_reason.empty()) core::log::info() << env.dist.auto_reason;
        if (core::log::rank() == 0) {
            if (!env.device.shared.empty()) core::log::warn() << env.device.shared;
            // run.strategy=dp drives every GPU it sees from one rank: none is idle.
            if (!env.device.idle.empty() && env.layout.strategy != Strategy::Dp)
                core::log::warn() << env.device.idle;
            if (c.get_bool("data.pin_memory") && !env.device.device.is_cuda())
                core::log::warn() << "data.pin_memory=true is dropped: run.device resolved to "
                                  << env.device.device.str()
                                  << ", and pinned host memory only speeds copies to a GPU; the "
                                     "batches stay in pageable memory (/plan pin_memory=0; set "
                                     "data.pin_memory=false to silence this)";
        }
        env.precision = s.workload->precision();
        env.policy = resolve_precision(env.precision, env.device.device);
        s.workload->check(env);
        check_compression(env, s.workload->kind());
    });
    apply_math_mode(env.policy);
    at::globalContext().setBenchmarkCuDNN(c.get_bool("run.cudnn_benchmark"));
    if (c.get_bool("run.deterministic")) {
        // CUDA lacks deterministic backwards that the workloads need (adaptive_avg_pool2d and
        // nll_loss in MobileNetV2): strict mode would throw at the first backward, so CUDA runs
        // warn instead, and say so once.
        const bool cuda = env.device.device.is_cuda();
        at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/cuda);
        at::globalContext().setDeterministicCuDNN(true);
        if (cuda && core::log::rank() == 0)
            core::log::warn() << "run.deterministic=true on CUDA runs in warn-only mode: "
                                 "operations without a deterministic CUDA implementation (e.g. "
                                 "adaptive_avg_pool2d and nll_loss backward) warn instead of "
                                 "failing, and are not bitwise reproducible";
    }
    const bool named = !env.device.name.empty() && env.device.name != env.device.device.str();
    // Rank 0 alone lists every rank's device (the plan's rank lines): gathered there only.
    env.devices = core::gather_strings(world, env.device.device.str() +
                                                  (named ? " (" + env.device.name + ")" : ""));
    const std::string malloc_policy = prof::apply_host_memory_policy(
        c.get_string("run.host_memory") == "release" ? prof::HostMemoryPolicy::Release
                                                     : prof::HostMemoryPolicy::Retain);
    core::log::debug() << "run.host_memory=" << c.get_string("run.host_memory") << ": "
                       << (malloc_policy.empty() ? "not glibc, nothing changed" : malloc_policy);
    at::set_num_threads(env.threads_per_rank);
    try {
        at::set_num_interop_threads(1);
    } catch (const std::exception&) {
        // Already set (e.g. a second Session in one process): keep the existing pool.
    }
}

Session::~Session() = default;

bool Session::run_file_open() const {
    return s_->file != nullptr;
}

bool Session::interrupted() const {
    return s_->workload && s_->workload->interrupted();
}

std::string Session::plan_text() const {
    return s_->workload->plan_text();
}

void Session::open_run_file() {
    State& s = *s_;
    const core::Config& c = s.env.cfg;
    const dist::Topology& topo = s.env.topo;
    MPI_Comm world = s.env.world;
    std::vector<io::Attribute> root = {
        {"trainscope_version", core::build_info().trainscope_version},
        {"git_sha", core::build_info().git_sha},
        {"command_line", s.command_line},
        {"world_size", static_cast<std::int64_t>(topo.world_size)},
        {"num_nodes", static_cast<std::int64_t>(topo.num_nodes)},
        {"workload", std::string(to_string(s.workload->kind()))},
    };
    // Which ranks write per-rank series rows (every rank enters the aggregates).
    const io::PerRank per_rank =
        io::parse_per_rank(c.get_string("output.per_rank"), topo.world_size);
    root.push_back({"per_rank", per_rank.str()});
    io::AccessHints hints; // how the file is opened on a parallel file system
    hints.mpi_hints = io::parse_mpi_hints(c.get_string("output.mpi_hints"));
    hints.alignment_bytes = c.get_int("output.alignment_bytes");
    std::string path = c.get_string("output.file");
    int restart_index = 0;
    if (s.resume) {
        // The newest complete checkpoint, checked against this configuration on every rank.
        s.env.resumed =
            Checkpointer::find_latest(c.get_string("checkpoint.dir"), world, s.env.dist.timeout_s);
        dist::agree_on_errors(
            world, [&] { Checkpointer::check_compatible(*s.env.resumed, c, s.env.layout); });
        restart_index = s.env.resumed->restart_index + 1;
        // The continuation gets its own file beside the interrupted one (which stays as it was
        // left, plus a continued_in attribute): <stem>.resume<k><ext>.
        if (topo.rank == 0 && std::filesystem::exists(path)) {
            const std::filesystem::path p(path);
            for (int k = restart_index;; ++k) {
                const std::filesystem::path candidate =
                    p.parent_path() /
                    (p.stem().string() + ".resume" + std::to_string(k) + p.extension().string());
                if (!std::filesystem::exists(candidate)) {
                    path = candidate.string();
                    break;
                }
            }
        }
        path = core::broadcast_string(world, path, 0);
        const CheckpointManifest& m = *s.env.resumed;
        root.push_back({"restart_index", static_cast<std::int64_t>(restart_index)});
        root.push_back({"resumed_from_checkpoint", m.path});
        root.push_back({"resumed_from_iteration", m.next_iteration});
        root.push_back({"resumed_from_file", m.run_file});
        root.push_back({"resumed_from_world_size", static_cast<std::int64_t>(m.world_size)});
    }
    s.workload->claim_outputs(path);
    // RunFile::create decides collectively (rank 0 checks, all ranks get the same verdict).
    s.file = std::make_unique<io::RunFile>(io::RunFile::create(
        world, path, c.get_bool("output.overwrite"), root, io::SchemaCheck::strict, hints));
    s.file->set_sync_interval(c.get_float("output.sync_every_s"));
    s.file->select_per_rank(per_rank.writes(topo.rank, topo.local_rank));
    s.checkpointer = std::make_unique<Checkpointer>(
        c.get_string("checkpoint.dir"), static_cast<int>(c.get_int("checkpoint.keep")), world, c,
        path, restart_index, s.env.layout.global_batch());
    s.path = path;
    s.resumed = s.env.resumed.has_value();
    if (s.env.resumed && topo.rank == 0) {
        const CheckpointManifest& m = *s.env.resumed;
        core::log::info() << "resuming from " << m.path << " at iteration " << m.next_iteration
                          << " (restart " << restart_index << "); this segment writes " << path;
        if (m.world_size != topo.world_size)
            core::log::info() << "elastic resume: the checkpoint was written by " << m.world_size
                              << " ranks, this job has " << topo.world_size << "; global batch "
                              << s.env.layout.global_batch()
                              << " samples per step as before, sharded state cut again";
    }

    std::vector<io::Attribute> config;
    for (const auto& [k, v] : c.items())
        config.push_back({k, v});
    s.file->set_attributes(schema::kConfig, config);
    s.file->write_string_dataset(schema::kConfigIni, c.to_ini());

    std::vector<io::Attribute> build;
    for (const auto& [k, v] : core::build_info().items())
        build.push_back({k, v});
    build.push_back({"mpi_library", dist::mpi_library_version()});
    s.file->set_attributes(schema::kBuild, build);

    const dist::DeviceBinding& d = s.env.device;
    io::RunFile::RankRow row;
    row.rank = topo.rank;
    row.local_rank = topo.local_rank;
    row.node = topo.node;
    row.hostname = topo.hostname;
    row.pid = static_cast<long>(::getpid());
    row.device = d.device.str();
    row.device_name = d.name;
    row.pci_bus_id = d.pci_bus_id;
    row.cpu_affinity = d.cpu_affinity;
    s.file->write_ranks(row);
    s.file->flush();

    // Preflight: rank 0 prints where every rank runs (the same as /ranks), so a job's log shows
    // placement and binding mistakes before any training.
    std::ostringstream line;
    line << "  rank " << row.rank << "  local " << row.local_rank << "  node " << row.node
         << "  host " << row.hostname << "  device " << row.device
         << (row.pci_bus_id.empty() ? "" : " (" + row.pci_bus_id + ")") << "  cpus "
         << row.cpu_affinity;
    const std::vector<std::string> lines = core::gather_strings(world, line.str()); // rank 0 prints
    if (topo.rank == 0) {
        std::ostringstream o;
        o << "placement: " << topo.world_size << " rank(s) on " << topo.num_nodes << " node(s)";
        for (const auto& l : lines)
            o << "\n" << l;
        core::log::info() << o.str();
    }
}

void Session::prepare() {
    State& s = *s_;
    s.workload->build(); // with --resume: restores the checkpoint (its rank files checked)
    if (s.file) s.file->set_attributes(schema::kPlan, s.workload->plan_attributes());
    if (s.resumed && s.file && s.env.topo.rank == 0) {
        // Link the interrupted run's file to its continuation, now that the resume holds; only a
        // file of this job's output series (the manifest is data: it may name any path), and a
        // missing or unreadable old file only costs the link.
        const CheckpointManifest& m = *s.env.resumed;
        const std::string output = s.env.cfg.get_string("output.file");
        try {
            if (!in_output_series(m.run_file, output))
                core::log::info() << "not marking " << m.run_file << " as continued in " << s.path
                                  << ": it is not output.file (" << output
                                  << ") or one of its continuations";
            else if (std::filesystem::exists(m.run_file) && m.run_file != s.path)
                io::annotate_closed_run_file(m.run_file, {{"continued_in", s.path}});
        } catch (const std::exception& e) {
            core::log::warn() << "could not mark " << m.run_file << " as continued in " << s.path
                              << ": " << e.what();
        }
    }
    s.restored = true;
}

bool Session::refused_resume() const {
    return s_->resumed && !s_->restored;
}

void Session::discard_run_file() {
    State& s = *s_;
    if (!s.file) return;
    s.file->close();
    s.file.reset();
    if (s.env.topo.rank != 0) return;
    std::error_code ec;
    std::filesystem::remove(s.path, ec);
    if (ec)
        core::log::warn() << "could not remove " << s.path
                          << " after the refused resume: " << ec.message();
}

void Session::run() {
    State& s = *s_;
    if (!s.file) throw core::InternalError("Session::run before open_run_file");
    s.workload->run(*s.file, s.checkpointer.get());
}

void Session::close_run_file(const std::string& status, const std::string& error) {
    State& s = *s_;
    if (!s.file) return;
    if (!error.empty()) s.file->set_attributes(schema::kRoot, {{"error", error}});
    s.file->set_status(status);
    s.file->close();
    s.file.reset();
}

} // namespace trainscope::train
