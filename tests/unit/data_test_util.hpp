// Helpers shared by the data module's unit tests.
#pragma once

#include <map>
#include <string>

#include "trainscope/core/config.hpp"
#include "trainscope/data/options.hpp"

namespace trainscope::testing {

// A Config of the data module's options (defaults, overridden by `values`).
inline core::Config data_config(const std::map<std::string, std::string>& values) {
    static core::OptionRegistry registry = [] {
        core::OptionRegistry r;
        data::declare_options(r);
        return r;
    }();
    return core::Config::from_values(registry, values);
}

} // namespace trainscope::testing
