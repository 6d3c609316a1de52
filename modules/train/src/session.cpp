// Session: configuration checks against the world, device binding, data, model, run file and the
// training run of one job on this rank.
#include "trainscope/train/session.hpp"

#include <ATen/Parallel.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <iomanip>
#include <optional>
#include <sched.h>
#include <sstream>
#include <thread>

#include "trainscope/core/build_info.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/data/datasets.hpp"
#include "trainscope/data/options.hpp"
#include "trainscope/data/text_dataset.hpp"
#include "trainscope/data/tokenizer.hpp"
#include "trainscope/dist/bandwidth.hpp"
#include "trainscope/dist/comm_benchmark.hpp"
#include "trainscope/dist/communicator.hpp"
#include "trainscope/dist/device.hpp"
#include "trainscope/dist/mpi_runtime.hpp"
#include "trainscope/dist/options.hpp"
#include "trainscope/io/run_file.hpp"
#include "trainscope/models/mobilenet_v2.hpp"
#include "trainscope/prof/phase_timer.hpp"
#include "trainscope/prof/profiler_window.hpp"
#include "trainscope/prof/telemetry.hpp"
#include "trainscope/prof/telemetry_options.hpp"
#include "trainscope/train/checkpoint.hpp"
#include "trainscope/train/classification_trainer.hpp"
#include "trainscope/train/llm_memory.hpp"
#include "trainscope/train/llm_options.hpp"
#include "trainscope/train/llm_trainer.hpp"
#include "trainscope/train/recorder.hpp"
#include "trainscope/train/run_control.hpp"

namespace trainscope::train {
namespace {

// run.scaling=strong|weak (a point of a jobscripts/sweep study): sets train.batch_size, the
// per-shard batch, from run.global_batch or run.batch_per_rank, after checking that the point is
// what the study says (the sweep checked it too, before submitting).
void apply_scaling_options(core::Config& c, int world_size) {
    const std::string scaling = c.get_string("run.scaling");
    const std::int64_t global = c.get_int("run.global_batch");
    const std::int64_t per_rank = c.get_int("run.batch_per_rank");
    if (scaling == "none") {
        if (global > 0 || per_rank > 0)
            throw core::ConfigError(
                std::string(global > 0 ? "run.global_batch" : "run.batch_per_rank") +
                " is set but run.scaling=none: set run.scaling=strong (with "
                "run.global_batch) or weak (with run.batch_per_rank)");
        return;
    }
    // The config file's batch is the study's starting point and is replaced; a batch on the
    // command line as well is a contradiction.
    for (const char* key : {"train.batch_size", "train.global_batch_size"})
        if (c.source(key) == core::ValueSource::CommandLine)
            throw core::ConfigError(
                std::string("run.scaling=") + scaling + " sets the batch from " +
                (scaling == "strong" ? "run.global_batch" : "run.batch_per_rank") + ": remove --" +
                key + " from the command line");
    c.set("train.global_batch_size", "0");
    int shards = world_size;
    std::string unit = " ranks";
    if (c.get_string("run.strategy") == "pipeline") {
        shards = pipeline_replicas(world_size, PipelineOptions::from_config(c).stages);
        unit = " pipeline replicas";
    }
    std::int64_t batch = 0;
    if (scaling == "strong") {
        if (global <= 0)
            throw core::ConfigError("run.scaling=strong needs run.global_batch: the samples per "
                                    "iteration that every point of the study shares");
        if (global % shards != 0)
            throw core::ConfigError(
                "run.scaling=strong: run.global_batch=" + std::to_string(global) +
                " does not divide over " + std::to_string(shards) + unit +
                ": this point cannot keep the study's global batch; choose a "
                "global batch every rank count divides");
        if (per_rank > 0)
            throw core::ConfigError("run.scaling=strong keeps run.global_batch: remove "
                                    "run.batch_per_rank");
        batch = global / shards;
    } else {
        if (per_rank <= 0)
            throw core::ConfigError("run.scaling=weak needs run.batch_per_rank: the samples per "
                                    "rank per iteration at every point of the study");
        if (global > 0)
            throw core::ConfigError("run.scaling=weak keeps run.batch_per_rank: remove "
                                    "run.global_batch");
        batch = per_rank;
    }
    c.set("train.batch_size", std::to_string(batch));
}

// Every rank's string, in rank order, on every rank.
std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& mine) {
    int size = 1;
    MPI_Comm_size(comm, &size);
    int len = static_cast<int>(mine.size());
    std::vector<int> lens(size), offs(size);
    MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm);
    int total = 0;
    for (int i = 0; i < size; ++i)
        offs[i] = total, total += lens[i];
    std::string all(static_cast<std::size_t>(total), '\0');
    MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR,
                   comm);
    std::vector<std::string> out;
    for (int i = 0; i < size; ++i)
        out.push_back(all.substr(offs[i], lens[i]));
    return out;
}

std::string mib(double bytes) {
    std::ostringstream o;
    o << std::fixed << std::setprecision(1) << bytes / (1024.0 * 1024.0) << " MiB";
    return o.str();
}

} // namespace

