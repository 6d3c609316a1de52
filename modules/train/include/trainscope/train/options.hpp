// Options owned by the train module (run.*, train.*, profile.warmup_iters, log.*) and the full
// registry of every module's options, which the application parses against.
#pragma once

#include <string>
#include <vector>

#include "trainscope/core/config.hpp"

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

} // namespace trainscope::train
