// Options owned by the dist module (run.device, dist.backend, dist.allreduce, dist.bucket_mb,
// dist.first_bucket_mb, the sharding options dist.zero, dist.reshard_after_forward and
// dist.prefetch; gradient compression dist.compress and dist.powersgd_*; comm.* of the
// communication benchmark, read by
// CommBenchmarkOptions::from_config) and their resolution into concrete choices: "auto" becomes
// cpu/cuda and mpi/nccl, impossible combinations are ConfigErrors naming both keys.
#pragma once

#include <cstdint>

#include <cstddef>
#include <map>
#include <string>

#include "trainscope/core/config.hpp"

#include "trainscope/distributed/hierarchical_allreduce.hpp"
#include "trainscope/distributed/topology.hpp"

namespace trainscope::dist {

void declare_options(core::OptionRegistry& registry);

// dist.zero: how much of the training state data parallelism shards (ZeRO's stages; stage 3 is
// FSDP). The enum's values are the option's numbers.
enum class ZeroStage { None = 0, OptimizerState = 1, Gradients = 2, Parameters = 3 };
inline int to_int(ZeroStage z) {
    return static_cast<int>(z);
}

// Over how many ranks each part of the model state is divided under `zero` with `data_parallel`
// ranks (1: every rank holds all of it): ZeRO-1 shards the optimizer state, ZeRO-2 also the
// gradients, ZeRO-3 (FSDP) also the weights. /plan records these so that readers (the advisor)
// scale the memory plan to other rank counts without re-deriving the rules.
struct StateShards {
    std::int64_t weight = 1, gradient = 1, optimizer_state = 1;
};
inline StateShards state_shards(ZeroStage z, int data_parallel) {
    const std::int64_t n = data_parallel > 1 ? data_parallel : 1;
    return {z >= ZeroStage::Parameters ? n : 1, z >= ZeroStage::Gradients ? n : 1,
            z >= ZeroStage::OptimizerState ? n : 1};
}

// The sharding options, read once (read_sharding).
struct ShardingOptions {
    ZeroStage zero = ZeroStage::None;
    // dist.zero=3: free a unit's gathered weights after its forward (FSDP's
    // reshard_after_forward); gather the next unit's while the current one computes.
    bool reshard_after_forward = true, prefetch = true;
    // The first sharding key whose value differs from its default, or nullptr.
    const char* changed_key() const;
};
ShardingOptions read_sharding(const core::Config& config);

// dist.compress: how data-parallel gradients travel (PyTorch's DDP communication hooks).
//   None      as they are (the bucket dtype; bit-identical to a build without compression)
//   Fp16/Bf16 fp16_compress_hook / bf16_compress_hook: each bucket cast to 16 bits, divided by
//             the world size, allreduced (sum) and cast back; for ZeRO/FSDP the dtype of the
//             gradient reduce-scatters (FSDP2's reduce_dtype), with the same pre-division
//   PowerSgd  powerSGD_hook (Vogels et al. 2019): low-rank P Q^T per gradient matrix with error
//             feedback; DDP only
enum class CompressionKind { None, Fp16, Bf16, PowerSgd };
const char* to_string(CompressionKind k);

struct CompressionOptions {
    CompressionKind kind = CompressionKind::None;
    std::int64_t powersgd_rank = 2;    // dist.powersgd_rank: matrix_approximation_rank
    bool warm_start = true;            // dist.powersgd_warm_start
    std::int64_t start_iter = 2;       // dist.powersgd_start_iter: plain allreduces first
    double min_compression_rate = 2.0; // dist.powersgd_min_compression_rate
    bool active() const { return kind != CompressionKind::None; }
};
// Reads dist.compress and dist.powersgd_*. ConfigError (naming the option, its value and the
// fix) for powersgd under dist.zero >= 1 and for a changed dist.powersgd_* option without
// dist.compress=powersgd (it would be ignored).
CompressionOptions read_compression(const core::Config& config, ZeroStage zero);

struct DistOptions {
    std::string device;  // "cpu" | "cuda"
    std::string backend; // "mpi" | "nccl"
    // dist.allreduce (the MPI backend's; never Hierarchical with nccl). Auto is decided by each
    // communicator for its own ranks (make_communicator), since a sub-group may span other nodes.
    AllreduceAlgorithm allreduce = AllreduceAlgorithm::Auto;
    double bucket_mb = 25;            // MiB, as DDP's bucket_cap_mb
    std::size_t bucket_cap_bytes = 0; // bucket_mb * 2^20, at least 1
    // The first bucket reduced (GradientSynchronizer's first_bucket_cap_bytes; it applies
    // min(first, bucket cap)), as DDP's dist._DEFAULT_FIRST_BUCKET_BYTES.
    double first_bucket_mb = 1;
    std::size_t first_bucket_cap_bytes = 0; // first_bucket_mb * 2^20, at least 1
    // dist.timeout: seconds any wait for the peers may take (communicators, checkpoint
    // agreement, collective run-file writes; see docs/faults.md).
    double timeout_s = 600;
    // dist.compress and dist.powersgd_* (read_compression).
    CompressionOptions compression;
    // run.device=auto resolved to cpu: why (logged by the session); empty otherwise.
    std::string auto_reason;
};

// Resolves the "auto" values. `visible_cuda_devices` is what this process sees and
// `cuda_unavailable_reason` why it sees none (pass dist::cuda_device_count() and
// dist::cuda_unavailable_reason(); tests pass anything); `env` the launch environment
// (launch_environment()). Throws ConfigError when run.device=auto would fall back to the CPU on a
// node whose scheduler granted GPUs (granted_gpus), naming the variable and the reason; for
// dist.backend=nccl with a CPU device, for NCCL in a build without NCCL, for
// dist.allreduce=hierarchical with NCCL (kNcclHierarchical), for dist.bucket_mb or
// dist.first_bucket_mb <= 0, and for the compression options read_compression refuses.
DistOptions resolve_options(const core::Config& config, int visible_cuda_devices,
                            const std::string& cuda_unavailable_reason = "no GPU is visible",
                            const std::map<std::string, std::string>& env = {});
// "VAR=value" of the first variable saying this job was given GPUs (Slurm's SLURM_GPUS*,
// SLURM_JOB_GPUS, SLURM_STEP_GPUS, or a CUDA_VISIBLE_DEVICES naming a device), "" if none.
std::string granted_gpus(const std::map<std::string, std::string>& env);

// Launch mistakes a batch job makes before any training, as a message (empty = none):
// - an srun step of N > 1 tasks (SLURM_STEP_NUM_TASKS) whose MPI world has 1 rank: the MPI
//   library did not get the step's PMI, so every task started a 1-rank job of its own.
// Ranks per GPU are bind_device's to judge (by PCI bus id), not the GPU count Slurm reports.
// `env` holds the environment variables (dist::launch_environment() for the real ones).
std::string launch_problem(const Topology& topo, const std::map<std::string, std::string>& env);
std::map<std::string, std::string> launch_environment();

} // namespace trainscope::dist
