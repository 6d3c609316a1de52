// ParallelLayout: the typed parallel plan of a run, resolved once (as torchtitan's ParallelDims):
// the strategy, how much data parallelism shards (dist.zero), world size, pipeline stages,
// data-parallel replicas, each rank's place in them, whether the sampler shards the data, the
// per-rank micro-batch, gradient accumulation and the global batch, validated once at build time
// with messages that carry the numbers. Both trainers, the checkpointer and elastic resume read
// it instead of re-deriving anything from run.strategy or dist.zero. It also applies run.scaling
// (a strong/weak scaling point of a jobscripts/sweep study) to the batch.
#pragma once

#include <cstdint>
#include <string>

#include "trainscope/core/config.hpp"
#include "trainscope/distributed/options.hpp"

namespace trainscope::train {

// run.strategy, parsed once (parse_strategy: ConfigError for anything else).
enum class Strategy { Dp, Ddp, DdpDs, Pipeline };
Strategy parse_strategy(const std::string& name);
const char* to_string(Strategy s);

struct ParallelLayout {
    Strategy strategy = Strategy::DdpDs;
    // dist.zero: what data parallelism shards over the replicas (the workloads refuse what they
    // cannot run: the CV workload stages 1-2 under ddp and ddp-ds only).
    dist::ZeroStage zero = dist::ZeroStage::None;
    int world_size = 1;
    int stages = 1;                         // pipeline stages per replica (1: no pipeline)
    int replicas = 1;                       // data-parallel shards: world_size / stages
    std::int64_t batch_per_rank = 0;        // samples (sequences) per rank per micro-batch
    std::int64_t gradient_accumulation = 1; // micro-batches per optimizer step
    // Whether each shard reads a disjoint 1/replicas of the data (ddp-ds, pipeline, llm) or every
    // rank the whole set (dp, ddp).
    bool sharded_data = true;

    // A rank's place (ranks are stage-major: rank = replica x stages + stage). data_rank: its
    // data-parallel replica (the sampler's shard, the rank in the gradient group); stage: its
    // pipeline stage (0 without a pipeline); state_source_rank: the rank whose checkpoint file
    // holds its replicated state (the same stage's rank in replica 0).
    int data_rank(int rank) const { return rank / stages; }
    int stage(int rank) const { return rank % stages; }
    int state_source_rank(int rank) const { return stage(rank); }
    // Why a checkpoint of `saved_world` ranks cannot be resumed by this layout's rank count (""
    // when it can: the sample order and the optimizer's arithmetic depend only on the global batch
    // where every rank reads a disjoint 1/N of the data (ddp-ds) and the state is either
    // replicated or flat shards (ZeRO, FSDP) that can be cut again). by_global_batch: the
    // checkpoint records its global batch.
    std::string elastic_refusal(int saved_world, bool by_global_batch) const;

    // Samples per optimizer step over all ranks.
    std::int64_t global_batch() const { return batch_per_rank * gradient_accumulation * replicas; }
    // "ranks" or "pipeline replicas": what the batch is split over, for messages.
    std::string shard_unit() const { return stages > 1 ? "pipeline replicas" : "ranks"; }
    // Training samples one shard walks per epoch out of `samples` (drop_last: whole shards only,
    // as DistributedSampler).
    std::int64_t samples_per_shard(std::int64_t samples, bool drop_last) const;

    // Resolves the layout from the configuration (run.strategy, dist.zero). Applies run.scaling
    // first (it rewrites train.batch_size in `c`, hence non-const), then train.global_batch_size;
    // stages > 1 for run.strategy=pipeline. Throws ConfigError naming the options and the numbers.
    // run.strategy and dist.zero only (what the workloads check before the rest is resolved).
    static ParallelLayout kinds(const core::Config& c);
    static ParallelLayout resolve(core::Config& c, int world_size, int stages, bool sharded_data,
                                  std::int64_t gradient_accumulation);
};

} // namespace trainscope::train
