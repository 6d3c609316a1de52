// Summary statistics: percentiles (numpy "linear"), imbalance and stragglers across ranks, the GPU
// peak table behind MFU, and the text table rank 0 prints at the end of a run.
#include "trainscope/prof/statistics.hpp"

#include "trainscope/core/numeric.hpp"
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <sstream>

namespace trainscope::prof::stats {
namespace {

using core::kNaN;

std::size_t common_length(const RankMatrix& m) {
    if (m.empty()) return 0;
    std::size_t n = m.front().size();
    for (const auto& row : m)
        n = std::min(n, row.size());
    return n;
}

// Upper-case alphanumeric tokens: "NVIDIA A100-SXM4-40GB" -> NVIDIA, A100, SXM4, 40GB.
std::vector<std::string> tokens(const std::string& s) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : s) {
        if (std::isalnum(static_cast<unsigned char>(c))) {
            cur.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
        } else if (!cur.empty()) {
            out.push_back(cur);
            cur.clear();
        }
    }
    if (!cur.empty()) out.push_back(cur);
    return out;
}

// Dense tensor-core peaks (datasheet sparse figures halved), TFLOP/s.
constexpr DevicePeak kH100Sxm{"H100 SXM", 989.5, 989.5, 494.5, 67.0, 67.0};
constexpr DevicePeak kH100Pcie{"H100 PCIe", 756.5, 756.5, 378.0, 51.0, 51.0};
constexpr DevicePeak kH200Sxm{"H200 SXM", 989.5, 989.5, 494.5, 67.0, 67.0};
constexpr DevicePeak kA100Sxm{"A100 SXM", 312.0, 312.0, 156.0, 19.5, 19.5};
constexpr DevicePeak kA100Pcie{"A100 PCIe", 312.0, 312.0, 156.0, 19.5, 19.5};

std::string fixed(double v, int precision) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.*f", precision, v);
    return buf;
}

} // namespace

