// Checkpoints for restart (checkpoint.dir, checkpoint.every, --resume). One directory per
// checkpoint, written so that a crash at any moment leaves either the previous complete checkpoint
// or the new one, never a half-written one that --resume would pick:
//   <dir>/.partial-ckpt-<iteration>/rank<R>.pt   every rank writes and fsyncs its archive
//   <dir>/.partial-ckpt-<iteration>/MANIFEST.json rank 0, after a barrier, then fsync
//   rename .partial-ckpt-<iteration> -> ckpt-<iteration> (atomic), fsync <dir>, then the oldest
//   complete checkpoints beyond checkpoint.keep are deleted.
// A checkpoint is complete iff its directory is named ckpt-* and holds MANIFEST.json.
// One job at a time: rank 0 holds an exclusive flock on <dir>/.lock for the job's lifetime (the
// kernel drops it when the process ends, however it ends), so a second job given the same
// directory is refused at start instead of deleting the first one's checkpoints.
// State that every rank holds identically (data-parallel model and optimizer) is written once, by
// the rank the trainer names as its source; per-rank state (RNG, ZeRO shards) by every rank.
#pragma once

#include <mpi.h>
#include <torch/nn/module.h>
#include <torch/serialize.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainscope/core/config.hpp"
#include "trainscope/distributed/parallelism.hpp"
#include "trainscope/train/parallel_layout.hpp"

namespace trainscope::train {

// What MANIFEST.json records (and --resume checks).
struct CheckpointManifest {
    std::string path;                // the checkpoint directory
    std::int64_t next_iteration = 0; // the first iteration the resumed run trains
    int world_size = 0;
    int restart_index = 0; // 0 for the original run, k for its k-th resumed segment
    std::string run_file;  // the run file of the segment that wrote the checkpoint
    std::string created_utc;
    std::string workload;
    std::int64_t global_batch = 0; // samples per optimizer step (0: not recorded, older format)
    std::vector<std::pair<std::string, std::string>> config; // resolved options
};

// Options that may change between the interrupted run and its resumption: they do not change
// what is trained (output, logging, profiling, checkpointing, timeouts, loader threads).
bool may_differ_on_resume(const std::string& key);
// True when `file` is `output` or one of its continuations (<stem>.resume<k><ext> in the same
// directory): the only run files a resume may name or annotate.
bool in_output_series(const std::string& file, const std::string& output);

// Options that spell the batch per rank or per step: on a resume they are compared through the
// global batch they give (an elastic resume on another rank count changes the per-rank batch).
bool is_batch_option(const std::string& key);

class Checkpointer {
  public:
    // dir: checkpoint.dir (empty: disabled). Collective over world: creates the directory, checks
    // that it is writable and takes its lock (OutputError on every rank otherwise, e.g. when
    // another job holds it). The collectives of save() wait for the peers at most dist.timeout.
    // global_batch: the run's samples per optimizer step, recorded in every manifest so that a
    // resume on another rank count can keep it.
    Checkpointer(std::string dir, int keep, MPI_Comm world, const core::Config& config,
                 std::string run_file, int restart_index, std::int64_t global_batch);
    ~Checkpointer(); // releases the lock
    Checkpointer(const Checkpointer&) = delete;
    Checkpointer& operator=(const Checkpointer&) = delete;
    bool enabled() const { return !dir_.empty(); }
    const std::string& dir() const { return dir_; }

    // Collective. Writes the checkpoint that resumes at `next_iteration`; `fill` writes this
    // rank's archive. Errors (full disk, read-only directory) are OutputErrors raised on every
    // rank. Returns the complete checkpoint's directory.
    std::string save(std::int64_t next_iteration,
                     const std::function<void(torch::serialize::OutputArchive&)>& fill);

