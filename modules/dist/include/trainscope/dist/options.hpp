// Options owned by the dist module (run.device, dist.backend, dist.bucket_mb; comm.* of the
// communication benchmark, read by CommBenchmarkOptions::from_config) and their resolution
// into concrete choices: "auto" becomes cpu/cuda and mpi/nccl, impossible combinations are
// ConfigErrors naming both keys.
#pragma once

#include <cstddef>
#include <string>

#include "trainscope/core/config.hpp"

namespace trainscope::dist {

void declare_options(core::OptionRegistry& registry);

struct DistOptions {
    std::string device;               // "cpu" | "cuda"
    std::string backend;              // "mpi" | "nccl"
    double bucket_mb = 25;            // MiB, as DDP's bucket_cap_mb
    std::size_t bucket_cap_bytes = 0; // bucket_mb * 2^20, at least 1
};

// Resolves the "auto" values. `visible_cuda_devices` is what this process sees (pass
// dist::cuda_device_count(); tests pass any number). Throws ConfigError for dist.backend=nccl with
// a CPU device, for NCCL in a build without NCCL, and for dist.bucket_mb <= 0.
DistOptions resolve_options(const core::Config& config, int visible_cuda_devices);

} // namespace trainscope::dist
