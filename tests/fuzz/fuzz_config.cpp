// libFuzzer target: the INI front end of core::CommandLine::parse (trainscope's INI reader, Boost's
// command-line parser, trainscope's validation) over the option declarations of the torch-free
// modules (data, dist, io, prof, telemetry: every option type, range and choice kind the registry
// has).
// Input: the INI file, then optional NUL-separated extra command-line arguments.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_input.hpp"
#include "trainscope/core/config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/data/options.hpp"
#include "trainscope/distributed/options.hpp"
#include "trainscope/io/options.hpp"
#include "trainscope/prof/options.hpp"
#include "trainscope/prof/telemetry_options.hpp"

using namespace trainscope;

namespace {

const core::OptionRegistry& registry() {
    static const core::OptionRegistry r = [] {
        core::OptionRegistry reg;
        data::declare_options(reg);
        dist::declare_options(reg);
        io::declare_options(reg);
        prof::declare_options(reg);
        prof::declare_telemetry_options(reg);
        return reg;
    }();
    return r;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static fuzz::FuzzFile file("fuzz.ini");
    static fuzz::FuzzFile resolved("resolved.ini");
    const fuzz::SplitInput in = fuzz::split_at_nul(data, size);
    std::vector<std::string> args = {"--config", file.write(in.file)};
    for (std::size_t i = 0; i < in.parts.size() && i < 8; ++i)
        args.emplace_back(in.parts[i]);
    try {
        const core::CommandLine cl = fuzz::parse_command_line(registry(), args);
        // What the modules do with the values next: combination checks that throw ConfigError.
        data::data_options(cl.config);
        dist::resolve_options(cl.config, /*visible_cuda_devices=*/0);
        prof::telemetry_options(cl.config);
        // --print-config must reproduce the run: the resolved INI parses back to the same values
        // (only when every value came from the file: argv may hold what no INI line can).
        if (in.parts.empty()) {
            const core::CommandLine again = fuzz::parse_command_line(
                registry(), {"--config", resolved.write(cl.config.to_ini())});
            fuzz::check(again.config.items() == cl.config.items(),
                        "the resolved INI does not reproduce the configuration");
            // --print-config's text (each value followed by "# origin") parses back the same way.
            const core::CommandLine annotated = fuzz::parse_command_line(
                registry(), {"--config", resolved.write(cl.config.to_ini(/*with_origins=*/true))});
            fuzz::check(annotated.config.items() == cl.config.items(),
                        "the --print-config text does not reproduce the configuration");
        }
    } catch (const core::ConfigError&) {
    }
    return 0;
}
