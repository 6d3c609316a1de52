// ParallelLayout (see parallel_layout.hpp): run.strategy, dist.zero, run.scaling,
// train.global_batch_size, the shard split and what elastic resume allows.
#include "trainscope/train/parallel_layout.hpp"

#include "trainscope/core/error.hpp"
#include "trainscope/train/pipeline.hpp"

namespace trainscope::train {
namespace {

// run.scaling=strong|weak: sets train.batch_size, the per-shard batch, from run.global_batch or
// run.batch_per_rank, after checking that the point is what the study says (the sweep checked it
// too, before submitting).
void apply_scaling(core::Config& c, int shards, const std::string& unit) {
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
    std::int64_t batch = 0;
    if (scaling == "strong") {
        if (global <= 0)
            throw core::ConfigError("run.scaling=strong needs run.global_batch: the samples per "
                                    "iteration that every point of the study shares");
        if (global % shards != 0)
            throw core::ConfigError(
                "run.scaling=strong: run.global_batch=" + std::to_string(global) +
                " does not divide over " + std::to_string(shards) + " " + unit +
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

} // namespace

Strategy parse_strategy(const std::string& name) {
    if (name == "dp") return Strategy::Dp;
    if (name == "ddp") return Strategy::Ddp;
    if (name == "ddp-ds") return Strategy::DdpDs;
    if (name == "pipeline") return Strategy::Pipeline;
    throw core::ConfigError("option run.strategy = '" + name +
                            "' is invalid: expected ddp-ds, ddp, dp or pipeline");
}

const char* to_string(Strategy s) {
    switch (s) {
    case Strategy::Dp:
        return "dp";
    case Strategy::Ddp:
        return "ddp";
    case Strategy::DdpDs:
        return "ddp-ds";
    case Strategy::Pipeline:
        return "pipeline";
    }
    return "?";
}

std::string ParallelLayout::elastic_refusal(int saved_world, bool by_global_batch) const {
    if (saved_world == world_size) return "";
    if (strategy == Strategy::Pipeline)
        return "run.strategy=pipeline keeps per-stage state and splits the ranks into "
               "pipeline.stages stages";
    if (strategy == Strategy::Ddp || strategy == Strategy::Dp)
        return "with run.strategy=" + std::string(to_string(strategy)) +
               " every rank walks the whole dataset, so the samples of a step depend on the rank "
               "count (run.strategy=ddp-ds does not)";
    if (!by_global_batch)
        return "the checkpoint does not record its global batch (written by an older trainscope)";
    return "";
}

std::int64_t ParallelLayout::samples_per_shard(std::int64_t samples, bool drop_last) const {
    if (!sharded_data) return samples;
    return drop_last ? samples / replicas : (samples + replicas - 1) / replicas;
}

ParallelLayout ParallelLayout::kinds(const core::Config& c) {
    ParallelLayout l;
    l.strategy = parse_strategy(c.get_string("run.strategy"));
    l.zero = dist::read_sharding(c).zero;
    return l;
}

ParallelLayout ParallelLayout::resolve(core::Config& c, int world_size, int stages,
                                       bool sharded_data, std::int64_t gradient_accumulation) {
    ParallelLayout l = kinds(c);
    l.world_size = world_size;
    l.stages = std::max(1, stages);
    l.sharded_data = sharded_data;
    l.gradient_accumulation = gradient_accumulation;
    l.replicas = l.stages > 1 ? pipeline_replicas(world_size, l.stages) : world_size;
    const std::string unit = l.shard_unit();
    apply_scaling(c, l.replicas, unit);
    l.batch_per_rank = c.get_int("train.batch_size");
    if (const std::int64_t g = c.get_int("train.global_batch_size"); g > 0) {
        if (g % l.replicas != 0)
            throw core::ConfigError("train.global_batch_size=" + std::to_string(g) +
                                    " cannot be split evenly across " + std::to_string(l.replicas) +
                                    " " + unit + ": use a multiple of " +
                                    std::to_string(l.replicas) + " (e.g. " +
                                    std::to_string((g / l.replicas + 1) * l.replicas) +
                                    "), or set train.batch_size (per rank) instead");
        if (!c.is_default("train.batch_size") && l.batch_per_rank * l.replicas != g)
            throw core::ConfigError("train.batch_size=" + std::to_string(l.batch_per_rank) + " x " +
                                    std::to_string(l.replicas) + " " + unit +
                                    " != train.global_batch_size=" + std::to_string(g) +
                                    ": set only one of them");
        l.batch_per_rank = g / l.replicas;
    }
    return l;
}

} // namespace trainscope::train
