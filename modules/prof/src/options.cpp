// Declares the "profile" options of the profiler window and reads them back into ProfileOptions.
#include "trainscope/prof/options.hpp"

namespace trainscope::prof {

void declare_options(core::OptionRegistry& registry) {
    registry.add_bool("profile.enabled", false,
                      "record iterations [start_iter, start_iter + iters) with LibTorch's Kineto "
                      "profiler and summarise them per rank into /profile");
    registry.add_int("profile.start_iter", 10,
                     "first profiled iteration (0-based, counted over all epochs)", 0);
    registry.add_int("profile.iters", 5, "iterations inside the profiler window", 1);
    registry.add_int("profile.top_n", 20,
                     "operators and GPU kernels kept per rank in /profile, by total time", 1);
    registry.add_bool("profile.trace", false,
                      "also save each rank's Chrome trace (HTA/Perfetto) beside the run file as "
                      "<run file stem>.rank<R>.trace.json");
}

ProfileOptions ProfileOptions::from_config(const core::Config& config) {
    ProfileOptions o;
    o.enabled = config.get_bool("profile.enabled");
    o.start_iter = config.get_int("profile.start_iter");
    o.iters = config.get_int("profile.iters");
    o.top_n = config.get_int("profile.top_n");
    o.trace = config.get_bool("profile.trace");
    return o;
}

} // namespace trainscope::prof
