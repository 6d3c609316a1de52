// Options owned by the train module (run.*, train.*, profile.warmup_iters, log.*) and the full
// registry of every module's options, which the application parses against.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainscope/core/config.hpp"
#include "trainscope/train/lr_schedule.hpp"

namespace trainscope::train {

void declare_options(core::OptionRegistry& registry);
// Every option trainscope knows, in --help order.
core::OptionRegistry all_options();

// Defaults that depend on run.workload, in one table beside the declarations (options.cpp): where
// an option is left at its registry default (the image-classification one), the LLM workload
// takes torchtune's recipe value instead (train.optimizer adamw, train.lr 3e-4,
// train.weight_decay 0.01, run.precision bf16). Applied to the configuration before anything
// reads it, so /config and /config/ini record the values that ran. Returns "key=value" of each
// default applied.
std::vector<std::string> apply_workload_defaults(core::Config& config);

// train.epochs and train.max_iters: how long the TrainingLoop runs.
struct RunLength {
    std::int64_t epochs = 1;
    std::int64_t max_iters = 0; // 0: no cap
    // Iterations of the whole run in epochs of `per_epoch` iterations.
    std::int64_t total_iterations(std::int64_t per_epoch) const;
};

// train.optimizer, train.lr, train.momentum, train.nesterov, train.weight_decay,
// train.fused_optimizer.
struct OptimizerConfig {
    std::string kind = "sgd"; // sgd | adamw
    double lr = 0.05, momentum = 0.9, weight_decay = 4e-5;
    bool nesterov = false;
    bool fused = true; // ATen's fused multi-tensor kernels (distributed/fused_optim.hpp)
};

// The train.* options both workloads use, with run.seed and profile.accounting, read once by the
// Session (after apply_workload_defaults) into RunEnvironment::train: nothing else reads these
// keys. The loop takes the run length and the schedule, the trainers the rest.
struct TrainConfig {
    RunLength length;
    OptimizerConfig optimizer;
    ScheduleConfig schedule; // from optimizer.lr
    bool eval = true;
    std::int64_t eval_batch_size = 256;
    std::uint64_t seed = 42;
    bool accounting = true; // profile.accounting
};
TrainConfig read_train_config(const core::Config& config);

} // namespace trainscope::train
