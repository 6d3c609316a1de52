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
    "Rows the rank of per-rank row j (`ranks[j]`) actually wrote (≤ `rows`); rewritten by rank 0 "
    "at a flush when the counts "
    "changed. Use it, not `isnan`, to know how many rows each rank really wrote: a rank may also "
    "record NaN on purpose (e.g. no validation loss that epoch). A dataset, not an attribute: an "
    "attribute of world_size elements exceeds HDF5's 64 KiB object-header message limit from "
    "8,184 ranks (files of schema revisions before issue 39 have it as the attribute "
    "`rank_rows`, which readers still accept).";

inline constexpr std::string_view kRanksMeaning =
    "The MPI rank of each per-rank row, ascending: row j of every dataset in the group (and of "
    "`rank_rows`) is rank `ranks[j]`. All ranks (R = world_size) unless `output.per_rank` chose "
    "fewer (root attribute `per_rank`); the aggregates cover every rank either way. Files "
    "written before issue 39 have no `ranks`: their rows are ranks 0..world_size-1.";
inline constexpr std::string_view kAggregateGroupMeaning =
    "Per-row statistics over **every** rank, whatever `output.per_rank` keeps per rank: one "
    "compound dataset per column of the series, reduced to rank 0 (one MPI_Ireduce for all "
    "columns, posted at a flush and completed at a later one without waiting, at most 4 in "
    "flight, or at once at a sync or status change; rank 0 writes it then). A row is "
    "aggregated once every rank has it; a status change aggregates the rest (a rank without that "
    "row is left out: see `count`).";
inline constexpr std::string_view kAggregateRowsMeaning =
    "Rows aggregated as of the last file sync (a sync completes the flush's reduction). While the "
    "run writes, the datasets' extent may be larger: those rows have `count` 0.";
inline constexpr std::string_view kAggregateSlowestByMeaning =
    "The column that decides which rank was the slowest in a row (`slowest`).";
inline constexpr std::string_view kAggregateMeaning =
    "Compound [n]: row i summarises column `{column}` in row i over every rank with a finite "
    "value there (NaN counts as no value). Attribute `units`: the column's.";

} // namespace trainscope::io::schema
