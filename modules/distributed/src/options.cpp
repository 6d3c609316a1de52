// Declaration and resolution of the dist module's options. No LibTorch: the caller passes how many
// GPUs are visible, so the rules ("auto" choices, impossible combinations) are testable anywhere.
#include "trainscope/distributed/options.hpp"

#include <cstdlib>

#include <cmath>
#include <sstream>

#include "trainscope/core/build_config.hpp"
#include "trainscope/core/error.hpp"

namespace trainscope::dist {

void declare_options(core::OptionRegistry& registry) {
    registry.add_choice("run.device", "auto", {"auto", "cpu", "cuda"},
                        "compute device; auto = cuda when built with CUDA and a GPU is visible, "
                        "else cpu, but refused when the scheduler granted GPUs (SLURM_GPUS*, "
                        "CUDA_VISIBLE_DEVICES) that CUDA cannot use; each rank uses GPU "
                        "local_rank % the GPUs it sees, and NCCL refuses two ranks of a node on "
                        "one PCI bus id");
    registry.add_choice("dist.backend", "auto", {"auto", "mpi", "nccl"},
                        "gradient communication; auto = nccl for cuda devices, mpi for cpu");
    // The MiB options stop at 1 TiB: beyond any model, and their byte counts stay exact integers.
    registry.add_float("dist.bucket_mb", 25.0,
                       "gradient bucket cap in MiB (as DDP's bucket_cap_mb); must be > 0", 0.0,
                       1048576.0);
    registry.add_float("dist.first_bucket_mb", 1.0,
                       "cap in MiB of the first gradient bucket reduced (the last parameters; as "
                       "DDP's 1 MiB first bucket), at most dist.bucket_mb; must be > 0",
                       0.0, 1048576.0);
    registry.add_choice(
        "dist.allreduce", "flat", {"auto", "flat", "hierarchical"},
        "how the MPI backend runs every allreduce (gradient buckets, the comm benchmark, "
        "synchronised batch norm, the ranks' agreement): flat = one MPI_Allreduce over all ranks; "
        "hierarchical = reduce inside each node (MPI_Comm_split_type shared), allreduce among one "
        "leader per node, broadcast inside the node; auto = hierarchical when the ranks span "
        "several nodes and some node has several of them, else flat. NCCL is node-aware already: "
        "hierarchical with dist.backend=nccl is an error");
    // Sharding (ZeRO / FSDP) of LLM fine-tuning, read by read_sharding.
    registry.add_choice(
        "dist.zero", "0", {"0", "1", "2", "3"},
        "ZeRO sharding over the data-parallel ranks: 1 = optimizer state sharded "
        "(full-weight training: reduce-scatter gradients, step the shard, all-gather "
        "parameters); 2 = gradients sharded too; 3 = parameters sharded too (FSDP as "
        "torchtune's distributed recipes run it, every llm.method: one flat shard per "
        "decoder layer, the embedding and the head, all-gathered before a unit's forward "
        "and backward, gradients reduce-scattered per unit; LLM only). run.workload=cv: 1 "
        "or 2 under run.strategy=ddp or ddp-ds with train.optimizer=adamw");
    registry.add_bool(
        "dist.reshard_after_forward", true,
        "dist.zero=3: free a unit's gathered parameters after its forward and all-gather "
        "them again for its backward (FSDP's reshard_after_forward); false keeps them from "
        "forward to backward (less communication, more memory)");
    registry.add_bool(
        "dist.prefetch", true,
        "dist.zero=3: issue the next unit's all-gather before the current unit computes "
        "(forward and backward), so communication overlaps compute; false gathers each "
        "unit when it is needed");
    // Gradient compression of the data-parallel collectives, read by read_compression.
    registry.add_choice(
        "dist.compress", "none", {"none", "fp16", "bf16", "powersgd"},
        "gradient compression (PyTorch's DDP communication hooks): fp16/bf16 cast each bucket "
        "to 16 bits, divide by the world size and allreduce the sum (also the reduce dtype of "
        "dist.zero=1-3 reduce-scatters); powersgd = rank-r PowerSGD with error feedback "
        "(Vogels et al. 2019; DDP only, dist.zero=0); none sends the gradients as they are");
    registry.add_int("dist.powersgd_rank", 2,
                     "dist.compress=powersgd: rank of the low-rank approximation of each "
                     "gradient matrix (PowerSGD's matrix_approximation_rank; a matrix n x m uses "
                     "min(n, m, rank))",
                     1, 1 << 20);
    registry.add_bool("dist.powersgd_warm_start", true,
                      "dist.compress=powersgd: reuse each matrix's Q of the previous iteration "
                      "(warm start) instead of a new random one every iteration");
    registry.add_int("dist.powersgd_start_iter", 2,
                     "dist.compress=powersgd: iterations of plain (uncompressed) allreduce before "
                     "PowerSGD starts (PyTorch's start_powerSGD_iter), counted from the run's "
                     "first iteration (a run resumed from a PowerSGD checkpoint continues the "
                     "count)",
                     0);
    registry.add_float("dist.powersgd_min_compression_rate", 2.0,
                       "dist.compress=powersgd: a gradient matrix n x m is compressed only when "
                       "n*m > rate * (n+m)*rank (PyTorch's min_compression_rate); others, and "
                       "every 1-D tensor, are allreduced uncompressed",
                       0.0, 1e9);
    // run.workload=comm: the communication benchmark (distributed/comm_benchmark.hpp).
    registry.add_float("dist.timeout", 600,
                       "seconds a rank may wait for its peers (MPI and NCCL collectives and "
                       "set-up, host syncs, checkpoint agreement, collective run-file writes) "
                       "before the job is aborted naming the wait; a stopped or hung peer costs "
                       "this long, so keep it above the slowest step, evaluation or checkpoint",
                       1.0, 1e7);
    registry.add_int("comm.min_bytes", 8, "comm benchmark: smallest message in bytes", 1);
    registry.add_int("comm.max_bytes", 268435456,
                     "comm benchmark: largest message in bytes (inclusive; >= comm.min_bytes)", 1);
    registry.add_float("comm.factor", 2.0,
                       "comm benchmark: size step, next = round(size * factor); must be > 1", 1.0,
                       1024.0);
    registry.add_int("comm.warmup", 5, "comm benchmark: untimed iterations per size", 0);
    registry.add_int("comm.iters", 20, "comm benchmark: timed iterations per size", 1);
    registry.add_string("comm.ops", "allreduce,allgather,reduce_scatter,broadcast",
                        "comm benchmark: comma-separated collectives to measure");
    registry.add_choice("comm.dtype", "float32", {"float32", "float64", "bfloat16", "float16"},
                        "comm benchmark: element type (the MPI backend reduces float32/float64)");
}

const char* ShardingOptions::changed_key() const {
    const ShardingOptions defaults;
    if (zero != defaults.zero) return "dist.zero";
    if (reshard_after_forward != defaults.reshard_after_forward)
        return "dist.reshard_after_forward";
    if (prefetch != defaults.prefetch) return "dist.prefetch";
    return nullptr;
}

ShardingOptions read_sharding(const core::Config& config) {
    ShardingOptions o;
    o.zero = static_cast<ZeroStage>(std::stoi(config.get_string("dist.zero"))); // a checked choice
    o.reshard_after_forward = config.get_bool("dist.reshard_after_forward");
    o.prefetch = config.get_bool("dist.prefetch");
    return o;
}

const char* to_string(CompressionKind k) {
    switch (k) {
    case CompressionKind::None:
        return "none";
    case CompressionKind::Fp16:
        return "fp16";
    case CompressionKind::Bf16:
        return "bf16";
    case CompressionKind::PowerSgd:
        return "powersgd";
    }
    return "?";
}

CompressionOptions read_compression(const core::Config& config, ZeroStage zero) {
    CompressionOptions o;
    const std::string& mode = config.get_string("dist.compress"); // a checked choice
    if (mode == "fp16") o.kind = CompressionKind::Fp16;
    if (mode == "bf16") o.kind = CompressionKind::Bf16;
    if (mode == "powersgd") o.kind = CompressionKind::PowerSgd;
    o.powersgd_rank = config.get_int("dist.powersgd_rank");
    o.warm_start = config.get_bool("dist.powersgd_warm_start");
    o.start_iter = config.get_int("dist.powersgd_start_iter");
    o.min_compression_rate = config.get_float("dist.powersgd_min_compression_rate");
    if (o.kind != CompressionKind::PowerSgd) {
        // PowerSGD's own options would be ignored: refused, as the sharding options are
        // outside LLM fine-tuning.
        std::ostringstream rate;
        rate << o.min_compression_rate;
        const std::pair<const char*, std::string> keys[] = {
            {"dist.powersgd_rank", std::to_string(o.powersgd_rank)},
            {"dist.powersgd_warm_start", o.warm_start ? "true" : "false"},
            {"dist.powersgd_start_iter", std::to_string(o.start_iter)},
            {"dist.powersgd_min_compression_rate", rate.str()}};
        for (const auto& [key, value] : keys)
            if (!config.is_default(key))
                throw core::ConfigError(std::string(key) + " = '" + value + "' (set at " +
                                        config.origin(key) +
                                        ") applies to dist.compress=powersgd "
                                        "only, but dist.compress=" +
                                        mode + ": remove it, or set dist.compress=powersgd");
        return o;
    }
    if (zero != ZeroStage::None)
        throw core::ConfigError(
            "dist.compress=powersgd but dist.zero=" + std::to_string(to_int(zero)) +
            ": PowerSGD compresses DDP's gradient allreduces and has no form for ZeRO/FSDP "
            "reduce-scatters (each rank reduces a different shard); use dist.zero=0 with "
            "powersgd, or dist.compress=fp16/bf16 (the reduce dtype of the reduce-scatters)");
    return o;
}

std::string granted_gpus(const std::map<std::string, std::string>& env) {
    // Slurm's GPU variables (set when the job or step was given GPUs) and CUDA_VISIBLE_DEVICES
    // naming at least one device (container runtimes and schedulers set it; "" or "-1" or
    // "NoDevFiles" hide every GPU on purpose).
    for (const char* key : {"SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS",
                            "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK"}) {
        auto it = env.find(key);
        if (it != env.end() && !it->second.empty() && it->second != "0")
            return std::string(key) + "=" + it->second;
    }
    auto it = env.find("CUDA_VISIBLE_DEVICES");
    if (it != env.end() && !it->second.empty() && it->second != "-1" && it->second != "NoDevFiles")
        return "CUDA_VISIBLE_DEVICES=" + it->second;
    return {};
}

DistOptions resolve_options(const core::Config& config, int visible_cuda_devices,
                            const std::string& cuda_unavailable_reason,
                            const std::map<std::string, std::string>& env) {
    DistOptions o;
    const std::string& device = config.get_string("run.device");
    const std::string& backend = config.get_string("dist.backend");
    if (device == "auto") {
        o.device = (TRAINSCOPE_HAVE_CUDA && visible_cuda_devices > 0) ? "cuda" : "cpu";
        if (o.device == "cpu") {
            const std::string granted = granted_gpus(env);
            if (!granted.empty())
                throw core::ConfigError(
                    "run.device=auto would fall back to the CPU although " + granted +
                    " says this job was given GPUs: CUDA is unavailable here (" +
                    cuda_unavailable_reason +
                    "). Fix the driver, container or device "
                    "visibility, or set run.device=cpu to train on the CPU on purpose");
            o.auto_reason = "run.device=auto chose cpu: " + cuda_unavailable_reason;
        }
    } else {
        o.device = device;
    }
    if (backend == "auto")
        o.backend = o.device == "cuda" ? "nccl" : "mpi";
    else
        o.backend = backend;

    if (o.backend == "nccl" && !TRAINSCOPE_HAVE_NCCL)
        throw core::ConfigError("dist.backend=nccl but this trainscope was built without NCCL: use "
                                "dist.backend=mpi, or rebuild with CUDA and NCCL available "
                                "(TRAINSCOPE_USE_NCCL=ON)");
    if (o.backend == "nccl" && o.device != "cuda") {
        std::string why = device == "auto"
                              ? "run.device=auto resolved to cpu (" +
                                    std::string(TRAINSCOPE_HAVE_CUDA ? "no GPU is visible"
                                                                     : "built without CUDA") +
                                    ")"
                              : "run.device=" + device;
        throw core::ConfigError("dist.backend=nccl needs GPU tensors but " + why +
                                ": NCCL cannot communicate host memory; use dist.backend=mpi (or "
                                "auto) for CPU runs, or run.device=cuda");
    }

    // MiB -> bytes, rounded, at least 1; the message names the option, its value and the rule.
    auto cap_bytes = [&](const char* key, const char* what, double& mb) {
        mb = config.get_float(key);
        if (!(mb > 0)) {
            std::ostringstream v;
            v << mb;
            throw core::ConfigError("option " + std::string(key) + " = '" + v.str() +
                                    "' is invalid: expected a number > 0 (" + what + ")");
        }
        const double bytes = std::round(mb * 1024.0 * 1024.0);
        return bytes < 1 ? std::size_t{1} : static_cast<std::size_t>(bytes);
    };
    o.allreduce = parse_allreduce_algorithm(config.get_string("dist.allreduce"));
    if (o.allreduce == AllreduceAlgorithm::Hierarchical && o.backend == "nccl")
        throw core::ConfigError(std::string(kNcclHierarchical) +
                                (backend == "auto" ? " (dist.backend=auto chose nccl for the "
                                                     "cuda device)"
                                                   : ""));
    o.timeout_s = config.get_float("dist.timeout");
    o.bucket_cap_bytes = cap_bytes("dist.bucket_mb", "MiB per gradient bucket", o.bucket_mb);
    o.first_bucket_cap_bytes =
        cap_bytes("dist.first_bucket_mb", "MiB of the first gradient bucket", o.first_bucket_mb);
    o.compression = read_compression(config, read_sharding(config).zero);
    return o;
}

std::string launch_problem(const Topology& topo, const std::map<std::string, std::string>& env) {
    auto number = [&](const char* key) -> long {
        auto it = env.find(key);
        if (it == env.end()) return -1;
        try {
            return std::stol(it->second);
        } catch (const std::exception&) {
            return -1;
        }
    };
    const long step_tasks = number("SLURM_STEP_NUM_TASKS");
    if (step_tasks > 1 && topo.world_size == 1)
        return "this Slurm step has " + std::to_string(step_tasks) +
               " tasks (SLURM_STEP_NUM_TASKS) but MPI sees 1 rank: the MPI library was not "
               "given the step's PMI, so each task started a job of its own. Launch with srun "
               "--mpi=pmix (srun --mpi=list shows what Slurm offers; Open MPI needs PMIx "
               "support), or with mpirun inside the allocation";
    // GPUs per node are not compared with ranks per node here: SLURM_GPUS_ON_NODE counts the
    // step's GPUs on the node or, with per-task binding, the task's own, and a single-process
    // run.strategy=dp drives several. bind_device decides from the PCI bus ids the ranks chose.
    return {};
}

std::map<std::string, std::string> launch_environment() {
    std::map<std::string, std::string> env;
    for (const char* key : {"SLURM_STEP_NUM_TASKS", "SLURM_GPUS_ON_NODE", "SLURM_NTASKS",
                            "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS",
                            "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK", "CUDA_VISIBLE_DEVICES"})
        if (const char* v = std::getenv(key)) env[key] = v;
    return env;
}

} // namespace trainscope::dist
