// scripts/bench nf4: bytes and time per dequantised weight of models::Nf4Tensor::dequantize (the
// compute dtype through int32 slices) against the former path (int64 indices, an fp32 table, an
// fp32 product, then the cast), on the weight shapes of Llama-3-8B's projections. Bytes: the host
// tensor counter's peak above the live tensors during one call (CPU). Time: the median of --reps
// calls after 3 warm-ups (1 intra-op thread unless OMP_NUM_THREADS says otherwise).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "../unit/nf4_reference.hpp"
#include "trainscope/models/nf4.hpp"
#include "trainscope/prof/memory.hpp"

namespace tsm = trainscope::models;
namespace prof = trainscope::prof;

namespace {

torch::Tensor former(const tsm::Nf4Tensor& q) {
    return trainscope::testing::nf4_dequantize_fp32_path(q);
}

struct Measure {
    double peak_bytes, seconds;
};

Measure measure(const std::function<torch::Tensor()>& f, int reps) {
    for (int i = 0; i < 3; ++i)
        f();
    const double base = prof::host_tensor_bytes().current;
    prof::reset_host_tensor_peak();
    { torch::Tensor keep = f(); }
    const double peak = prof::host_tensor_bytes().peak - base;
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        torch::Tensor out = f();
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
    return {peak, t[static_cast<std::size_t>(reps / 2)]};
}

} // namespace

int main(int argc, char** argv) {
    int reps = 9;
    for (int i = 1; i + 1 < argc; ++i)
        if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
    prof::install_host_tensor_counter();
    torch::manual_seed(0);
    std::printf("NF4 dequantisation per weight (Llama-3-8B projection shapes, CPU, %d thread(s))\n",
                torch::get_num_threads());
    std::printf("  %-22s %-5s %14s %14s %12s %12s %8s\n", "shape [out, in]", "dtype", "former B/w",
                "now B/w", "former ns/w", "now ns/w", "speed-up");
    const std::vector<std::vector<std::int64_t>> shapes = {
        {4096, 4096}, {1024, 4096}, {14336, 4096}};
    for (const auto& shape : shapes)
        for (const auto dtype : {torch::kBFloat16, torch::kFloat32}) {
            const auto q = tsm::Nf4Tensor::quantize(torch::randn(shape) * 0.02, dtype);
            const double n = static_cast<double>(q.numel());
            const Measure a = measure([&] { return former(q); }, reps);
            const Measure b = measure([&] { return q.dequantize(); }, reps);
            char name[32];
            std::snprintf(name, sizeof name, "[%lld, %lld]", static_cast<long long>(shape[0]),
                          static_cast<long long>(shape[1]));
            std::printf("  %-22s %-5s %14.2f %14.2f %12.3f %12.3f %7.2fx\n", name,
                        dtype == torch::kBFloat16 ? "bf16" : "fp32", a.peak_bytes / n,
                        b.peak_bytes / n, a.seconds / n * 1e9, b.seconds / n * 1e9,
                        a.seconds / b.seconds);
        }
    std::printf("  (B/w: peak tensor bytes per weight during one call, the result included: 2 for "
                "bf16, 4 for fp32)\n");
    return 0;
}
