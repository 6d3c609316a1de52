// The two parts of the schema table (schema_table.cpp, schema_table_results.cpp).
#pragma once

#include <vector>

#include "trainscope/io/schema.hpp"

namespace trainscope::io::schema {

// /summary, /comm, /telemetry, /profile: appended to the table after the run's description.
const std::vector<Entry>& result_entries();

// The meanings every per-rank series group shares (/iterations, /epochs, /comm/buckets,
// /telemetry): its attribute `rows` and its dataset `rank_rows`.
inline constexpr std::string_view kSeriesRowsMeaning =
    "`n`, the second dimension of every dataset in the group. While the run writes, the extent "
    "grows in steps of the chunk rows (so a flush changes metadata only once per chunk), and the "
    "slots beyond a rank's rows are NaN: `rank_rows` says how many each rank wrote. A status "
    "change (completed, failed, interrupted) sets it to the longest rank's rows.";
inline constexpr std::string_view kRankRowsMeaning =
    "Rows rank r actually wrote (≤ `rows`); rewritten by rank 0 at a flush when the counts "
    "changed. Use it, not `isnan`, to know how many rows each rank really wrote: a rank may also "
    "record NaN on purpose (e.g. no validation loss that epoch). A dataset, not an attribute: an "
    "attribute of world_size elements exceeds HDF5's 64 KiB object-header message limit from "
    "8,184 ranks (files of schema revisions before issue 39 have it as the attribute "
    "`rank_rows`, which readers still accept).";

} // namespace trainscope::io::schema
