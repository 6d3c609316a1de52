// Workload (see workload.hpp): the enum parsing, the factory, and the training harness every
// training workload runs around its TrainStep.
#include "trainscope/train/workload.hpp"

#include <chrono>
#include <iomanip>
#include <sstream>

#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/options.hpp"
#include "trainscope/prof/phase_timer.hpp"
#include "trainscope/prof/profiler_window.hpp"
#include "trainscope/prof/telemetry.hpp"
#include "trainscope/prof/telemetry_options.hpp"
#include "trainscope/train/run_file_tables.hpp"
#include "trainscope/train/training_loop.hpp"
#include "workloads_internal.hpp"

namespace trainscope::train {

WorkloadKind parse_workload(const std::string& name) {
    if (name == "cv") return WorkloadKind::Cv;
    if (name == "llm") return WorkloadKind::Llm;
    if (name == "comm") return WorkloadKind::Comm;
    throw core::ConfigError("option run.workload = '" + name +
                            "' is invalid: expected cv, llm or comm");
}

const char* to_string(WorkloadKind k) {
    switch (k) {
    case WorkloadKind::Cv:
        return "cv";
    case WorkloadKind::Llm:
        return "llm";
    case WorkloadKind::Comm:
        return "comm";
    }
    return "?";
}

std::string mib(double bytes) {
    std::ostringstream o;
    o << std::fixed << std::setprecision(1) << bytes / (1024.0 * 1024.0) << " MiB";
    return o.str();
}

Workload::~Workload() = default;

std::string Workload::ranks_text() const {
    std::ostringstream o;
    o << "  ranks         " << env_.topo.world_size << " on " << env_.topo.num_nodes << " node(s), "
      << env_.threads_per_rank << " CPU thread(s) per rank, communicator " << env_.dist.backend
      << "\n";
    // The per-rank lines on rank 0, which prints the plan (placement is gathered there only).
    if (env_.topo.hostnames.size() == static_cast<std::size_t>(env_.topo.world_size) &&
        env_.devices.size() == env_.topo.hostnames.size())
        for (int r = 0; r < env_.topo.world_size; ++r)
            o << "    rank " << r << "  host " << env_.topo.hostnames.at(r) << "  device "
              << env_.devices.at(r) << "\n";
    return o.str();
}

std::string Workload::pinning_text(bool pinned) const {
    if (pinned) return "batches in pinned host memory";
    if (env_.cfg.get_bool("data.pin_memory"))
        return "batches in pageable host memory (data.pin_memory=true dropped: device " +
               env_.device.device.str() + ")";
    return "batches in pageable host memory";
}

std::string Workload::compression_text() const {
    const dist::CompressionOptions& o = env_.dist.compression;
    switch (o.kind) {
    case dist::CompressionKind::None:
        return "uncompressed";
    case dist::CompressionKind::Fp16:
    case dist::CompressionKind::Bf16:
        return std::string("compressed to ") + dist::to_string(o.kind) + " (divided by " +
               std::to_string(env_.topo.world_size) + " ranks before the sum)";
    case dist::CompressionKind::PowerSgd:
        break;
    }
    return "PowerSGD rank " + std::to_string(o.powersgd_rank) + " from iteration " +
           std::to_string(o.start_iter) + (o.warm_start ? ", warm start" : "") +
           ", error feedback (DDP allreduces)";
}

std::vector<io::Attribute> Workload::compression_attributes() const {
    const dist::CompressionOptions& o = env_.dist.compression;
    std::vector<io::Attribute> a = {{"compress", std::string(dist::to_string(o.kind))}};
    if (o.kind == dist::CompressionKind::PowerSgd) {
        a.push_back({"powersgd_rank", o.powersgd_rank});
        a.push_back({"powersgd_start_iter", o.start_iter});
    }
    return a;
}

std::string Workload::precision() const {
    return env_.cfg.get_string("run.precision");
}

std::unique_ptr<Workload> make_workload(const RunEnvironment& env) {
    const WorkloadKind kind = parse_workload(env.cfg.get_string("run.workload"));
    // The sharding options exist for LLM fine-tuning (and dist.zero=1/2 for CV, which the CV
    // workload checks): changed elsewhere they would be ignored, so they are refused.
    if (kind != WorkloadKind::Llm) {
        const auto& c = env.cfg;
        dist::ShardingOptions sharding = dist::read_sharding(c);
        if (kind == WorkloadKind::Cv) sharding.zero = dist::ZeroStage::None;
        if (const char* changed = sharding.changed_key())
            throw core::ConfigError(std::string(changed) + " (set at " + c.origin(changed) +
                                    ") shards LLM fine-tuning (ZeRO / FSDP) and has no effect on "
                                    "run.workload=" +
                                    c.get_string("run.workload") +
                                    ": remove it, or use run.workload=llm");
    }

    switch (kind) {
    case WorkloadKind::Cv:
        return make_cv_workload(env);
    case WorkloadKind::Llm:
        return make_llm_workload(env);
    case WorkloadKind::Comm:
        return make_comm_workload(env);
    }
    throw core::InternalError("make_workload: unknown workload");
}

void check_compression(const RunEnvironment& env, WorkloadKind kind) {
    const dist::CompressionOptions& o = env.dist.compression;
    if (!o.active()) return;
    const std::string set = "dist.compress=" + std::string(dist::to_string(o.kind)) + " (set at " +
                            env.cfg.origin("dist.compress") + ")";
    if (kind == WorkloadKind::Comm)
        throw core::ConfigError(set + " compresses training gradients and has no effect on "
                                      "run.workload=comm (the benchmark measures comm.dtype): "
                                      "remove it");
    if (kind == WorkloadKind::Cv && env.layout.strategy == Strategy::Dp)
        throw core::ConfigError(set + " compresses gradients between ranks, but run.strategy=dp "
                                      "is one process whose replicas never send them: remove "
                                      "dist.compress, or use run.strategy=ddp or ddp-ds");
    // An overflowing fp16 step (the loss scaler skips it) would leave inf/NaN in PowerSGD's
    // error feedback and warm-start Q, and every later step would be skipped too.
    if (o.kind == dist::CompressionKind::PowerSgd && env.policy.loss_scaling)
        throw core::ConfigError(set + " with run.precision=" + env.precision +
                                ": the loss scaler's overflowing steps would leave inf/NaN in "
                                "PowerSGD's error feedback and Q for good; use run.precision="
                                "bf16-mixed or fp32 with powersgd, or dist.compress=fp16/bf16");
}

void Workload::run(io::RunFile& file, Checkpointer* checkpointer) {
    TrainStep* step = train_step();
    if (!step) throw core::InternalError("Workload::run: no training step");
    dist::Communicator& comm = *communicator();
    const auto t0 = std::chrono::steady_clock::now();
    const bool cuda = env_.device.device.is_cuda();
    const int cuda_index = cuda ? env_.device.device.index() : -1;
    prof::PhaseTimer timer(cuda, /*cuda_stream=*/nullptr); // LibTorch's current stream
    prof::TelemetrySampler telemetry(prof::telemetry_options(env_.cfg), cuda_index,
                                     env_.device.pci_bus_id);
    const std::int64_t to_run =
        env_.train.length.total_iterations(step->iterations_per_epoch()) - step->start_iteration();
    // Chunk sizes follow the run's length: about one telemetry sample per iteration.
    declare_telemetry(file, telemetry, to_run);
    prof::ProfilerWindow window(prof::ProfileOptions::from_config(env_.cfg), env_.topo.rank,
                                env_.topo.world_size, cuda, env_.dist.backend);
    const std::int64_t warmup = env_.cfg.get_int("profile.warmup_iters");
    if (warmup >= to_run && env_.topo.rank == 0)
        core::log::warn() << "profile.warmup_iters=" << warmup << " but this run trains " << to_run
                          << " iteration(s): every iteration is warm-up, so /summary "
                          << "will have 0 measured iterations (its timings, throughput and MFU "
                             "NaN); set profile.warmup_iters below "
                          << to_run << " or train more iterations (train.max_iters, train.epochs)";
    Recorder recorder(file, env_.world, timer,
                      static_cast<int>(env_.cfg.get_int("output.flush_every")),
                      static_cast<int>(warmup), extra_columns(), to_run);
    recorder.set_telemetry(&telemetry);
    recorder.declare_buckets(bucket_bytes());
    RunControl control(RunControlOptions::from_config(env_.cfg), env_.world, &timer, &comm,
                       side_communicators());

    LoopOptions lo;
    lo.log_every = static_cast<int>(env_.cfg.get_int("log.every"));
    lo.ranks_per_replica = ranks_per_replica();
    lo.accounting = env_.train.accounting;
    lo.cuda_index = cuda_index;
    lo.length = env_.train.length;
    lo.schedule = env_.train.schedule;
    lo.base_lr = env_.train.optimizer.lr;
    TrainingLoop loop(lo, *step, comm, timer, &recorder, &window, &control, checkpointer);
    core::log::info() << start_message(file.path());
    telemetry.start();
    loop.run();
    interrupted_ = loop.interrupted();
    telemetry.stop();
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Collective writes of the run file's tables wait for every rank inside MPI-IO.
    RunControl::PeerWait wait(&control, "writing the run file's profile, telemetry and summary "
                                        "(collective HDF5 writes of every rank)");
    write_profile(file, window);
    write_telemetry(file, telemetry, env_.world);
    after_training(file);
    Recorder::RunInfo info;
    info.wall_seconds = wall;
    info.device_name = env_.device.name;
    info.precision = env_.precision;
    info.telemetry = &telemetry;
    describe_run(info);
    recorder.finish(info);
}

} // namespace trainscope::train