struct Session::State {
    core::Config cfg;
    std::string command_line;
    dist::Topology topo;
    MPI_Comm world;
    Plan plan;
    dist::DeviceBinding device;
    std::vector<std::string> devices; // per rank, for the plan
    std::unique_ptr<dist::Communicator> comm;
    data::DatasetSplits data;
    std::unique_ptr<ClassificationTrainer> trainer;
    std::unique_ptr<io::RunFile> file;
    TrainerOptions topt;
    PrecisionPolicy policy;
    std::vector<torch::Device> dp_devices; // run.strategy=dp
    bool dry_run = false;
    // Faults and restarts: options, the checkpointer, and with --resume the checkpoint resumed.
    bool resume = false;
    RunControlOptions control;
    std::unique_ptr<Checkpointer> checkpointer;
    std::optional<CheckpointManifest> resumed;
    bool interrupted = false;
    void make_checkpointer(int restart_index);
    void restore_checkpoint();
    // run.workload=llm
    std::unique_ptr<LlmOptions> llm;
    std::unique_ptr<data::Tokenizer> tokenizer;
    std::unique_ptr<data::TextDataset> text;
    models::LlamaConfig llama;
    std::unique_ptr<LlmTrainer> llm_trainer;
    void prepare_llm();
    void run_llm();
};

Session::Session(const core::CommandLine& cli, const dist::Topology& topo, MPI_Comm world)
    : s_(std::make_unique<State>()) {
    State& s = *s_;
    s.cfg = cli.config;
    s.command_line = cli.command_line;
    s.dry_run = cli.dry_run;
    s.resume = cli.resume;
    s.topo = topo;
    s.world = world;
    const core::Config& c = s.cfg;
    Plan& p = s.plan;
    core::log::set_level(core::log::parse_level(c.get_string("log.level")));

    dist::agree_on_errors(world, [&] {
        apply_scaling_options(s.cfg, topo.world_size);
        s.control = RunControlOptions::from_config(s.cfg);
        FaultInjection::from_environment(); // a malformed test hook fails here, on every rank
        if (s.resume && s.dry_run)
            throw core::ConfigError("--resume and --dry-run together: a dry run trains nothing; "
                                    "drop one of them");
        p.workload = c.get_string("run.workload");
        p.strategy = c.get_string("run.strategy");
        p.precision = c.get_string("run.precision");
        if (p.workload == "llm") {
            s.llm = std::make_unique<LlmOptions>(LlmOptions::from_config(c));
            p.precision = s.llm->precision; // bf16 unless set (torchtune's default)
            if (p.strategy != "ddp-ds")
                throw core::ConfigError("run.strategy=" + p.strategy +
                                        " is for run.workload=cv; LLM fine-tuning is data "
                                        "parallel over ranks (each rank its own shard, "
                                        "optionally dist.zero): set run.strategy=ddp-ds");
        }
        p.world_size = topo.world_size;
        p.num_nodes = topo.num_nodes;
        p.epochs = c.get_int("train.epochs");
        p.image_size = c.get_int("cv.image_size");
        p.channels = data::data_options(c).channels;

        // Data-parallel shards: every rank, or the pipeline's replicas (all stages of a replica
        // process the same batch).
        int shards = topo.world_size;
        if (p.strategy == "pipeline") {
            const PipelineOptions po = PipelineOptions::from_config(c);
            shards = pipeline_replicas(topo.world_size, po.stages);
            p.pipeline_stages = po.stages;
            p.pipeline_replicas = shards;
            if (c.get_string("run.precision") == "fp16-mixed" ||
                c.get_string("run.precision") == "bf16-mixed")
                throw core::ConfigError(
                    "run.precision=" + c.get_string("run.precision") +
                    " is not supported with run.strategy=pipeline (autocast and loss scaling "
                    "live in the single-model step): use fp32, tf32, bf16 or fp64");
        }
        const std::string unit = p.strategy == "pipeline" ? " replicas" : " ranks";
        // Batch split: the per-shard batch, from train.global_batch_size when given.
        p.batch_per_rank = c.get_int("train.batch_size");
        if (const std::int64_t g = c.get_int("train.global_batch_size"); g > 0) {
            if (g % shards != 0)
                throw core::ConfigError("train.global_batch_size=" + std::to_string(g) +
                                        " cannot be split evenly across " + std::to_string(shards) +
                                        unit + ": use a multiple of " + std::to_string(shards) +
                                        " (e.g. " + std::to_string((g / shards + 1) * shards) +
                                        "), or set train.batch_size (per rank) instead");
            if (!c.is_default("train.batch_size") && p.batch_per_rank * shards != g)
                throw core::ConfigError("train.batch_size=" + std::to_string(p.batch_per_rank) +
                                        " x " + std::to_string(shards) + unit +
                                        " != train.global_batch_size=" + std::to_string(g) +
                                        ": set only one of them");
            p.batch_per_rank = g / shards;
        }
        p.global_batch = p.batch_per_rank * shards;

        std::int64_t threads = c.get_int("run.threads");
        if (threads == 0) {
            // A rank bound to a CPU set (srun --cpu-bind, mpirun --bind-to) gets that set's size;
            // an unbound rank an equal share of the node's cores. Counting the node's cores for a
            // bound rank would put several busy threads on its one core.
            const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
            cpu_set_t set;
            CPU_ZERO(&set);
            const int allowed = sched_getaffinity(0, sizeof(set), &set) == 0
                                    ? CPU_COUNT(&set)
                                    : static_cast<int>(cores);
            threads = allowed < static_cast<int>(cores)
                          ? std::max(1, allowed)
                          : std::max<std::int64_t>(1, cores / std::max(1, topo.local_size));
        }
        p.threads_per_rank = static_cast<int>(threads);

        const dist::DistOptions d = dist::resolve_options(c, dist::cuda_device_count());
        if (c.get_bool("run.deterministic")) {
            if (c.get_bool("run.cudnn_benchmark"))
                throw core::ConfigError("run.deterministic=true and run.cudnn_benchmark=true "
                                        "conflict: benchmark mode picks algorithms by timing; "
                                        "set one of them to false");
            // cuBLAS needs a fixed workspace for reproducible results; before any CUDA use.
            ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
        }
        if (const std::string m =
                dist::launch_problem(topo, d.device == "cuda", dist::launch_environment());
            !m.empty())
            throw core::ConfigError(m);
        s.device = dist::bind_device(d.device, topo, d.backend == "nccl");
        p.backend = d.backend;
        p.bucket_mb = d.bucket_mb;
        p.device = s.device.device.str();
        s.policy = resolve_precision(p.precision, s.device.device);
        if (p.strategy == "dp" && topo.world_size > 1)
            throw core::ConfigError(
                "run.strategy=dp is single-process data parallelism (one process drives all of "
                "its devices) but " +
                std::to_string(topo.world_size) +
                " ranks were launched: launch 1 rank (mpirun -np 1), or use run.strategy=ddp or "
                "ddp-ds for several ranks");
        if (c.get_bool("cv.sync_bn") && p.strategy != "ddp" && p.strategy != "ddp-ds")
            throw core::ConfigError("cv.sync_bn=true needs run.strategy=ddp or ddp-ds (it "
                                    "synchronises batch statistics across data-parallel ranks), "
                                    "not run.strategy=" +
                                    p.strategy + ": set cv.sync_bn=false");
        if (p.strategy == "dp") {
            const std::int64_t want = c.get_int("dp.devices");
            const int gpus = s.device.device.is_cuda() ? dist::cuda_device_count() : 0;
            if (s.device.device.is_cuda()) {
                const int n = want == 0 ? gpus : static_cast<int>(want);
                if (n > gpus)
                    throw core::ConfigError("dp.devices=" + std::to_string(want) + " but only " +
                                            std::to_string(gpus) +
                                            " CUDA devices are visible: use dp.devices=0 (all) "
                                            "or at most " +
                                            std::to_string(gpus));
                for (int i = 0; i < n; ++i)
                    s.dp_devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(i));
            } else {
                for (std::int64_t i = 0; i < std::max<std::int64_t>(1, want); ++i)
                    s.dp_devices.emplace_back(torch::kCPU);
            }
        }
    });
    apply_math_mode(s.policy);
    at::globalContext().setBenchmarkCuDNN(c.get_bool("run.cudnn_benchmark"));
    if (c.get_bool("run.deterministic")) {
        at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
        at::globalContext().setDeterministicCuDNN(true);
    }
    const bool named = !s.device.name.empty() && s.device.name != s.device.device.str();
    s.devices =
        allgather_strings(world, s.device.device.str() + (named ? " (" + s.device.name + ")" : ""));
    at::set_num_threads(p.threads_per_rank);
    try {
        at::set_num_interop_threads(1);
    } catch (const std::exception&) {
        // Already set (e.g. a second Session in one process): keep the existing pool.
    }
}

