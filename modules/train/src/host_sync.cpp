// The counter behind read_to_host (see host_sync.hpp).
#include "trainscope/train/host_sync.hpp"

#include <atomic>

namespace trainscope::train {
namespace {

std::atomic<std::int64_t> g_reads{0};

} // namespace

torch::Tensor read_to_host(const torch::Tensor& t) {
    g_reads.fetch_add(1, std::memory_order_relaxed);
    return t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
}

double read_scalar(const torch::Tensor& t) {
    return read_to_host(t.reshape({})).to(torch::kFloat64).item<double>();
}

std::int64_t host_syncs() {
    return g_reads.load(std::memory_order_relaxed);
}

} // namespace trainscope::train
