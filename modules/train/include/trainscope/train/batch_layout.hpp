// BatchLayout: the layout arithmetic of a run in one place (as torchtitan's ParallelDims): world
// size, pipeline stages, data-parallel replicas, the per-rank micro-batch, gradient accumulation
// and the global batch, validated once at build time with messages that carry the numbers. It also
// applies run.scaling (a strong/weak scaling point of a jobscripts/sweep study) to the batch.
#pragma once

#include <cstdint>
#include <string>

#include "trainscope/core/config.hpp"

namespace trainscope::train {

struct BatchLayout {
    int world_size = 1;
    int stages = 1;                         // pipeline stages per replica (1: no pipeline)
    int replicas = 1;                       // data-parallel shards: world_size / stages
    std::int64_t batch_per_rank = 0;        // samples (sequences) per rank per micro-batch
    std::int64_t gradient_accumulation = 1; // micro-batches per optimizer step
    // Whether each shard reads a disjoint 1/replicas of the data (ddp-ds, pipeline, llm) or every
    // rank the whole set (dp, ddp).
    bool sharded_data = true;

    // Samples per optimizer step over all ranks.
    std::int64_t global_batch() const { return batch_per_rank * gradient_accumulation * replicas; }
    // "ranks" or "pipeline replicas": what the batch is split over, for messages.
    std::string shard_unit() const { return stages > 1 ? "pipeline replicas" : "ranks"; }
    // Training samples one shard walks per epoch out of `samples` (drop_last: whole shards only,
    // as DistributedSampler).
    std::int64_t samples_per_shard(std::int64_t samples, bool drop_last) const;

    // Resolves the layout from the configuration. Applies run.scaling first (it rewrites
    // train.batch_size in `c`, hence non-const), then train.global_batch_size; stages > 1 for
    // run.strategy=pipeline. Throws ConfigError naming the options and the numbers.
    static BatchLayout resolve(core::Config& c, int world_size, int stages, bool sharded_data,
                               std::int64_t gradient_accumulation);
};

} // namespace trainscope::train
