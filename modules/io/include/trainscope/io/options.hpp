// Options of the io module (section "output"): where the run file goes, whether an existing file
// may be replaced, and how often buffered rows are written collectively.
#pragma once

#include "trainscope/core/config.hpp"

namespace trainscope::io {

// output.file (string), output.overwrite (bool), output.flush_every (int >= 1, iterations),
// output.sync_every_s (float >= 0, seconds between file syncs at flushes; 0 = every flush).
void declare_options(core::OptionRegistry& registry);

} // namespace trainscope::io
