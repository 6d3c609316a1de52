// Options of the telemetry sampler (telemetry.*), declared next to the code that uses them. Kept
// apart from trainscope/prof/options.hpp (the profiler window's) so the two can evolve separately.
#pragma once

#include <string>

#include "trainscope/core/config.hpp"

namespace trainscope::prof {

// telemetry.enabled (bool, default true), telemetry.interval_ms (int >= 10, default 500).
void declare_telemetry_options(core::OptionRegistry& registry);

struct TelemetryOptions {
    bool enabled = true;
    int interval_ms = 500; // sampling period
    // The NVML library dlopen()ed at start; not a user option (tests point it elsewhere).
    std::string nvml_library = "libnvidia-ml.so.1";
};

TelemetryOptions telemetry_options(const core::Config& config);

} // namespace trainscope::prof