double percentile(std::vector<double> v, double q) {
    v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
    if (v.empty() || !(q >= 0 && q <= 100)) return kNaN;
    std::sort(v.begin(), v.end());
    const double h = static_cast<double>(v.size() - 1) * q / 100.0;
    const auto lo = static_cast<std::size_t>(std::floor(h));
    const std::size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (h - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

double median(const std::vector<double>& v) {
    return percentile(v, 50);
}

double p95(const std::vector<double>& v) {
    return percentile(v, 95);
}

double mean(const std::vector<double>& v) {
    double sum = 0;
    std::size_t n = 0;
    for (double x : v)
        if (!std::isnan(x)) sum += x, ++n;
    return n ? sum / static_cast<double>(n) : kNaN;
}

std::vector<double> mean_over_ranks(const RankMatrix& m) {
    const std::size_t n = common_length(m);
    std::vector<double> out(n, 0.0);
    for (std::size_t i = 0; i < n; ++i) {
        for (const auto& row : m)
            out[i] += row[i];
        out[i] /= static_cast<double>(m.size());
    }
    return out;
}

std::vector<double> imbalance_per_iteration(const RankMatrix& m) {
    const std::size_t n = common_length(m);
    std::vector<double> out(n, kNaN);
    for (std::size_t i = 0; i < n; ++i) {
        double sum = 0, mx = -std::numeric_limits<double>::infinity();
        for (const auto& row : m)
            sum += row[i], mx = std::max(mx, row[i]);
        const double avg = sum / static_cast<double>(m.size());
        if (avg > 0) out[i] = mx / avg;
    }
    return out;
}

Stragglers find_stragglers(const RankMatrix& m, double threshold) {
    Stragglers s;
    s.threshold = threshold;
    const std::size_t n = common_length(m);
    s.rank_mean.assign(m.size(), kNaN);
    s.slowest_count.assign(m.size(), 0);
    if (n == 0) return s;
    for (std::size_t r = 0; r < m.size(); ++r)
        s.rank_mean[r] =
            std::accumulate(m[r].begin(), m[r].begin() + static_cast<std::ptrdiff_t>(n), 0.0) /
            static_cast<double>(n);
    for (std::size_t i = 0; i < n; ++i) {
        std::size_t slowest = 0;
        for (std::size_t r = 1; r < m.size(); ++r)
            if (m[r][i] > m[slowest][i]) slowest = r; // ties go to the lowest rank
        ++s.slowest_count[slowest];
    }
    const double overall = mean(s.rank_mean);
    for (std::size_t r = 0; r < m.size(); ++r)
        if (overall > 0 && s.rank_mean[r] > overall * (1.0 + threshold))
            s.ranks.push_back(static_cast<int>(r));
    return s;
}

std::optional<DevicePeak> device_peak(const std::string& device_name) {
    const std::vector<std::string> t = tokens(device_name);
    auto has = [&](const char* w) { return std::find(t.begin(), t.end(), w) != t.end(); };
    auto has_prefix = [&](const char* p) {
        return std::any_of(t.begin(), t.end(),
                           [&](const std::string& x) { return x.rfind(p, 0) == 0; });
    };
    // NVL and other variants have different clocks/power: unknown rather than a neighbour's peak.
    if (has("NVL")) return std::nullopt;
    if (has("H100")) {
        if (has("PCIE")) return kH100Pcie;
        if (has_prefix("SXM") || has("HBM3")) return kH100Sxm;
        return std::nullopt;
    }
    if (has("H200")) {
        if (has("PCIE")) return std::nullopt;
        return kH200Sxm; // "NVIDIA H200" is the SXM board
    }
    if (has("A100")) {
        if (has("PCIE")) return kA100Pcie;
        if (has_prefix("SXM")) return kA100Sxm;
        return std::nullopt;
    }
    return std::nullopt;
}

std::optional<PrecisionMath> precision_math(const std::string& run_precision) {
    // The run.precision names of train/precision.cpp (prof does not depend on train).
    struct Entry {
        const char* name;
        PrecisionMath math;
    };
    static const Entry kTable[] = {
        {"fp64", {PeakMath::FP64, "fp64 tensor cores"}},
        {"fp32", {PeakMath::FP32, "fp32 CUDA cores (no tensor cores)"}},
        {"tf32", {PeakMath::TF32, "tf32 tensor cores"}},
        {"fp16-mixed", {PeakMath::FP16, "fp16 tensor cores (autocast)"}},
        {"bf16-mixed", {PeakMath::BF16, "bf16 tensor cores (autocast)"}},
        {"bf16", {PeakMath::BF16, "bf16 tensor cores"}},
    };
    for (const Entry& e : kTable)
        if (run_precision == e.name) return e.math;
    return std::nullopt;
}

std::optional<double> peak_flops(const std::string& device_name, const std::string& precision) {
    const auto p = device_peak(device_name);
    const auto m = precision_math(precision);
    if (!p || !m) return std::nullopt;
    double tflops = 0;
    switch (m->math) {
    case PeakMath::BF16:
        tflops = p->bf16_tflops;
        break;
    case PeakMath::FP16:
        tflops = p->fp16_tflops;
        break;
    case PeakMath::TF32:
        tflops = p->tf32_tflops;
        break;
    case PeakMath::FP32:
        tflops = p->fp32_tflops;
        break;
    case PeakMath::FP64:
        tflops = p->fp64_tflops;
        break;
    }
    return tflops * 1e12;
}

double training_flops_per_sample(double forward_macs) {
    return 6.0 * forward_macs;
}

std::optional<double> model_flops_utilization(double flops_per_s_per_device,
                                              const std::string& device_name,
                                              const std::string& precision) {
    const auto peak = peak_flops(device_name, precision);
    if (!peak || !(flops_per_s_per_device >= 0)) return std::nullopt;
    return flops_per_s_per_device / *peak;
}

std::string format_summary_table(const SummaryReport& r) {
    std::ostringstream o;
    auto row = [&](const std::string& label, const std::string& value) {
        std::string l = label;
        l.resize(std::max<std::size_t>(l.size(), 28), ' ');
        o << "  " << l << value << "\n";
    };
    o << "summary over " << r.measured_iterations << " measured iterations (" << r.warmup_iterations
      << " warm-up excluded), " << r.world_size << " rank(s)\n";
    if (!r.warning.empty()) o << "  WARNING: " << r.warning << "\n";
    // Columns: name left-aligned in 14, median right-aligned in 13, p95 right-aligned in 11.
    auto phase_row = [&](std::string name, const std::string& med, const std::string& q) {
        name.resize(std::max<std::size_t>(name.size(), 14), ' ');
        o << "  " << name << std::string(med.size() < 13 ? 13 - med.size() : 1, ' ') << med
          << std::string(q.size() < 11 ? 11 - q.size() : 1, ' ') << q << "\n";
    };
    phase_row("phase", "median ms", "p95 ms");
    for (const PhaseSummary& p : r.phases)
        phase_row(p.name, fixed(p.median_s * 1e3, 2), fixed(p.p95_s * 1e3, 2));
    row("throughput", fixed(r.throughput_samples_per_s, 1) + " samples/s" +
                          (r.throughput_tokens_per_s >= 0
                               ? ", " + fixed(r.throughput_tokens_per_s, 0) + " tokens/s"
                               : ""));
    row("imbalance (max/mean)",
        "median " + fixed(r.imbalance_median, 3) + ", p95 " + fixed(r.imbalance_p95, 3));
    std::string strag;
    for (int s : r.stragglers)
        strag += (strag.empty() ? "" : ", ") + std::to_string(s);
    row("stragglers", strag.empty() ? "none" : "rank " + strag);
    // Name the peak the fraction is of: under bf16-mixed it is the bf16 tensor-core peak, which a
    // reader could not guess from "bf16-mixed" alone.
    const auto math = precision_math(r.precision);
    const auto peak = peak_flops(r.device_name, r.precision);
    if (r.mfu && math && peak)
        row("MFU", fixed(*r.mfu * 100.0, 1) + " % of " + fixed(*peak / 1e12, 1) + " TFLOP/s, " +
                       math->basis + " (" + r.device_name + ", " + r.precision + ")");
    else
        row("MFU", "n/a (no peak known for '" + r.device_name + "', " + r.precision + ")");
    if (r.energy_j >= 0)
        row("GPU energy", fixed(r.energy_j, 1) + " J; " + fixed(r.energy_per_iteration_j, 3) +
                              " J/iteration, " + fixed(r.energy_per_sample_j * 1e3, 3) +
                              " mJ/sample");
    else
        row("GPU energy", "n/a (no NVML energy counter)");
    row("peak host RSS", fixed(r.peak_host_rss_bytes / (1024.0 * 1024.0), 1) + " MiB");
    if (r.peak_host_tensor_bytes >= 0)
        row("peak host tensors", fixed(r.peak_host_tensor_bytes / (1024.0 * 1024.0), 1) + " MiB");
    if (r.peak_device_bytes >= 0)
        row("peak device allocated", fixed(r.peak_device_bytes / (1024.0 * 1024.0), 1) + " MiB");
    std::string s = o.str();
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
}

} // namespace trainscope::prof::stats
