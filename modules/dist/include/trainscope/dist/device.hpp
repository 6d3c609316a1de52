// Device binding: which torch::Device this rank computes on, plus what the run file records about
// it (device name, PCI bus id, the CPU cores the process may run on).
#pragma once

#include <torch/types.h>

#include <string>

#include "trainscope/dist/topology.hpp"

namespace trainscope::dist {

struct DeviceBinding {
    torch::Device device{torch::kCPU};
    std::string name;         // "cpu" or the GPU's name
    std::string pci_bus_id;   // "" on CPU, else cudaDeviceGetPCIBusId, e.g. "0000:41:00.0"
    std::string cpu_affinity; // sched_getaffinity as a list, e.g. "0-3,8"
};

// CUDA devices this process can see (0 in builds without CUDA or without a driver/GPU).
int cuda_device_count();

// requested: "cpu" or "cuda" (resolved, see resolve_options). "cuda" binds cuda:(local_rank % GPUs)
// and makes it the current device. Throws ConfigError when no GPU is visible, and with
// nccl_backend when more ranks share a node than it has GPUs (NCCL cannot put two ranks on one
// GPU).
DeviceBinding bind_device(const std::string& requested, const Topology& topo, bool nccl_backend);

// The CPU affinity mask of this process as a list string ("0-1", "0,2,4-7").
std::string cpu_affinity_string();

} // namespace trainscope::dist
