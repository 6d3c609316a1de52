// Summary statistics of a run, as pure functions (no MPI): percentiles, imbalance across ranks,
// straggler ranks, model FLOP utilisation from a table of device peaks, and the rank-0 summary
// table. The recorder gathers the per-rank series and calls these, so /summary and the printed
// table come from one definition.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace trainscope::prof::stats {

// Percentile q in [0, 100] by linear interpolation between order statistics, numpy's default
// ("linear", method 7 of Hyndman & Fan): position h = (n-1)*q/100, value x[floor h] +
// (h - floor h) * (x[floor h + 1] - x[floor h]). NaNs are ignored; NaN for no finite value.
double percentile(std::vector<double> values, double q);
double median(const std::vector<double>& values); // percentile 50
double p95(const std::vector<double>& values);    // percentile 95
double mean(const std::vector<double>& values);   // NaNs ignored; NaN when empty

// [ranks x iterations], row r = rank r's series. Rows may differ in length: functions over
// iterations use the common prefix (the shortest row).
using RankMatrix = std::vector<std::vector<double>>;

// Per iteration: max over ranks / mean over ranks (1 = perfectly balanced). NaN for an iteration
// whose mean is not positive.
std::vector<double> imbalance_per_iteration(const RankMatrix& per_rank);
// Per iteration: the mean over ranks (the /summary convention for lock-stepped ranks).
std::vector<double> mean_over_ranks(const RankMatrix& per_rank);

struct Stragglers {
    std::vector<double> rank_mean;           // each rank's mean over the common iterations
    std::vector<std::int64_t> slowest_count; // iterations in which the rank was the slowest
    std::vector<int> ranks;                  // stragglers, ascending
    double threshold = 0.05;                 // relative excess that makes a straggler
};
// A straggler is a rank whose mean exceeds the mean of all ranks' means by more than `threshold`
// (5% by default). Pass *busy* time per iteration (step_s - comm_wait_s): ranks in lock-step all
// show the same step time, the straggler is the one that waits least. slowest_count is reported
// for context (with two ranks one of them is always "slowest"), not used to decide.
Stragglers find_stragglers(const RankMatrix& per_rank, double threshold = 0.05);

// Dense (no sparsity) peak throughput of one GPU in TFLOP/s, from NVIDIA's datasheets.
struct DevicePeak {
    const char* model;               // "H100 SXM", "H100 PCIe", "H200 SXM", "A100 SXM", "A100 PCIe"
    double bf16_tflops, fp16_tflops; // tensor cores
    double tf32_tflops;              // tensor cores
    double fp32_tflops;              // CUDA cores (no tensor cores)
    double fp64_tflops;              // tensor cores (DGEMM)
};
// Matches a CUDA/NVML device name (e.g. "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB",
// "NVIDIA H100 PCIe") by whole tokens. Anything not clearly one of the table's devices (H100 NVL,
// GH200, H800, A800, "cpu", ...) gives std::nullopt, never a neighbour's numbers.
std::optional<DevicePeak> device_peak(const std::string& device_name);
// The arithmetic a run.precision runs its matmuls and convolutions in, which is the peak MFU
// divides by. Mixed precisions keep fp32 weights but autocast runs the matmuls in the autocast
// dtype, so their peak is that dtype's tensor-core peak:
//   fp64 -> fp64 tensor cores (DGEMM)     fp32 -> fp32 CUDA cores (TF32 is switched off)
//   tf32 -> tf32 tensor cores             bf16 -> bf16 tensor cores (weights in bf16)
//   fp16-mixed -> fp16 tensor cores       bf16-mixed -> bf16 tensor cores (autocast)
enum class PeakMath { FP64, FP32, TF32, FP16, BF16 };
struct PrecisionMath {
    PeakMath math;
    const char* basis; // e.g. "bf16 tensor cores (autocast)": what the MFU is a fraction of
};
// nullopt for a name that is not a run.precision (e.g. "fp16", "int8").
std::optional<PrecisionMath> precision_math(const std::string& run_precision);
// Peak FLOP/s of a device for a run.precision ("fp64", "fp32", "tf32", "fp16-mixed",
// "bf16-mixed", "bf16"), or nullopt when the device or the precision is unknown.
std::optional<double> peak_flops(const std::string& device_name, const std::string& precision);
// Training FLOPs per sample for a model of `forward_macs` multiply-accumulates per sample: forward
// 2 FLOPs per MAC, backward twice the forward (the usual 6 x MACs, as in the PaLM MFU definition).
double training_flops_per_sample(double forward_macs);
// Model FLOP utilisation = achieved model FLOP/s of one device / that device's peak for the run
// precision (peak_flops), or nullopt when the device or precision is unknown.
std::optional<double> model_flops_utilization(double flops_per_s_per_device,
                                              const std::string& device_name,
                                              const std::string& precision);

// What rank 0 prints at the end (and what /summary holds): filled by the recorder.
struct PhaseSummary {
    std::string name; // "data", ..., "step"
    double median_s = 0;
    double p95_s = 0;
};
struct SummaryReport {
    int world_size = 1;
    std::int64_t measured_iterations = 0, warmup_iterations = 0;
    std::vector<PhaseSummary> phases; // in the order to print
    double throughput_samples_per_s = 0;
    double throughput_tokens_per_s = -1; // < 0: not a token workload, not printed
    double imbalance_median = 0;         // of imbalance_per_iteration(step_s)
    double imbalance_p95 = 0;
    std::vector<int> stragglers;
    std::string device_name;   // rank 0's
    std::string precision;     // run.precision; the MFU line names the peak it maps to
    std::optional<double> mfu; // fraction 0..1
    double energy_j = -1;      // over the measured iterations, all ranks; < 0: none
    double energy_per_iteration_j = -1;
    double energy_per_sample_j = -1;
    double peak_host_rss_bytes = 0;
    double peak_device_bytes = -1;      // < 0: CPU run
    double peak_host_tensor_bytes = -1; // < 0: host tensor counter not installed
    std::string warning;                // e.g. no measured iterations; printed after the title
};
// A fixed-width text table (no trailing newline), e.g.
//   phase        median ms     p95 ms
//   forward          12.34      13.01
std::string format_summary_table(const SummaryReport& report);

} // namespace trainscope::prof::stats