    // Collective: the newest complete checkpoint in dir (rank 0 looks, everyone gets its
    // manifest). Throws InputError when there is none, naming the directory. timeout_s bounds
    // the wait for the peers (dist.timeout; 0: no limit).
    static CheckpointManifest find_latest(const std::string& dir, MPI_Comm world,
                                          double timeout_s = 0);
    // Collective: a ConfigError naming every option that differs unless the configuration
    // resumes what the checkpoint saved. The batch options are compared through the global batch,
    // which must be the checkpoint's. Another rank count (an elastic resume) is allowed where the
    // training trajectory does not depend on it (ParallelLayout::elastic_refusal):
    // run.strategy=ddp-ds with or without dist.zero (the optimizer and FSDP shards are resharded
    // on load); pipeline and ddp/dp runs, and checkpoints that did not record their global
    // batch, are refused naming why. `layout`: this job's (world size, global batch, strategy).
    static void check_compatible(const CheckpointManifest& m, const core::Config& config,
                                 const ParallelLayout& layout);
    // Local: rank `rank`'s archive of checkpoint m, every tensor mapped onto `device` (the
    // loading rank's own device). Without the mapping a tensor comes back on the device it was
    // saved from: every rank of a multi-GPU job would allocate on cuda:0 (rank 0's optimizer
    // state), and the optimizer would step tensors of another GPU.
    // bytes: the file's contents when another rank of the node read it (CheckpointShards), else
    // null and this rank reads the file itself; the errors are the same either way.
    static void load(const CheckpointManifest& m, int rank, torch::serialize::InputArchive& in,
                     torch::Device device, const std::string* bytes = nullptr);

  private:
    // agree_on_errors over world_ with dist.timeout as the limit of the wait for the peers.
    void agree(const std::function<void()>& fn) const;

    std::string dir_;
    int keep_;
    MPI_Comm world_;
    int rank_ = 0, size_ = 1;
    const core::Config& config_;
    std::string run_file_;
    int restart_index_;
    std::int64_t global_batch_ = 0;
    double timeout_s_ = 0; // dist.timeout
    int lock_fd_ = -1;     // rank 0: <dir>/.lock, flock'ed
};

// The archives of a checkpoint's ranks, read on demand for an elastic resume: a rank of the new
// job reads only the old ranks whose shards its own overlaps. Shards are the contiguous pieces of a
// flat tensor of `numel` elements that ZeRO and FSDP cut into ceil(numel / world) per rank (zeros
// after the end).
// Files read by several ranks (rank 0's replicated state, a stage's source rank) are read once per
// node (issue 39): the constructor, collective over `world`, learns which saved ranks' files each
// rank of the node wants; a file wanted by two or more is read by the node's lowest such rank and
// broadcast inside the node (its verdict first, so a missing or corrupt file is the same error on
// every rank that wanted it, raised when rank() asks for it); a file only one rank wants is read
// by that rank on demand. An elastic resume may ask rank() for more saved ranks than `wanted`
// named (whose shards overlap depends on each tensor's size): those are read on demand too.
class CheckpointShards final : public dist::ShardSource {
  public:
    CheckpointShards(const CheckpointManifest& m, torch::Device device, MPI_Comm world,
                     const std::vector<int>& wanted);
    int saved_world() const override { return manifest_.world_size; }
    const std::string& where() const override { return manifest_.path; }
    // Old rank r's archive (read once).
    torch::serialize::InputArchive& rank(int r) override;
    // This rank's shard for `world` ranks of the flat tensor `name` inside the sub-archive `sub`
    // (e.g. "zero_shard", "exp_avg"), assembled from the saved ranks' shards: [ceil(numel/world)],
    // zero-padded. A saved shard of the wrong size is an InputError naming the file.
    torch::Tensor reshard(const std::string& sub, const std::string& name, std::int64_t numel,
                          int new_rank, int new_world) override;

  private:
    CheckpointManifest manifest_;
    torch::Device device_;
    std::vector<std::unique_ptr<torch::serialize::InputArchive>> archives_;
    std::map<int, std::string> shared_; // saved rank -> the bytes another rank read, until rank()
    std::map<int, std::string> failed_; // saved rank -> why its node's read failed
};

// RNG states of this process (CPU generator, and the CUDA generator of `cuda_index` >= 0). The
// states are byte tensors that the generators take on the host, wherever the archive mapped them.
void save_rng_state(torch::serialize::OutputArchive& out, int cuda_index);
void load_rng_state(torch::serialize::InputArchive& in, int cuda_index);

// A module's parameters and buffers by name. Loading copies in place (views such as ZeRO's flat
// buffers and channels-last strides stay) and names a missing tensor or a shape mismatch.
// trainable_only: only parameters that require grad (LoRA adapters; frozen and NF4 base weights
// are rebuilt from llm.init on resume), no buffers.
void save_named_tensors(torch::serialize::OutputArchive& out, const torch::nn::Module& module,
                        bool trainable_only = false);
void load_named_tensors(torch::serialize::InputArchive& in, torch::nn::Module& module,
                        const std::string& where, bool trainable_only = false);

// Integer scalars in archives.
void write_int(torch::serialize::OutputArchive& out, const std::string& key, std::int64_t v);
std::int64_t read_int(torch::serialize::InputArchive& in, const std::string& key);

} // namespace trainscope::train
