// telemetry.* options: declaration and resolution into TelemetryOptions.
#include "trainscope/prof/telemetry_options.hpp"

namespace trainscope::prof {

void declare_telemetry_options(core::OptionRegistry& r) {
    r.add_bool("telemetry.enabled", true,
               "sample host (CPU, RSS, load) and GPU (NVML: power, energy, utilisation, clocks, "
               "memory, PCIe/NVLink) counters in a background thread into /telemetry");
    r.add_int("telemetry.interval_ms", 500, "telemetry sampling period in milliseconds", 10);
}

TelemetryOptions telemetry_options(const core::Config& c) {
    TelemetryOptions o;
    o.enabled = c.get_bool("telemetry.enabled");
    o.interval_ms = static_cast<int>(c.get_int("telemetry.interval_ms"));
    return o;
}

} // namespace trainscope::prof
