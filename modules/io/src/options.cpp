// Declares the "output" options read by the app when it creates the run file.
#include "trainscope/io/options.hpp"

namespace trainscope::io {

void declare_options(core::OptionRegistry& registry) {
    registry.add_string("output.file", "trainscope_run.h5",
                        "path of the parallel HDF5 run file (schema trainscope/1)");
    registry.add_bool("output.overwrite", false,
                      "replace output.file if it exists (otherwise the run refuses to start)");
    registry.add_int("output.flush_every", 50,
                     "iterations between collective flushes of buffered rows to the run file", 1);
}

} // namespace trainscope::io
