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
    registry.add_float("output.sync_every_s", 60.0,
                       "seconds between syncs of the run file to disk (H5Fflush: an fsync on every "
                       "rank) at flushes; 0 = at every flush. A killed job's file holds the rows "
                       "of its last sync; status changes always sync",
                       0.0);
}

} // namespace trainscope::io
