// The run file's tables of measurements that prof and dist produce: /telemetry (TelemetrySampler),
// /profile (ProfilerWindow) and /comm (CommBenchmark). Those modules hand their data over as plain
// structs and never see the run file (DESIGN.md, Layout); the layout written here is
// docs/run_file_schema.md's. Each function says whether all ranks must call it.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "trainscope/io/run_file.hpp"

// Declared only: this header stays free of LibTorch (comm_benchmark.hpp includes it), so a
// torch-free caller such as the telemetry test can use it.
namespace trainscope::dist {
struct CommBenchmarkOptions;
struct CommResult;
} // namespace trainscope::dist
namespace trainscope::prof {
class ProfilerWindow;
class TelemetrySampler;
} // namespace trainscope::prof

namespace trainscope::train {

// Collective, once per file: declares the /telemetry series (the sampler's columns, chunks of 256
// rows). Nothing when telemetry.enabled is false, which is the same on every rank.
// expected_rows: about the samples the run will take (0 = unknown), for the chunk size.
void declare_telemetry(io::RunFile& file, const prof::TelemetrySampler& sampler,
                       std::int64_t expected_rows = 0);

// Local: buffers the samples taken since the last call as /telemetry rows, written by the next
// collective RunFile::flush (the Recorder appends at each of its flushes, so a killed job keeps
// them). Nothing when telemetry is disabled; otherwise after declare_telemetry.
void append_telemetry(io::RunFile& file, prof::TelemetrySampler& sampler);

// Collective over `comm` (the run file's communicator), after sampler.stop() and
// declare_telemetry: appends the remaining samples, writes the /telemetry attributes
// (gpu_available, gpu_available_ranks, reason, interval_ms, gpu_name, nvml_device_match, clock)
// and flushes. Nothing when telemetry.enabled is false (on every rank alike).
void write_telemetry(io::RunFile& file, prof::TelemetrySampler& sampler, MPI_Comm comm);

// Collective on every rank of `file`, once the run is over: finishes the window (saving this
// rank's Chrome trace beside the run file when profile.trace is set) and writes /profile. A
// disabled window writes only the group attribute enabled=0.
void write_profile(io::RunFile& file, prof::ProfilerWindow& window);

// Collective on every rank of `file`: /comm/<op>/{bytes, count, time_s, time_max_s, algbw_GBps,
// busbw_GBps} for each operation of options.ops (1-D float64 [sizes], units B, 1, s, s, GB/s,
// GB/s; rank 0's values) with attribute busbw_factor on /comm/<op>, and on /comm: backend,
// world_size, allreduce (Communicator::allreduce_algorithm), dtype, warmup, iters, time, bytes
// (what the numbers mean).
void write_comm_benchmark(io::RunFile& file, const dist::CommBenchmarkOptions& options,
                          const std::vector<dist::CommResult>& results, const std::string& backend,
                          int world_size, const std::string& allreduce);

} // namespace trainscope::train
