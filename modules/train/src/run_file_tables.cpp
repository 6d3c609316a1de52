// The /telemetry, /profile and /comm writers (run_file_tables.hpp): the layout, attribute values
// and units of docs/run_file_schema.md, from the plain data prof and dist hand over.
#include "trainscope/train/run_file_tables.hpp"

#include <algorithm>

#include <cstdint>

#include "trainscope/distributed/bandwidth.hpp"
#include "trainscope/distributed/comm_benchmark.hpp"
#include "trainscope/io/schema.hpp"
#include "trainscope/prof/profiler_window.hpp"
#include "trainscope/prof/telemetry.hpp"

namespace trainscope::train {

namespace schema = io::schema;

namespace {

std::string json_string(const std::string& text) {
    std::string out = "\"";
    for (char c : text) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out + "\"";
}

// /profile from one rank's summary (docs/run_file_schema.md); collective.
void write_profile_tables(io::RunFile& file, const prof::ProfileOptions& options,
                          const prof::ProfileSummary& mine, int world_size) {
    if (!options.enabled) {
        file.set_attributes(schema::kProfile, {{"enabled", std::int64_t{0}}});
        return;
    }
    // Attributes carry rank 0's values; ranks run the same iterations, so status agrees (the
    // per-rank `iterations` dataset shows it if not).
    std::string traces = "[";
    if (options.trace && mine.status != "not_reached")
        for (int r = 0; r < world_size; ++r)
            traces += (r ? ", " : "") + json_string(prof::trace_path_for(file.path(), r));
    traces += "]";
    file.set_attributes(
        schema::kProfile,
        {{"enabled", std::int64_t{1}},
         {"start_iter", options.start_iter},
         {"iters", options.iters},
         {"top_n", options.top_n},
         {"trace", std::int64_t{options.trace ? 1 : 0}},
         {"status", mine.status},
         {"first_iteration", mine.first_iteration},
         {"trace_files", traces},
         {"threads", std::string("operators of the thread that runs the training loop (and "
                                 "autograd's device threads); data-loader workers are not "
                                 "profiled")}});
    file.write_per_rank(schema::kProfileWindowS, mine.window_s, "s");
    file.write_per_rank(schema::kProfileIterations, static_cast<double>(mine.iterations),
                        "iterations");
    file.write_per_rank(schema::kProfileHostSyncCalls, static_cast<double>(mine.host_sync_calls),
                        "calls");

    auto write_table = [&](std::string_view group, const auto& rows, bool with_self,
                           bool with_min_max) {
        std::vector<std::string> names;
        std::vector<double> count, total, self, min, max;
        for (const auto& row : rows) {
            names.push_back(row.name);
            count.push_back(static_cast<double>(row.count));
            total.push_back(row.total_s);
            if constexpr (requires { row.self_s; }) self.push_back(row.self_s);
            if constexpr (requires { row.min_s; }) {
                min.push_back(row.min_s);
                max.push_back(row.max_s);
            }
        }
        file.write_ragged_strings(schema::child(group, "name"), names);
        file.write_ragged(schema::child(group, "count"), count, "events");
        file.write_ragged(schema::child(group, "total_s"), total, "s");
        if (with_self) file.write_ragged(schema::child(group, "self_s"), self, "s");
        if (with_min_max) {
            file.write_ragged(schema::child(group, "min_s"), min, "s");
            file.write_ragged(schema::child(group, "max_s"), max, "s");
        }
    };
    write_table(schema::kProfileCategories, mine.categories, false, true);
    write_table(schema::kProfileTopOps, mine.top_ops, true, false);
    write_table(schema::kProfileTopKernels, mine.top_kernels, false, false);

    const prof::TemporalBreakdown& b = mine.breakdown;
    file.write_per_rank(schema::kProfileBreakdownGpuKernels, static_cast<double>(b.gpu_kernels),
                        "kernels");
    file.write_per_rank(schema::kProfileBreakdownComputeS, b.compute_s, "s");
    file.write_per_rank(schema::kProfileBreakdownCommunicationS, b.communication_s, "s");
    file.write_per_rank(schema::kProfileBreakdownMemoryS, b.memory_s, "s");
    file.write_per_rank(schema::kProfileBreakdownIdleS, b.idle_s, "s");
    file.write_per_rank(schema::kProfileBreakdownSpanS, b.span_s, "s");
    file.write_per_rank(schema::kProfileBreakdownOverlapRatio, b.overlap_ratio, "1");
    file.set_attributes(
        schema::kProfileBreakdown,
        {{"gpu_kernels", b.gpu_kernels}, // rank 0's; per rank in the dataset gpu_kernels
         {"definition",
          std::string("Holistic Trace Analysis temporal breakdown over the device intervals of the "
                      "window: compute + communication + memory + idle = span; NaN when a rank "
                      "has no GPU kernels (CPU runs)")}});
}

} // namespace

void declare_telemetry(io::RunFile& file, const prof::TelemetrySampler& sampler,
                       std::int64_t expected_rows) {
    if (!sampler.enabled()) return;
    std::vector<io::Column> columns;
    for (const prof::TelemetryColumn& c : prof::TelemetrySampler::columns())
        columns.push_back({c.name, c.units});
    // Samples are few (2 per second by default): chunks sized to the run keep a short run's file
    // small (the MPI-IO driver allocates a whole chunk for its first sample).
    file.declare_series(schema::kTelemetry, columns,
                        io::series_chunk_rows(expected_rows, std::max(1, file.per_rank_count())));
}

void append_telemetry(io::RunFile& file, prof::TelemetrySampler& sampler) {
    if (!sampler.enabled()) return;
    for (const prof::TelemetrySample& s : sampler.take_new_samples())
        file.append(schema::kTelemetry, prof::TelemetrySampler::values(s));
}

void write_telemetry(io::RunFile& file, prof::TelemetrySampler& sampler, MPI_Comm comm) {
    if (!sampler.enabled()) return;
    append_telemetry(file, sampler);
    const prof::TelemetryStatus st = sampler.status(comm);
    file.set_attributes(
        schema::kTelemetry,
        {{"gpu_available", static_cast<std::int64_t>(st.gpu_available ? 1 : 0)},
         {"gpu_available_ranks", static_cast<std::int64_t>(st.gpu_available_ranks)},
         {"reason", st.reason},
         {"interval_ms", static_cast<std::int64_t>(st.interval_ms)},
         {"gpu_name", st.gpu_name},
         {"nvml_device_match", st.nvml_device_match},
         {"clock", "t_s: seconds on the run clock of /iterations/t_start (per rank, steady)"}});
    file.flush();
}

void write_profile(io::RunFile& file, prof::ProfilerWindow& window) {
    const prof::ProfileSummary& mine = window.finish(file.path());
    write_profile_tables(file, window.options(), mine, window.world_size());
}

void write_comm_benchmark(io::RunFile& file, const dist::CommBenchmarkOptions& o,
                          const std::vector<dist::CommResult>& results, const std::string& backend,
                          int world_size, const std::string& allreduce) {
    file.set_attributes(
        schema::kComm,
        {{"backend", backend},
         {"world_size", std::int64_t{world_size}},
         {"allreduce", allreduce},
         {"dtype", dist::comm_dtype_name(o.dtype)},
         {"warmup", std::int64_t{o.warmup}},
         {"iters", std::int64_t{o.iters}},
         {"time", std::string("seconds per operation: each rank's mean over the timed "
                              "iterations, averaged over ranks (time_max_s: slowest "
                              "rank)")},
         {"bytes", std::string("whole array as nccl-tests count it: allreduce and "
                               "broadcast the buffer, allgather the output, "
                               "reduce_scatter the input")}});
    for (dist::Collective op : o.ops) {
        const std::string part = dist::to_string(op);
        std::vector<double> bytes, count, time, time_max, algbw, busbw;
        for (const dist::CommResult& r : results) {
            if (r.op != op) continue;
            bytes.push_back(static_cast<double>(r.bytes));
            count.push_back(static_cast<double>(r.count));
            time.push_back(r.time_s);
            time_max.push_back(r.time_max_s);
            algbw.push_back(r.algbw_GBps);
            busbw.push_back(r.busbw_GBps);
        }
        file.write_vector(schema::with_part(schema::kCommOpBytes, part), bytes, "B");
        file.write_vector(schema::with_part(schema::kCommOpCount, part), count, "1");
        file.write_vector(schema::with_part(schema::kCommOpTimeS, part), time, "s");
        file.write_vector(schema::with_part(schema::kCommOpTimeMaxS, part), time_max, "s");
        file.write_vector(schema::with_part(schema::kCommOpAlgbwGBps, part), algbw, "GB/s");
        file.write_vector(schema::with_part(schema::kCommOpBusbwGBps, part), busbw, "GB/s");
        file.set_attributes(schema::with_part(schema::kCommOp, part),
                            {{"busbw_factor", dist::busbw_factor(op, world_size)}});
    }
}

} // namespace trainscope::train
