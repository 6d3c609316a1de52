// Options owned by the train module (run.*, train.*, profile.warmup_iters, log.*) and the full
// registry of every module's options, which the application parses against.
#pragma once

#include "trainscope/core/config.hpp"

namespace trainscope::train {

void declare_options(core::OptionRegistry& registry);
// Every option trainscope knows, in --help order.
core::OptionRegistry all_options();

} // namespace trainscope::train