Session::~Session() = default;

const Plan& Session::plan() const {
    return s_->plan;
}
bool Session::run_file_open() const {
    return s_->file != nullptr;
}

void Session::open_run_file() {
    State& s = *s_;
    const core::Config& c = s.cfg;
    std::vector<io::Attribute> root = {
        {"trainscope_version", core::build_info().trainscope_version},
        {"git_sha", core::build_info().git_sha},
        {"command_line", s.command_line},
        {"world_size", static_cast<std::int64_t>(s.topo.world_size)},
        {"num_nodes", static_cast<std::int64_t>(s.topo.num_nodes)},
        {"workload", c.get_string("run.workload")},
    };
    std::string path = c.get_string("output.file");
    int restart_index = 0;
    if (s.resume) {
        // The newest complete checkpoint, checked against this configuration on every rank.
        s.resumed = Checkpointer::find_latest(c.get_string("checkpoint.dir"), s.world);
        dist::agree_on_errors(s.world, [&] {
            Checkpointer::check_compatible(*s.resumed, c, s.topo.world_size);
        });
        restart_index = s.resumed->restart_index + 1;
        // The continuation gets its own file beside the interrupted one (which stays as it was
        // left, plus a continued_in attribute): <stem>.resume<k><ext>.
        if (s.topo.rank == 0 && std::filesystem::exists(path)) {
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
        int n = static_cast<int>(path.size());
        MPI_Bcast(&n, 1, MPI_INT, 0, s.world);
        path.resize(static_cast<std::size_t>(n));
        MPI_Bcast(path.data(), n, MPI_CHAR, 0, s.world);
        root.push_back({"restart_index", static_cast<std::int64_t>(restart_index)});
        root.push_back({"resumed_from_checkpoint", s.resumed->path});
        root.push_back({"resumed_from_iteration", s.resumed->next_iteration});
        root.push_back({"resumed_from_file", s.resumed->run_file});
    }
    if (s.llm && s.llm->adapters_beside_run_file && uses_lora(*s.llm)) {
        // Written at the very end of the run: refuse an existing file now, as the run file is.
        s.llm->save_adapters = path + ".adapters.safetensors";
        dist::agree_on_errors(s.world, [&] {
            std::error_code ec;
            if (s.topo.rank == 0 && !c.get_bool("output.overwrite") &&
                std::filesystem::exists(s.llm->save_adapters, ec))
                throw core::OutputError("LoRA adapters file '" + s.llm->save_adapters +
                                        "' exists (llm.save_adapters=auto); set "
                                        "output.overwrite=true, choose another output.file or "
                                        "llm.save_adapters=PATH, or llm.save_adapters=none");
        });
    }
    // RunFile::create decides collectively (rank 0 checks, all ranks get the same verdict).
    s.file = std::make_unique<io::RunFile>(
        io::RunFile::create(s.world, path, c.get_bool("output.overwrite"), root));
    s.make_checkpointer(restart_index);
    if (s.resumed && s.topo.rank == 0) {
        core::log::info() << "resuming from " << s.resumed->path << " at iteration "
                          << s.resumed->next_iteration << " (restart " << restart_index
                          << "); this segment writes " << path;
        // Link the interrupted run's file to its continuation; a missing or unreadable old file
        // only costs the link.
        try {
            if (std::filesystem::exists(s.resumed->run_file) && s.resumed->run_file != path)
                io::annotate_closed_run_file(s.resumed->run_file, {{"continued_in", path}});
        } catch (const std::exception& e) {
            core::log::warn() << "could not mark " << s.resumed->run_file << " as continued in "
                              << path << ": " << e.what();
        }
    }

    std::vector<io::Attribute> config;
    for (const auto& [k, v] : c.items())
        config.push_back({k, v});
    s.file->set_attributes("/config", config);
    s.file->write_string_dataset("/config/ini", c.to_ini());

    std::vector<io::Attribute> build;
    for (const auto& [k, v] : core::build_info().items())
        build.push_back({k, v});
    build.push_back({"mpi_library", dist::mpi_library_version()});
    s.file->set_attributes("/build", build);

    io::RunFile::RankRow row;
    row.rank = s.topo.rank;
    row.local_rank = s.topo.local_rank;
    row.node = s.topo.node;
    row.hostname = s.topo.hostname;
    row.pid = static_cast<long>(::getpid());
    row.device = s.device.device.str();
    row.device_name = s.device.name;
    row.pci_bus_id = s.device.pci_bus_id;
    row.cpu_affinity = s.device.cpu_affinity;
    s.file->write_ranks(row);
    s.file->flush();

    // Preflight: rank 0 prints where every rank runs (the same as /ranks), so a job's log shows
    // placement and binding mistakes before any training.
    std::ostringstream line;
    line << "  rank " << row.rank << "  local " << row.local_rank << "  node " << row.node
         << "  host " << row.hostname << "  device " << row.device
         << (row.pci_bus_id.empty() ? "" : " (" + row.pci_bus_id + ")") << "  cpus "
         << row.cpu_affinity;
    const std::vector<std::string> lines = allgather_strings(s.world, line.str());
    if (s.topo.rank == 0) {
        std::ostringstream o;
        o << "placement: " << s.topo.world_size << " rank(s) on " << s.topo.num_nodes << " node(s)";
        for (const auto& l : lines)
            o << "\n" << l;
        core::log::info() << o.str();
    }
}

void Session::State::make_checkpointer(int restart_index) {
    checkpointer = std::make_unique<Checkpointer>(
        cfg.get_string("checkpoint.dir"), static_cast<int>(cfg.get_int("checkpoint.keep")), world,
        cfg, file ? file->path() : std::string(), restart_index);
}

bool Session::interrupted() const {
    return s_->interrupted;
}

void Session::close_run_file(const std::string& status, const std::string& error) {
    State& s = *s_;
    if (!s.file) return;
    if (!error.empty()) s.file->set_attributes("/", {{"error", error}});
    s.file->set_status(status);
    s.file->close();
    s.file.reset();
}

std::string Session::plan_text() const {
    const Plan& p = s_->plan;
    std::ostringstream o;
    if (p.workload == "llm") return p.llm_text;
    if (p.workload == "comm") {
        const auto opts = dist::CommBenchmarkOptions::from_config(s_->cfg);
        const auto sizes = opts.sizes();
        o << "trainscope plan (dry run: nothing is measured or written)\n"
          << "  workload      comm: collectives over the " << p.backend << " communicator\n"
          << "  ranks         " << p.world_size << " on " << p.num_nodes << " node(s)\n"
          << "  sizes         " << sizes.size() << " from " << sizes.front() << " B to "
          << sizes.back() << " B\n";
        return o.str();
    }
    o << "trainscope plan (dry run: nothing is trained or written)\n"
      << "  workload      " << p.workload << ", strategy " << p.strategy << ", precision "
      << p.precision << "\n"
      << "  ranks         " << p.world_size << " on " << p.num_nodes << " node(s), "
      << p.threads_per_rank << " CPU thread(s) per rank, communicator " << p.backend << "\n";
    for (int r = 0; r < p.world_size; ++r)
        o << "    rank " << r << "  host " << s_->topo.hostnames.at(r) << "  device "
          << s_->devices.at(r) << "\n";
    o << "  data          " << p.dataset_description << "; network input " << p.channels << "x"
      << p.image_size << "x" << p.image_size << "\n"
      << "  batch         " << p.batch_per_rank
      << (p.strategy == "pipeline" ? " per replica x " : " per rank x ")
      << (p.strategy == "pipeline" ? p.pipeline_replicas : p.world_size) << " = " << p.global_batch
      << " per iteration; " << p.samples_per_rank_per_epoch
      << (p.strategy == "pipeline" ? " samples per replica per epoch\n"
                                   : " samples per rank per epoch\n")
      << "  length        " << p.iterations_per_epoch << " iterations per epoch x " << p.epochs
      << " epoch(s) -> " << p.total_iterations << " iterations\n"
      << "  model         MobileNetV2, " << p.num_classes << " classes, " << p.parameters
      << " parameters, " << std::fixed << std::setprecision(1) << p.macs_per_sample / 1e6
      << " MMAC per sample (forward)\n"
      << "  gradients     buckets of " << p.bucket_mb << " MiB, allreduce of "
      << mib(static_cast<double>(p.parameters) *
             static_cast<double>(c10::elementSize(s_->policy.param_dtype)))
      << " per iteration\n"
      << "  memory/rank   ~" << mib(p.memory_estimate_bytes)
      << " (parameters, gradients, optimizer state, buckets, activations; estimate)\n";
    if (p.strategy == "pipeline")
        o << "  pipeline      " << p.pipeline_stages << " stages x " << p.pipeline_replicas
          << " replica(s); rank = replica x stages + stage\n"
          << p.pipeline_split;
    return o.str();
}

void Session::prepare() {
    State& s = *s_;
    const core::Config& c = s.cfg;
    Plan& p = s.plan;
    if (p.workload == "comm") {
        dist::agree_on_errors(s.world, [&] {
            s.comm = dist::make_communicator(p.backend, s.world, s.device.device);
        });
        p.dataset_description = "none (communication benchmark)";
        return;
    }
    if (p.workload == "llm") {
        s.prepare_llm();
        return;
    }
    dist::agree_on_errors(s.world, [&] { s.data = data::open_dataset(c); });
    p.dataset_description = s.data.description;
    p.train_samples = s.data.size(data::Split::Train);
    p.test_samples = s.data.size(data::Split::Test);
    p.num_classes = s.data.num_classes();

    TrainerOptions& t = s.topt;
    t.strategy = p.strategy;
    t.precision = s.policy;
    t.dtype = s.policy.param_dtype;
    t.channels_last = c.get_bool("cv.channels_last");
    t.preprocess = data::data_options(c).preprocess;
    t.accounting = c.get_bool("profile.accounting");
    t.dp_devices = s.dp_devices;
    t.device = s.device.device;
    t.epochs = p.epochs;
    t.max_iters = c.get_int("train.max_iters");
    t.batch_size = p.batch_per_rank;
    t.eval_batch_size = c.get_int("train.eval_batch_size");
    t.eval = c.get_bool("train.eval");
    t.optimizer = c.get_string("train.optimizer");
    t.lr = c.get_float("train.lr");
    t.momentum = c.get_float("train.momentum");
    t.nesterov = c.get_bool("train.nesterov");
    t.weight_decay = c.get_float("train.weight_decay");
    t.drop_last = c.get_bool("data.drop_last");
    t.pin_memory = c.get_bool("data.pin_memory") && t.device.is_cuda();
    t.seed = static_cast<std::uint64_t>(c.get_int("run.seed"));
    t.workers = static_cast<int>(c.get_int("data.workers"));
    t.prefetch = static_cast<int>(c.get_int("data.prefetch"));
    t.log_every = static_cast<int>(c.get_int("log.every"));
    t.bucket_bytes = p.bucket_mb * 1024.0 * 1024.0;

    dist::agree_on_errors(s.world, [&] {
        const std::int64_t shards = p.strategy == "pipeline" ? p.pipeline_replicas : p.world_size;
        const std::int64_t per_rank =
            p.strategy == "ddp-ds" || p.strategy == "pipeline"
                ? (t.drop_last ? p.train_samples / shards : (p.train_samples + shards - 1) / shards)
                : p.train_samples;
        p.samples_per_rank_per_epoch = per_rank;
        if (per_rank < p.batch_per_rank && t.drop_last)
            throw core::ConfigError("train.batch_size=" + std::to_string(p.batch_per_rank) +
                                    " is larger than the " + std::to_string(per_rank) +
                                    " training samples each rank gets per epoch (" +
                                    std::to_string(p.train_samples) + " samples, strategy " +
                                    p.strategy + ", " + std::to_string(p.world_size) +
                                    " ranks): use a smaller batch or data.drop_last=false");
        s.comm = dist::make_communicator(p.backend, s.world, s.device.device);
    });
    if (p.strategy == "pipeline") // collective: splits the world into pipe and data-parallel groups
        t.pipeline = std::shared_ptr<PipelineGroups>(new PipelineGroups(
            make_pipeline_groups(s.world, p.pipeline_stages, p.backend, s.device.device)));

    torch::manual_seed(c.get_int("run.seed"));
    auto mopt = models::mobilenet_options_from_config(c, p.num_classes, p.channels);
    if (c.get_bool("cv.sync_bn")) {
        // Cross-rank batch statistics through the run's communicator (it outlives the trainer).
        dist::Communicator* comm = s.comm.get();
        mopt.sync_bn_allreduce = [comm](torch::Tensor& t) {
            comm->allreduce(t, dist::ReduceOp::Sum);
        };
    }
    if (p.strategy == "pipeline") {
        dist::agree_on_errors(s.world, [&] {
            const PipelineOptions po = PipelineOptions::from_config(c);
            t.pipeline_plan = plan_pipeline(mopt, p.image_size, po.stages, po.balance, po.cuts);
            t.microbatches = po.microbatches;
        });
        p.pipeline_split = describe(t.pipeline_plan);
        torch::manual_seed(c.get_int("run.seed")); // planning must not shift the initialisation
    }
    models::MobileNetV2 model(mopt);
    p.parameters = models::count_parameters(*model);
    const auto cost = models::mobilenet_v2_cost(mopt, p.image_size);
    p.macs_per_sample = cost.macs;
    const double elem = static_cast<double>(c10::elementSize(t.dtype));
    const double opt_states = t.optimizer == "adamw" ? 2.0 : (t.momentum > 0 ? 1.0 : 0.0);
    p.memory_estimate_bytes =
        static_cast<double>(p.parameters) * elem * (3.0 + opt_states) + // weights, grads, buckets
        static_cast<double>(cost.activation_elements + p.channels * p.image_size * p.image_size) *
            static_cast<double>(p.batch_per_rank) * elem;

    t.schedule.kind = c.get_string("train.schedule");
    t.schedule.base_lr = t.lr;
    t.schedule.warmup_iters = c.get_int("train.warmup_iters");
    t.schedule.gamma = c.get_float("train.gamma");
    t.schedule.min_lr = c.get_float("train.min_lr");

    t.make_replica = [mopt] { return models::MobileNetV2(mopt); };
    data::AdaptedTransform transform{static_cast<int>(p.channels), static_cast<int>(p.image_size),
                                     s.data.train.mean, s.data.train.std};
    s.trainer =
        std::make_unique<ClassificationTrainer>(t, model, s.data, transform, *s.comm, s.world);
    p.iterations_per_epoch = s.trainer->iterations_per_epoch();
    p.total_iterations = s.trainer->total_iterations();
    t.schedule.total_iters = p.total_iterations;
    t.schedule.step_iters =
        c.get_int("train.step_epochs") * std::max<std::int64_t>(1, p.iterations_per_epoch);
    s.trainer->set_schedule(t.schedule);
    if (s.resumed) s.trainer->restore(*s.resumed);

    if (s.file) {
        s.file->set_attributes("/plan",
                               {{"strategy", p.strategy},
                                {"precision", p.precision},
                                {"device", p.device},
                                {"backend", p.backend},
                                {"dataset", p.dataset_description},
                                {"threads_per_rank", static_cast<std::int64_t>(p.threads_per_rank)},
                                {"batch_per_rank", p.batch_per_rank},
                                {"global_batch", p.global_batch},
                                {"train_samples", p.train_samples},
                                {"test_samples", p.test_samples},
                                {"iterations_per_epoch", p.iterations_per_epoch},
                                {"total_iterations", p.total_iterations},
                                {"parameters", p.parameters},
                                {"macs_per_sample", p.macs_per_sample},
                                {"memory_estimate_bytes", p.memory_estimate_bytes}});
        if (p.strategy == "pipeline") {
            std::string cuts;
            for (const auto& st : t.pipeline_plan.stages)
                cuts += (cuts.empty() ? "" : ",") + std::to_string(st.first_unit);
            s.file->set_attributes("/plan",
                                   {{"pipeline_stages", std::int64_t{p.pipeline_stages}},
                                    {"pipeline_replicas", std::int64_t{p.pipeline_replicas}},
                                    {"pipeline_microbatches", std::int64_t{t.microbatches}},
                                    {"pipeline_stage_first_units", cuts}});
        }
    }
}

void Session::run() {
    State& s = *s_;
    if (!s.file) throw core::InternalError("Session::run before open_run_file");
    if (s.plan.workload == "llm") {
        s.run_llm();
        return;
    }
    if (s.plan.workload == "comm") {
        // Communication benchmark over the run's communicator: /comm, nothing else.
        dist::CommBenchmark bench(dist::CommBenchmarkOptions::from_config(s.cfg));
        core::log::info() << "communication benchmark (" << s.comm->backend() << ", "
                          << s.plan.world_size << " ranks), writing " << s.file->path();
        const auto results = bench.run(*s.comm);
        bench.write(*s.file, results, s.comm->backend(), s.comm->size());
        std::ostringstream table;
        table << "op              bytes      time [us]   algbw [GB/s]   busbw [GB/s]\n";
        for (const auto& r : results)
            table << std::left << std::setw(14) << dist::to_string(r.op) << std::right
                  << std::setw(12) << r.bytes << std::setw(14) << std::fixed << std::setprecision(2)
                  << r.time_s * 1e6 << std::setw(15) << std::setprecision(3) << r.algbw_GBps
                  << std::setw(15) << r.busbw_GBps << "\n";
        core::log::info() << "communication benchmark\n" << table.str();
        return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    void* stream = nullptr; // legacy default stream; LibTorch's current stream by default
    prof::PhaseTimer timer(s.topt.device.is_cuda(), stream);
    prof::TelemetrySampler telemetry(prof::telemetry_options(s.cfg),
                                     s.topt.device.is_cuda() ? s.topt.device.index() : -1,
                                     s.device.pci_bus_id);
    telemetry.declare(*s.file);
    prof::ProfilerWindow window(prof::ProfileOptions::from_config(s.cfg), s.topo.rank,
                                s.plan.world_size, s.topt.device.is_cuda(), s.plan.backend);
    Recorder recorder(*s.file, s.world, timer,
                      static_cast<int>(s.cfg.get_int("output.flush_every")),
                      static_cast<int>(s.cfg.get_int("profile.warmup_iters")));
    recorder.set_telemetry(&telemetry);
    dist::declare_bucket_series(*s.file, s.trainer->synchronizer());
    s.trainer->on_iteration_comm(
        [&](const dist::IterationComm& c) { dist::append_bucket_row(*s.file, c); });
    s.comm->set_timeout(s.cfg.get_float("dist.timeout"));
    RunControl control(s.control, s.world, &timer, s.comm.get());
    s.trainer->set_run_control(&control, s.checkpointer.get());

    core::log::info() << "training " << s.plan.total_iterations << " iterations on "
                      << s.plan.world_size << " rank(s), global batch " << s.plan.global_batch
                      << ", writing " << s.file->path();
    telemetry.start();
    s.trainer->run(&recorder, timer, &window);
    s.interrupted = s.trainer->interrupted();
    telemetry.stop();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    window.write(*s.file);
    telemetry.write(*s.file, s.world);
    Recorder::RunInfo info;
    info.wall_seconds = wall;
    info.global_batch = static_cast<double>(s.plan.global_batch);
    info.macs_per_sample = static_cast<double>(s.plan.macs_per_sample);
    info.device_name = s.device.name;
    info.precision = s.plan.precision;
    info.telemetry = &telemetry;
    recorder.finish(info);
}

// ---- run.workload=llm ---------------------------------------------------------------------------

void Session::State::prepare_llm() {
    const core::Config& c = cfg;
    Plan& p = plan;
    const LlmOptions& l = *llm;
    if (!l.defaults_applied.empty()) {
        std::string list;
        for (const auto& d : l.defaults_applied)
            list += (list.empty() ? "" : ", ") + d;
        core::log::info() << "LLM fine-tuning defaults (torchtune) for options left unset: "
                          << list;
    }
    dist::agree_on_errors(world, [&] {
        tokenizer = data::load_tokenizer(l.tokenizer);
        llama = resolve_llama_config(l, tokenizer->vocab_size());
        text = std::make_unique<data::TextDataset>(l.dataset, *tokenizer);
        comm = dist::make_communicator(p.backend, world, device.device);
    });
    p.train_samples = text->size();
    p.dataset_description =
        std::string(data::to_string(l.dataset.format)) + " " + l.dataset.path + " (" +
        std::to_string(text->size()) + " samples" +
        (text->truncated() ? ", " + std::to_string(text->truncated()) + " truncated to " +
                                 std::to_string(l.dataset.max_seq_len)
                           : std::string()) +
        ")";

    // The memory plan: every method for this model, batch and sequence length, per rank.
    LlmMemoryInputs mi;
    mi.config = llama;
    mi.lora = l.lora;
    mi.qat_lora = l.qat_lora;
    mi.param_dtype = policy.param_dtype;
    mi.compute_dtype = policy.autocast_dtype ? *policy.autocast_dtype : policy.param_dtype;
    mi.world_size = p.world_size;
    mi.micro_batch = p.batch_per_rank;
    mi.seq_len = l.dataset.max_seq_len;
    mi.activation_checkpointing = l.activation_checkpointing;
    std::vector<LlmMemoryPlan> plans;
    for (LlmMethod m :
         {LlmMethod::Full, LlmMethod::Lora, LlmMethod::Qlora, LlmMethod::Dpo, LlmMethod::Qat}) {
        mi.method = m;
        for (int z : {0, 1, 2}) {
            if (z > 0 && m != LlmMethod::Full) break;
            mi.zero = z;
            plans.push_back(plan_llm_memory(mi));
        }
    }
    mi.method = l.method;
    mi.zero = l.zero;
    const LlmMemoryPlan mine = plan_llm_memory(mi);
    p.parameters = llama.num_parameters();
    p.memory_estimate_bytes = mine.total_bytes();
    const double device_bytes = device.device.is_cuda()
                                    ? prof::sample_memory(device.device.index()).device_total_bytes
                                    : 80.0 * 1e9;

    std::ostringstream o;
    o << "trainscope plan (dry run: nothing is trained or written)\n"
      << "  workload      llm, method " << to_string(l.method) << ", precision " << p.precision
      << ", dist.zero " << l.zero << "\n"
      << "  ranks         " << p.world_size << " on " << p.num_nodes << " node(s), "
      << p.threads_per_rank << " CPU thread(s) per rank, communicator " << p.backend << "\n";
    for (int r = 0; r < p.world_size; ++r)
        o << "    rank " << r << "  host " << topo.hostnames.at(r) << "  device " << devices.at(r)
          << "\n";
    o << "  model         Llama " << llama.name << ": " << llama.num_hidden_layers
      << " layers, hidden " << llama.hidden_size << ", FFN " << llama.intermediate_size
      << ", heads " << llama.num_attention_heads << "/" << llama.num_key_value_heads
      << " (q/kv), vocab " << llama.vocab_size << ", " << llama.num_parameters() << " parameters, "
      << (l.checkpoint.empty() ? std::string("random init") : "weights from " + l.checkpoint)
      << "\n"
      << "  tokenizer     " << tokenizer->kind() << " " << l.tokenizer << " ("
      << tokenizer->vocab_size() << " ids)\n"
      << "  data          " << p.dataset_description << (l.packed ? ", packed" : "")
      << "; max_seq_len " << l.dataset.max_seq_len << "\n"
      << "  batch         " << p.batch_per_rank << " sequences per rank x "
      << l.gradient_accumulation << " micro-batches x " << p.world_size
      << " ranks = " << p.batch_per_rank * l.gradient_accumulation * p.world_size
      << " per optimizer step\n"
      << "  optimizer     " << l.optimizer << " lr " << l.lr << " weight_decay " << l.weight_decay
      << ", schedule " << l.schedule << "\n";
    if (uses_lora(l)) {
        std::string t;
        for (const auto& x : l.lora.targets)
            t += (t.empty() ? "" : ",") + x;
        o << "  lora          rank " << l.lora.rank << ", alpha " << l.lora.alpha << ", targets "
          << t << ": " << models::lora_parameter_count(llama, l.lora) << " trainable parameters\n";
    }
    o << "  memory/rank   by method (GiB per rank; activations: " << p.batch_per_rank << " x "
      << l.dataset.max_seq_len << " tokens"
      << (l.activation_checkpointing ? ", activation checkpointing" : "") << "; fits: against "
      << std::fixed << std::setprecision(0) << device_bytes / 1e9 << " GB"
      << (device.device.is_cuda() ? " (this device)" : " (an 80 GB H100/A100)") << ")\n"
      << format_memory_plans(plans, device_bytes) << "  this run      ~" << mib(mine.total_bytes())
      << " per rank\n";
    p.llm_text = o.str();
    if (dry_run) return;

    // The model (on every rank the same seed, then rank 0's values broadcast by the trainer).
    torch::manual_seed(c.get_int("run.seed"));
    LlmModel model;
    dist::agree_on_errors(world, [&] { model = build_llm_model(l, llama, policy, device.device); });
    core::log::info() << "model " << llama.name << ": " << model.describe();
    LlmTrainerOptions t;
    t.llm = l;
    t.precision = policy;
    t.device = device.device;
    t.epochs = p.epochs;
    t.max_iters = c.get_int("train.max_iters");
    t.batch_size = p.batch_per_rank;
    t.seed = static_cast<std::uint64_t>(c.get_int("run.seed"));
    t.log_every = static_cast<int>(c.get_int("log.every"));
    t.bucket_bytes = p.bucket_mb * 1024.0 * 1024.0;
    t.accounting = c.get_bool("profile.accounting");
    dist::agree_on_errors(world, [&] {
        llm_trainer =
            std::make_unique<LlmTrainer>(t, std::move(model), *text, *tokenizer, *comm, world);
    });
    p.iterations_per_epoch = llm_trainer->iterations_per_epoch();
    p.total_iterations = llm_trainer->total_iterations();
    LrSchedule sched;
    sched.kind = l.schedule;
    sched.base_lr = l.lr;
    sched.warmup_iters = c.get_int("train.warmup_iters");
    sched.gamma = c.get_float("train.gamma");
    sched.min_lr = c.get_float("train.min_lr");
    sched.total_iters = p.total_iterations;
    sched.step_iters = std::max<std::int64_t>(1, p.iterations_per_epoch);
    llm_trainer->set_schedule(sched);
    if (resumed) llm_trainer->restore(*resumed);
    p.global_batch = p.batch_per_rank * l.gradient_accumulation * p.world_size;

    if (file) {
        const LlmModel& m = llm_trainer->model();
        std::string kinds;
        for (const auto& [k, n] : m.projections)
            kinds += (kinds.empty() ? "" : ",") + k + ":" + std::to_string(n);
        file->set_attributes(
            "/plan", {{"workload", std::string("llm")},
                      {"method", std::string(to_string(l.method))},
                      {"precision", p.precision},
                      {"device", p.device},
                      {"backend", p.backend},
                      {"model", llama.name},
                      {"dataset", p.dataset_description},
                      {"dataset_format", std::string(data::to_string(l.dataset.format))},
                      {"dataset_path", l.dataset.path},
                      {"packed", std::int64_t{l.packed}},
                      {"max_seq_len", l.dataset.max_seq_len},
                      {"tokenizer", l.tokenizer},
                      {"threads_per_rank", static_cast<std::int64_t>(p.threads_per_rank)},
                      {"batch_per_rank", p.batch_per_rank},
                      {"gradient_accumulation", l.gradient_accumulation},
                      {"global_batch", p.global_batch},
                      {"train_samples", p.train_samples},
                      {"iterations_per_epoch", p.iterations_per_epoch},
                      {"total_iterations", p.total_iterations},
                      {"parameters", m.parameters},
                      {"trainable_parameters", m.trainable_parameters},
                      {"projections", kinds},
                      {"zero", std::int64_t{l.zero}},
                      {"activation_checkpointing", std::int64_t{l.activation_checkpointing}},
                      {"flops_per_token", llm_trainer->flops_per_token()},
                      {"memory_estimate_bytes", p.memory_estimate_bytes}});
    }
}

void Session::State::run_llm() {
    const auto t0 = std::chrono::steady_clock::now();
    prof::PhaseTimer timer(device.device.is_cuda(), nullptr);
    prof::TelemetrySampler telemetry(prof::telemetry_options(cfg),
                                     device.device.is_cuda() ? device.device.index() : -1,
                                     device.pci_bus_id);
    telemetry.declare(*file);
    prof::ProfilerWindow window(prof::ProfileOptions::from_config(cfg), topo.rank, plan.world_size,
                                device.device.is_cuda(), plan.backend);
    Recorder recorder(*file, world, timer, static_cast<int>(cfg.get_int("output.flush_every")),
                      static_cast<int>(cfg.get_int("profile.warmup_iters")),
                      LlmTrainer::extra_columns());
    recorder.set_telemetry(&telemetry);
    if (const dist::GradientSynchronizer* sync = llm_trainer->synchronizer()) {
        dist::declare_bucket_series(*file, *sync);
        llm_trainer->on_iteration_comm(
            [&](const dist::IterationComm& c) { dist::append_bucket_row(*file, c); });
    }
    comm->set_timeout(cfg.get_float("dist.timeout"));
    RunControl run_control(control, world, &timer, comm.get());
    llm_trainer->set_run_control(&run_control, checkpointer.get());
    core::log::info() << "fine-tuning (" << to_string(llm->method) << ") " << plan.total_iterations
                      << " iterations on " << plan.world_size << " rank(s), " << plan.global_batch
                      << " sequences per step, writing " << file->path();
    telemetry.start();
    llm_trainer->run(&recorder, timer, &window);
    interrupted = llm_trainer->interrupted();
    telemetry.stop();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    window.write(*file);
    telemetry.write(*file, world);
    const std::string adapters = llm_trainer->save_adapters(llm->save_adapters);
    if (!adapters.empty()) {
        file->set_attributes("/plan", {{"adapters_file", adapters}});
        core::log::info() << "LoRA adapters written to " << adapters;
    }
    Recorder::RunInfo info;
    info.wall_seconds = wall;
    info.global_batch = static_cast<double>(plan.global_batch);
    info.device_name = device.name;
    info.precision = plan.precision;
    info.telemetry = &telemetry;
    info.flops_per_token = llm_trainer->flops_per_token();
    recorder.finish(info);
}

} // namespace trainscope::train
