// The run file's schema (trainscope/1) as one table: every group, dataset, series column and
// attribute the application writes, with its units or type and its meaning. The writers name
// objects through the path constants below; RunFile checks every object it writes against the
// table (a run file cannot hold what the table does not declare, nor with other units); and
// `trainscope --print-schema` prints the table as JSON, from which scripts/gen_schema generates the
// Python module the readers import (postprocess/trainscope_post/schema.py) and the reference tables
// of docs/run_file_schema.md.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trainscope::io::schema {

inline constexpr std::string_view kVersion = "trainscope/1";

// Path constants. A segment in braces is a placeholder that matches one name made of [A-Za-z0-9_.-]
// (e.g. /comm/{op}: /comm/allreduce); with_part() fills it.
inline constexpr std::string_view kRoot = "/";
inline constexpr std::string_view kConfig = "/config";
inline constexpr std::string_view kConfigIni = "/config/ini";
inline constexpr std::string_view kBuild = "/build";
inline constexpr std::string_view kPlan = "/plan";
inline constexpr std::string_view kPlanValIndices = "/plan/val_indices";
inline constexpr std::string_view kRanks = "/ranks";
inline constexpr std::string_view kIterations = "/iterations";
inline constexpr std::string_view kEpochs = "/epochs";
inline constexpr std::string_view kSummary = "/summary";
inline constexpr std::string_view kTelemetry = "/telemetry";
inline constexpr std::string_view kProfile = "/profile";
inline constexpr std::string_view kProfileWindowS = "/profile/window_s";
inline constexpr std::string_view kProfileIterations = "/profile/iterations";
inline constexpr std::string_view kProfileHostSyncCalls = "/profile/host_sync_calls";
inline constexpr std::string_view kProfileCategories = "/profile/categories";
inline constexpr std::string_view kProfileTopOps = "/profile/top_ops";
inline constexpr std::string_view kProfileTopKernels = "/profile/top_kernels";
inline constexpr std::string_view kProfileBreakdown = "/profile/breakdown";
inline constexpr std::string_view kProfileBreakdownGpuKernels = "/profile/breakdown/gpu_kernels";
inline constexpr std::string_view kProfileBreakdownComputeS = "/profile/breakdown/compute_s";
inline constexpr std::string_view kProfileBreakdownCommunicationS =
    "/profile/breakdown/communication_s";
inline constexpr std::string_view kProfileBreakdownMemoryS = "/profile/breakdown/memory_s";
inline constexpr std::string_view kProfileBreakdownIdleS = "/profile/breakdown/idle_s";
inline constexpr std::string_view kProfileBreakdownSpanS = "/profile/breakdown/span_s";
inline constexpr std::string_view kProfileBreakdownOverlapRatio =
    "/profile/breakdown/overlap_ratio";
inline constexpr std::string_view kComm = "/comm";
inline constexpr std::string_view kCommOp = "/comm/{op}";
inline constexpr std::string_view kCommOpBytes = "/comm/{op}/bytes";
inline constexpr std::string_view kCommOpCount = "/comm/{op}/count";
inline constexpr std::string_view kCommOpTimeS = "/comm/{op}/time_s";
inline constexpr std::string_view kCommOpTimeMaxS = "/comm/{op}/time_max_s";
inline constexpr std::string_view kCommOpAlgbwGBps = "/comm/{op}/algbw_GBps";
inline constexpr std::string_view kCommOpBusbwGBps = "/comm/{op}/busbw_GBps";
inline constexpr std::string_view kCommBuckets = "/comm/buckets";
inline constexpr std::string_view kCommBucketsBytes = "/comm/buckets/bytes";

enum class Kind {
    group,       // an HDF5 group that carries attributes
    attribute,   // an attribute of `path` (the root is "/")
    series,      // a per-rank series group: one [world_size, n] dataset per column
    column,      // a column of the series `path`, or of the per-rank table `path`
    table,       // a variable-length per-rank table: one ragged dataset per column
    per_rank,    // float64 [world_size], element r from rank r
    ragged,      // float64 [sum of counts] + `_offset` / `_count` int64 [world_size]
    ragged_text, // the same for text: fixed-length UTF-8 strings
    vector,      // float64 [n], rank 0's values
    text,        // scalar fixed-length UTF-8 string, rank 0's text
    compound,    // compound table [world_size], row r from rank r
    field,       // a field of the compound `path`
};

struct Entry {
    Kind kind;
    std::string_view path;    // the object; for attribute, column and field: the object they are of
    std::string_view name;    // attribute, column or field name ("" for objects)
    std::string_view units;   // datasets and columns: the `units` attribute ("" otherwise)
    std::string_view type;    // attributes and fields: str, int, float, int64[world_size], ...
    std::string_view when;    // when it is present, e.g. "run.workload=llm" ("" = always)
    std::string_view meaning; // Markdown, for docs/run_file_schema.md
};

// The table, in the order of docs/run_file_schema.md (modules/io/src/schema_table.cpp and
// schema_table_results.cpp).
const std::vector<Entry>& table();

const char* to_string(Kind kind);

// The entry describing `path` (an object path: placeholders in the table match any name) of one
// of `kinds`, or of any kind when empty; nullptr when the table has none.
const Entry* find_object(std::string_view path, std::initializer_list<Kind> kinds = {});
// The attribute, column or field `name` of `path` (placeholders match on both); nullptr if none.
const Entry* find_member(Kind kind, std::string_view path, std::string_view name);

// InternalError naming the run file `file` and schema_table.cpp unless `object` is in the table as
// one of `kinds` (any when empty) with `units` (when not empty): RunFile's strict check.
void require_object(std::string_view file, std::string_view object,
                    std::initializer_list<Kind> kinds, std::string_view units);
// The same for attribute, column or field `name` of `object`.
void require_member(std::string_view file, Kind kind, std::string_view object,
                    std::string_view name, std::string_view units);

// `path` with its placeholder filled: with_part(kCommOp, "allreduce") == "/comm/allreduce".
std::string with_part(std::string_view path, std::string_view part);
// `group` + "/" + `name`: a dataset of a group, e.g. child(kProfileTopOps, "count").
std::string child(std::string_view group, std::string_view name);
// "/a/b" for "/a/b/", "a/b" or "a//b"; "/" for "": the form the table and the file use.
std::string normalize(std::string_view path);

// The table as JSON: {"schema": ..., "entries": [{kind, path, name, units, type, when,
// meaning}, ...]}, printed by `trainscope --print-schema`.
std::string to_json();

} // namespace trainscope::io::schema
