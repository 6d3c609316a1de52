// Options of the profiler window (section "profile"): whether LibTorch's Kineto profiler records a
// few iterations, which ones, how many operators/kernels the summary keeps, and whether each
// rank's Chrome trace is saved beside the run file. profile.warmup_iters belongs to train.
#pragma once

#include <cstdint>

#include "trainscope/core/config.hpp"

namespace trainscope::prof {

// profile.enabled, profile.start_iter, profile.iters, profile.top_n, profile.trace.
void declare_options(core::OptionRegistry& registry);

struct ProfileOptions {
    bool enabled = false;
    std::int64_t start_iter = 10; // first profiled iteration (global iteration index, from 0)
    std::int64_t iters = 5;       // iterations inside the window
    std::int64_t top_n = 20;      // operators and kernels kept per rank
    bool trace = false;           // save <run file stem>.rank<R>.trace.json

    static ProfileOptions from_config(const core::Config& config);
};

} // namespace trainscope::prof
