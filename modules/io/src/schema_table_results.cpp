// The run file's schema table, second part (schema_table.cpp has the first and the whole
// table): what a run measured at its end and on the side, /summary, /comm, /telemetry and
// /profile. The same rules: paths are schema.hpp constants, each meaning one Markdown paragraph.
#include "schema_table.hpp"

namespace trainscope::io::schema {

const std::vector<Entry>& result_entries() {
    static const std::vector<Entry> t = {
        {Kind::group, kSummary, "", "", "", "run.workload=cv or llm",
         "Attributes computed collectively at the end of a training run; units are in the names "
         "(`_s` seconds, `_bytes` bytes, `_samples_per_s`, `_j` joules). Statistics use the "
         "measured iterations: all but the first `profile.warmup_iters`. `/summary` is also "
         "written when a stop signal ended the run (`status = interrupted`); it then covers the "
         "iterations that ran."},
        {Kind::attribute, kSummary, "total_iterations", "", "int", "",
         "Iterations this process ran (all, warm-up included)."},
        {Kind::attribute, kSummary, "warmup_iterations", "", "int", "",
         "`profile.warmup_iters`: the first iterations the statistics leave out."},
        {Kind::attribute, kSummary, "measured_iterations", "", "int", "",
         "Iterations the statistics use (the common prefix of the ranks' measured iterations)."},
        {Kind::attribute, kSummary, "warning", "", "str", "measured_iterations = 0",
         "Only when `measured_iterations` is 0: every iteration run was warm-up "
         "(`profile.warmup_iters` ≥ the iterations run, or the run stopped before the first "
         "measured one), so the timing, throughput, MFU and energy statistics are NaN. Rank 0 "
         "also warns at start when `profile.warmup_iters` ≥ the iterations to run, and the "
         "printed summary repeats the warning under its title."},
        {Kind::attribute, kSummary, "wall_s", "", "float", "",
         "Training wall time (includes evaluation and flushes)."},
        {Kind::attribute, kSummary, "median_step_s", "", "float", "",
         "Per iteration the mean over ranks of the step time (ranks run in lock-step, so each "
         "measures the same cycle), then the median over iterations."},
        {Kind::attribute, kSummary, "p95_step_s", "", "float", "",
         "Per iteration the mean over ranks of the step time, then the 95th percentile over "
         "iterations."},
        {Kind::attribute, kSummary, "mean_step_s", "", "float", "",
         "Per iteration the mean over ranks of the step time, then the mean over iterations."},
        {Kind::attribute, kSummary, "median_slowest_rank_step_s", "", "float", "",
         "Per iteration the slowest rank's step time, then the median (≥ `median_step_s`; the gap "
         "shows skew between ranks)."},
        {Kind::attribute, kSummary, "median_{phase}_s", "", "float", "",
         "For each phase (`data`, `h2d`, `forward`, `backward`, `comm_wait`, `optimizer`, "
         "`control`): per iteration the mean over ranks of that phase, then the median over "
         "iterations."},
        {Kind::attribute, kSummary, "p95_{phase}_s", "", "float", "",
         "For each phase (`data`, `h2d`, `forward`, `backward`, `comm_wait`, `optimizer`, "
         "`control`): per iteration the mean over ranks of that phase, then the 95th percentile "
         "over iterations."},
        {Kind::attribute, kSummary, "global_batch_samples", "", "float", "",
         "Samples per step over all ranks."},
        {Kind::attribute, kSummary, "throughput_samples_per_s", "", "float", "",
         "Global batch ÷ `median_step_s`."},
        {Kind::attribute, kSummary, "tokens", "", "float", "token workloads (run.workload=llm)",
         "Token workloads: all ranks' non-padding tokens of the measured iterations."},
        {Kind::attribute, kSummary, "throughput_tokens_per_s", "", "float",
         "token workloads (run.workload=llm)",
         "Token workloads: `tokens` ÷ the sum of the measured iterations' (rank-mean) step times."},
        {Kind::attribute, kSummary, "throughput_tokens_per_s_per_rank", "", "float",
         "token workloads (run.workload=llm)", "`throughput_tokens_per_s` ÷ world size."},
        {Kind::attribute, kSummary, "flops_per_token", "", "float",
         "token workloads (run.workload=llm)",
         "Training FLOPs per token the model FLOP/s use (as `/plan@flops_per_token`)."},
        {Kind::attribute, kSummary, "model_flops_per_s_per_device", "", "float",
         "measured_iterations > 0",
         "Model FLOP/s per device: token workloads token throughput × `flops_per_token` ÷ world "
         "size; CV 6 × forward MACs × global batch ÷ `median_step_s` ÷ world size."},
        {Kind::attribute, kSummary, "mfu", "", "float", "device in the peak table",
         "Model FLOP utilisation: `model_flops_per_s_per_device` ÷ `mfu_peak_flops`. `mfu*` only "
         "for devices in the peak table (H100 SXM/PCIe, H200, A100)."},
        {Kind::attribute, kSummary, "mfu_peak_flops", "", "float", "device in the peak table",
         "The device's dense peak FLOP/s for the arithmetic `run.precision` runs its matmuls in "
         "(`mfu_peak_basis`)."},
        {Kind::attribute, kSummary, "mfu_peak_basis", "", "str", "device in the peak table",
         "The arithmetic `mfu_peak_flops` is the peak of: fp64 → fp64 tensor cores, fp32 → fp32 "
         "CUDA cores, tf32 → tf32 tensor cores, fp16-mixed → fp16 tensor cores (autocast), "
         "bf16-mixed and bf16 → bf16 tensor cores."},
        {Kind::attribute, kSummary, "rank_step_imbalance", "", "float", "",
         "(max − min) ÷ mean of the ranks' mean step times (kept for readers of the first schema "
         "revision)."},
        {Kind::attribute, kSummary, "imbalance_median", "", "float", "",
         "Per iteration the ranks' busy time (`step_s` − `comm_wait_s`) max ÷ mean over ranks (1 "
         "= perfectly balanced), then the median over iterations."},
        {Kind::attribute, kSummary, "imbalance_p95", "", "float", "",
         "The same per-iteration imbalance of busy time, 95th percentile over iterations."},
        {Kind::attribute, kSummary, "straggler_ranks", "", "str", "",
         "Comma-separated ranks whose mean busy time (`step_s` − `comm_wait_s`) exceeds the mean "
         "over all ranks by more than `straggler_threshold` (empty when none): in lock-step every "
         "rank's step time is the same, and the straggler is the rank that waits least."},
        {Kind::attribute, kSummary, "straggler_threshold", "", "float", "",
         "The relative excess of mean busy time that makes a straggler (0.05 = 5 %)."},
        {Kind::attribute, kSummary, "energy_j", "", "float", "",
         "GPU energy over the measured iterations, summed over ranks: each rank's telemetry "
         "energy counter (`/telemetry/energy_j`) between the first measured iteration's start and "
         "the last one's end; NaN when a rank has none (no GPU telemetry, telemetry off)."},
        {Kind::attribute, kSummary, "energy_per_iteration_j", "", "float", "",
         "`energy_j` ÷ measured iterations."},
        {Kind::attribute, kSummary, "energy_per_sample_j", "", "float", "",
         "`energy_j` ÷ (measured iterations × global batch)."},
        {Kind::attribute, kSummary, "peak_host_rss_bytes", "", "float", "",
         "Maximum over ranks and iterations of `/iterations/host_peak_rss_bytes`."},
        {Kind::attribute, kSummary, "peak_device_allocated_bytes", "", "float", "",
         "Maximum over ranks and iterations of `/iterations/device_allocated_peak_bytes` (NaN on "
         "CPU runs)."},
        {Kind::attribute, kSummary, "peak_host_tensor_bytes", "", "float", "",
         "Maximum over ranks and iterations of `/iterations/host_tensor_peak_bytes`."},
        {Kind::attribute, kSummary, "epochs_completed", "", "int", "an epoch completed",
         "Epochs completed (the last epoch's index + 1)."},
        {Kind::attribute, kSummary, "final_val_accuracy", "", "float", "an epoch completed",
         "The last epoch's `val_accuracy` (fraction 0–1)."},
        {Kind::attribute, kSummary, "final_val_loss", "", "float", "an epoch completed",
         "The last epoch's `val_loss`."},
        {Kind::attribute, kSummary, "final_val_perplexity", "", "float", "an epoch completed",
         "The last epoch's `val_perplexity`."},
        {Kind::attribute, kSummary, "final_train_loss", "", "float", "an epoch completed",
         "The last epoch's `train_loss`."},
        {Kind::attribute, kSummary, "flushes", "", "int", "",
         "Run-file flushes (and status changes) this run made, each a collective write of the "
         "buffered rows (`output.flush_every`)."},
        {Kind::attribute, kSummary, "flush_syncs", "", "int", "",
         "Of them, those that synced the file to disk (`output.sync_every_s`)."},
        {Kind::attribute, kSummary, "flush_total_s", "", "float", "",
         "The flushes' own work (after every rank has entered the flush's first collective: the "
         "reduction, metadata, this rank's writes, syncs), summed up to the last flush before "
         "`/summary` was written: the largest over ranks. The tool's own I/O cost, outside every "
         "phase timer."},
        {Kind::attribute, kSummary, "flush_max_s", "", "float", "",
         "The longest single flush's own work on any rank."},
        {Kind::attribute, kSummary, "flush_mean_s", "", "float", "",
         "`flush_total_s` ÷ `flushes`."},
        {Kind::attribute, kSummary, "flush_sync_total_s", "", "float", "",
         "Of `flush_total_s`'s kind, the flushes that synced the file (an fsync on every rank, "
         "HDF5's metadata writes, agreements: once per `output.sync_every_s`, at the start and "
         "at status changes), summed: the largest over ranks. The others' mean is "
         "(`flush_total_s` − this) ÷ (`flushes` − `flush_syncs`) on that rank."},
        {Kind::attribute, kSummary, "flush_wait_total_s", "", "float", "",
         "Time ranks spent in the flushes waiting for the other ranks to arrive (skew from the "
         "iterations before them, which lock-step training would otherwise absorb in its next "
         "collective), summed: the largest over ranks. Not part of `flush_total_s`."},
        {Kind::attribute, kSummary, "nonfinite_skipped_steps", "", "int", "",
         "Steps dropped by `run.nonfinite=skip` in this file's iterations."},
        {Kind::attribute, kSummary, "host_syncs_per_iteration", "", "float", "",
         "The harness's device-to-host reads per measured iteration (`/iterations/host_syncs`), "
         "the largest over ranks."},
        {Kind::group, kComm, "", "", "", "",
         "Communication accounting, with nccl-tests' conventions: **algbw** = bytes ÷ time (GB/s, "
         "1 GB = 10^9 B); **busbw** = algbw × a factor that makes figures comparable across rank "
         "counts n: allreduce 2(n−1)/n, allgather and reduce-scatter (n−1)/n, broadcast 1. "
         "`bytes` is the whole array as nccl-tests count it: allreduce and broadcast the buffer, "
         "allgather the gathered output, reduce-scatter the input (all ranks' blocks). The "
         "communication benchmark (`run.workload=comm`, options `comm.*`) writes one group per "
         "operation (`/comm/<op>`) and this group's attributes. The gradient communication of "
         "training runs appears per iteration as `/iterations` columns (`comm_bytes`, "
         "`comm_collective_s`, `comm_wait_s`) and per bucket in `/comm/buckets`. Absent from runs "
         "that have neither."},
        {Kind::attribute, kComm, "backend", "", "str", "run.workload=comm",
         "Communication backend, `mpi` or `nccl`."},
        {Kind::attribute, kComm, "world_size", "", "int", "run.workload=comm",
         "Ranks taking part (n)."},
        {Kind::attribute, kComm, "allreduce", "", "str", "run.workload=comm",
         "How the measured allreduces ran, as `/plan@allreduce`: `flat`, `hierarchical` or "
         "`nccl`."},
        {Kind::attribute, kComm, "dtype", "", "str", "run.workload=comm",
         "Element type (`comm.dtype`)."},
        {Kind::attribute, kComm, "warmup", "", "int", "run.workload=comm",
         "Untimed operations per size (`comm.warmup`)."},
        {Kind::attribute, kComm, "iters", "", "int", "run.workload=comm",
         "Timed operations per size (`comm.iters`)."},
        {Kind::attribute, kComm, "time", "", "str", "run.workload=comm",
         "The definition of `time_s` / `time_max_s`, as text."},
        {Kind::attribute, kComm, "bytes", "", "str", "run.workload=comm",
         "The definition of `bytes`, as text."},
        {Kind::series, kCommBuckets, "", "", "", "gradient buckets",
         "Gradient communication per bucket, written by the Recorder like `/iterations` and "
         "flushed with it, in training runs whose gradient synchronizer has buckets: a per-rank "
         "series group [world_size, iterations] with one column per bucket of the rank with the "
         "most buckets (pipeline stages hold different parameters and so different bucket counts; "
         "a rank's extra columns stay NaN), plus the dataset `bytes`."},
        {Kind::attribute, kCommBuckets, "columns", "", "str", "",
         "Column names in the writer's order, comma-separated."},
        {Kind::attribute, kCommBuckets, "rows", "", "int", "", kSeriesRowsMeaning},
        {Kind::per_rank, "/comm/buckets/rank_rows", "", "1", "int64", "gradient buckets",
         kRankRowsMeaning},
        {Kind::per_rank, "/comm/buckets/ranks", "", "1", "int64", "gradient buckets",
         kRanksMeaning},
        {Kind::column, kCommBuckets, "bucket_{k}_s", "s", "", "",
         "Bucket k's allreduce (0-based, in launch order) in that iteration: its own duration, "
         "measured on the MPI backend's progress thread or between CUDA events on NCCL's stream."},
        {Kind::vector, kCommBucketsBytes, "", "B", "", "gradient buckets",
         "Payload per bucket in launch order, float64 [buckets] (rank 0's values)."},
        {Kind::group, kCommOp, "", "", "", "run.workload=comm",
         "Communication benchmark results of one operation `<op>` of `comm.ops`: `allreduce`, "
         "`allgather`, `reduce_scatter` or `broadcast`. Sizes run from `comm.min_bytes`, "
         "×`comm.factor`, … ≤ `comm.max_bytes`, rounded down to whole elements (`comm.dtype`), "
         "and for allgather / reduce-scatter to a multiple of n so each rank owns `count / n` "
         "elements; a size with less than one element per rank is skipped. Each operation is "
         "first warmed up at the largest and the smallest size (as nccl-tests do); per size: "
         "`comm.warmup` untimed operations, a barrier, `comm.iters` operations back to back; a "
         "rank's time is its mean per operation; `time_s` is the mean over ranks (nccl-tests' "
         "default), `time_max_s` the slowest rank's. Its datasets are 1-D float64 [sizes], "
         "identical on every rank (rank 0 writes them)."},
        {Kind::attribute, kCommOp, "busbw_factor", "", "float", "run.workload=comm",
         "busbw ÷ algbw for this operation at n ranks: allreduce 2(n−1)/n, allgather and "
         "reduce-scatter (n−1)/n, broadcast 1."},
        {Kind::vector, kCommOpBytes, "", "B", "", "run.workload=comm",
         "Array size, after rounding."},
        {Kind::vector, kCommOpCount, "", "1", "", "run.workload=comm", "Elements of that array."},
        {Kind::vector, kCommOpTimeS, "", "s", "", "run.workload=comm",
         "Seconds per operation, mean over ranks."},
        {Kind::vector, kCommOpTimeMaxS, "", "s", "", "run.workload=comm",
         "The slowest rank's seconds per operation."},
        {Kind::vector, kCommOpAlgbwGBps, "", "GB/s", "", "run.workload=comm",
         "`bytes / time_s / 1e9`."},
        {Kind::vector, kCommOpBusbwGBps, "", "GB/s", "", "run.workload=comm",
         "`algbw_GBps × busbw_factor`."},
        {Kind::series, kTelemetry, "", "", "", "telemetry.enabled=true",
         "Sampled counters, a per-rank series group [world_size, n_sample] written when "
         "`telemetry.enabled=true` (default): a background thread on every rank samples every "
         "`telemetry.interval_ms` (default 500), plus one sample when sampling starts and one "
         "when it stops, so ranks usually hold different row counts (`rank_rows`). GPU counters "
         "come from NVML, loaded at run time; where it is missing (no driver, CPU run) the GPU "
         "columns are NaN and the attributes say why."},
        {Kind::attribute, kTelemetry, "columns", "", "str", "",
         "Column names in the writer's order, comma-separated."},
        {Kind::attribute, kTelemetry, "rows", "", "int", "", kSeriesRowsMeaning},
        {Kind::per_rank, "/telemetry/rank_rows", "", "1", "int64", "telemetry.enabled=true",
         kRankRowsMeaning},
        {Kind::per_rank, "/telemetry/ranks", "", "1", "int64", "telemetry.enabled=true",
         kRanksMeaning},
        {Kind::attribute, kTelemetry, "gpu_available", "", "int", "",
         "1 if every rank sampled its GPU through NVML, else 0."},
        {Kind::attribute, kTelemetry, "gpu_available_ranks", "", "int", "",
         "Number of ranks that did."},
        {Kind::attribute, kTelemetry, "reason", "", "str", "",
         "Why GPU telemetry is missing, for the lowest such rank, e.g. `rank 0: CPU run: no CUDA "
         "device bound to this rank` or `rank 1: libnvidia-ml.so.1 not loadable ...`; empty when "
         "available everywhere."},
        {Kind::attribute, kTelemetry, "interval_ms", "", "int", "", "The sampling period."},
        {Kind::attribute, kTelemetry, "gpu_name", "", "str", "",
         "NVML's name of rank 0's GPU (empty without NVML)."},
        {Kind::attribute, kTelemetry, "nvml_device_match", "", "str", "",
         "How rank 0's GPU was found: `pci_bus_id` (robust to `CUDA_VISIBLE_DEVICES`) or `index`."},
        {Kind::attribute, kTelemetry, "clock", "", "str", "",
         "A reminder of the time base of `t_s`."},
        {Kind::column, kTelemetry, "t_s", "s", "", "",
         "Sample time on the run clock of `/iterations/t_start` (per rank, steady clock)."},
        {Kind::column, kTelemetry, "cpu_percent", "percent", "", "",
         "Process CPU time (user + system) / wall time since the previous sample, in % of one "
         "core (0 .. 100 x cores); NaN for the first sample."},
        {Kind::column, kTelemetry, "rss_bytes", "B", "", "",
         "Resident set size of the rank's process."},
        {Kind::column, kTelemetry, "load1", "1", "", "", "1-minute load average of the node."},
        {Kind::column, kTelemetry, "power_w", "W", "", "",
         "`nvmlDeviceGetPowerUsage`: board power, averaged by the driver (1 s on H100)."},
        {Kind::column, kTelemetry, "power_instant_w", "W", "", "",
         "NVML field 186 (instant power), where the driver offers it."},
        {Kind::column, kTelemetry, "energy_j", "J", "", "",
         "GPU energy counter (`nvmlDeviceGetTotalEnergyConsumption`) minus its value at the "
         "rank's first sample."},
        {Kind::column, kTelemetry, "gpu_util_percent", "percent", "", "",
         "`nvmlDeviceGetUtilizationRates`: time a kernel ran in the driver's last period."},
        {Kind::column, kTelemetry, "mem_util_percent", "percent", "", "",
         "`nvmlDeviceGetUtilizationRates`: time device memory was accessed in the driver's last "
         "period."},
        {Kind::column, kTelemetry, "sm_clock_mhz", "MHz", "", "", "Current SM clock."},
        {Kind::column, kTelemetry, "temperature_c", "degC", "", "", "GPU temperature."},
        {Kind::column, kTelemetry, "gpu_mem_used_bytes", "B", "", "",
         "Device memory in use (all processes on the GPU)."},
        {Kind::column, kTelemetry, "pcie_tx_bytes_per_s", "B/s", "", "",
         "`nvmlDeviceGetPcieThroughput`, transmitted (20 ms window)."},
        {Kind::column, kTelemetry, "pcie_rx_bytes_per_s", "B/s", "", "",
         "`nvmlDeviceGetPcieThroughput`, received (20 ms window)."},
        {Kind::column, kTelemetry, "nvlink_tx_bytes_per_s", "B/s", "", "",
         "NVLink data transmitted over all links between consecutive samples (field 138); NaN for "
         "the first sample."},
        {Kind::column, kTelemetry, "nvlink_rx_bytes_per_s", "B/s", "", "",
         "NVLink data received over all links between consecutive samples (field 139); NaN for "
         "the first sample."},
        {Kind::group, kProfile, "", "", "", "run.workload=cv or llm",
         "The profiler window (`profile.enabled=true`): LibTorch's Kineto profiler records "
         "iterations `profile.start_iter` … `start_iter + profile.iters − 1` (0-based, counted "
         "over all epochs), each inside a `ProfilerStep#<iteration>` user scope, with CPU "
         "activities (+ CUDA, and CUDA synchronization events, on GPU runs). Only the thread "
         "running the training loop (and autograd's device threads) is profiled: the data "
         "loader's worker threads are not. Per-rank summaries of the window: per-rank values, "
         "per-rank tables and the HTA breakdown. A run without the window has only the attribute "
         "`/profile@enabled = 0`."},
        {Kind::attribute, kProfile, "enabled", "", "int", "",
         "1 with the profiler window (`profile.enabled`), else 0."},
        {Kind::attribute, kProfile, "start_iter", "", "int", "profile.enabled=true",
         "`profile.start_iter`: the window's first iteration."},
        {Kind::attribute, kProfile, "iters", "", "int", "profile.enabled=true",
         "`profile.iters`: iterations in the window."},
        {Kind::attribute, kProfile, "top_n", "", "int", "profile.enabled=true",
         "`profile.top_n`: rows of `top_ops` and `top_kernels`."},
        {Kind::attribute, kProfile, "trace", "", "int", "profile.enabled=true",
         "1 when Chrome traces were written (`profile.trace`), else 0."},
        {Kind::attribute, kProfile, "status", "", "str", "profile.enabled=true",
         "`complete`; `incomplete`: the run ended inside the window; `not_reached`: it ended "
         "before `start_iter` (rank 0's)."},
        {Kind::attribute, kProfile, "first_iteration", "", "int", "profile.enabled=true",
         "The first iteration profiled, −1 when the window was not reached."},
        {Kind::attribute, kProfile, "trace_files", "", "str", "profile.enabled=true",
         "JSON list of the ranks' Chrome traces, `[]` without `profile.trace`; each is `<run file "
         "stem>.rank<R>.trace.json` beside the run file, with `distributedInfo` metadata "
         "`{\"backend\": ..., \"rank\": R, \"world_size\": W}` for HTA and Perfetto."},
        {Kind::attribute, kProfile, "threads", "", "str", "profile.enabled=true",
         "Which threads were profiled, as text."},
        {Kind::per_rank, kProfileWindowS, "", "s", "", "profile.enabled=true",
         "Host wall time from enabling to disabling the profiler (NaN when not reached). Per-rank "
         "values are float64 [world_size], element r = rank r."},
        {Kind::per_rank, kProfileIterations, "", "iterations", "", "profile.enabled=true",
         "Iterations inside the window on that rank."},
        {Kind::per_rank, kProfileHostSyncCalls, "", "calls", "", "profile.enabled=true",
         "CUDA runtime calls in the window that blocked the host until the device caught up "
         "(`cudaStreamSynchronize`, `cudaDeviceSynchronize`, `cudaEventSynchronize`, synchronous "
         "`cudaMemcpy*`/`cudaMemset*`; `.item()` counts once); ÷ `iterations` gives the "
         "profiler's synchronisations per iteration, to compare with `/iterations/host_syncs` "
         "(the harness's own reads). 0 on CPU runs."},
        {Kind::table, kProfileCategories, "", "", "", "profile.enabled=true",
         "A per-rank table in the variable-length layout: one global 1-D dataset per column "
         "holding the ranks' rows back to back in rank order, plus two int64 [world_size] indexes "
         "`<column>_offset` and `<column>_count` (units `1`): rank r's values are `X[X_offset[r] "
         ": X_offset[r] + X_count[r]]`. The `name` column is fixed-length UTF-8 strings "
         "NUL-padded to the longest name (h5py: `ds.asstr()[...]`), units `text`. One row per "
         "category, sorted by name. Categories: `cpu_op` (every CPU operator, inclusive: nested "
         "operators also count in their parents), `cpu_op_top_level` (operators not nested in "
         "another one on their thread: their total fits in `window_s`), `profiler_step` (the "
         "window's iterations), `user_annotation`, `gpu_kernel`, `nccl_kernel`, `memcpy_htod`, "
         "`memcpy_dtoh`, `memcpy_dtod`, `memcpy_other`, `memset`, `cuda_runtime:<call>` (e.g. "
         "`cuda_runtime:cudaLaunchKernel`, `cuda_runtime:cudaMemcpyAsync`, "
         "`cuda_runtime:cudaStreamSynchronize`), `cuda_driver:<call>`, `cuda_sync`. On CPU runs "
         "only the operator categories appear."},
        {Kind::column, kProfileCategories, "name", "text", "", "", "The category."},
        {Kind::column, kProfileCategories, "count", "events", "", "",
         "Events of the category in the window."},
        {Kind::column, kProfileCategories, "total_s", "s", "", "",
         "Their total duration (operators: inclusive)."},
        {Kind::column, kProfileCategories, "min_s", "s", "", "", "The shortest event."},
        {Kind::column, kProfileCategories, "max_s", "s", "", "", "The longest event."},
        {Kind::table, kProfileTopOps, "", "", "", "profile.enabled=true",
         "A per-rank table in the variable-length layout: one global 1-D dataset per column "
         "holding the ranks' rows back to back in rank order, plus two int64 [world_size] indexes "
         "`<column>_offset` and `<column>_count` (units `1`): rank r's values are `X[X_offset[r] "
         ": X_offset[r] + X_count[r]]`. The `name` column is fixed-length UTF-8 strings "
         "NUL-padded to the longest name (h5py: `ds.asstr()[...]`), units `text`. The "
         "`profile.top_n` CPU operators with the largest total time, descending. Convolutions "
         "appear as `aten::convolution` (forward), `ConvolutionBackward0` (autograd node) and "
         "`aten::convolution_backward`."},
        {Kind::column, kProfileTopOps, "name", "text", "", "",
         "The operator, e.g. `aten::convolution`."},
        {Kind::column, kProfileTopOps, "count", "events", "", "", "Calls in the window."},
        {Kind::column, kProfileTopOps, "total_s", "s", "", "",
         "Total time, inclusive of nested operators."},
        {Kind::column, kProfileTopOps, "self_s", "s", "", "",
         "Total time excluding directly nested operators."},
        {Kind::table, kProfileTopKernels, "", "", "", "profile.enabled=true",
         "A per-rank table in the variable-length layout: one global 1-D dataset per column "
         "holding the ranks' rows back to back in rank order, plus two int64 [world_size] indexes "
         "`<column>_offset` and `<column>_count` (units `1`): rank r's values are `X[X_offset[r] "
         ": X_offset[r] + X_count[r]]`. The `name` column is fixed-length UTF-8 strings "
         "NUL-padded to the longest name (h5py: `ds.asstr()[...]`), units `text`. The "
         "`profile.top_n` GPU kernels (NCCL's too) with the largest total time."},
        {Kind::column, kProfileTopKernels, "name", "text", "", "", "The kernel."},
        {Kind::column, kProfileTopKernels, "count", "events", "", "", "Launches in the window."},
        {Kind::column, kProfileTopKernels, "total_s", "s", "", "", "Total time."},
        {Kind::group, kProfileBreakdown, "", "", "", "profile.enabled=true",
         "The window's temporal breakdown per rank, following Holistic Trace Analysis: kernel "
         "classes communication (`^nccl` or contains `ncclKernel`), memory (memcpy, memset, names "
         "with `Memcpy`/`Memset`/`dma`), compute (the rest); HTA's \"non-compute\" is "
         "`communication_s + memory_s`. Without GPU kernels (CPU runs) every time is NaN, never "
         "zero. Per-rank values, float64 [world_size] (element r = rank r)."},
        {Kind::attribute, kProfileBreakdown, "gpu_kernels", "", "int", "",
         "Rank 0's count of GPU kernels in the window (per rank: the dataset `gpu_kernels`)."},
        {Kind::attribute, kProfileBreakdown, "definition", "", "str", "",
         "The breakdown's definition, as text."},
        {Kind::per_rank, kProfileBreakdownGpuKernels, "", "kernels", "", "profile.enabled=true",
         "GPU kernels in the window (0 on CPU runs)."},
        {Kind::per_rank, kProfileBreakdownComputeS, "", "s", "", "profile.enabled=true",
         "Time at least one compute kernel ran."},
        {Kind::per_rank, kProfileBreakdownCommunicationS, "", "s", "", "profile.enabled=true",
         "Time a communication (NCCL) kernel ran and no compute kernel."},
        {Kind::per_rank, kProfileBreakdownMemoryS, "", "s", "", "profile.enabled=true",
         "Time only memcpy/memset ran."},
        {Kind::per_rank, kProfileBreakdownIdleS, "", "s", "", "profile.enabled=true",
         "Time no device activity ran, inside the span."},
        {Kind::per_rank, kProfileBreakdownSpanS, "", "s", "", "profile.enabled=true",
         "Last device end − first device start; compute, communication, memory and idle add up to "
         "it."},
        {Kind::per_rank, kProfileBreakdownOverlapRatio, "", "1", "", "profile.enabled=true",
         "Time computing while communicating ÷ time communicating (NaN without communication)."},
    };
    return t;
}

} // namespace trainscope::io::schema
