// Device binding: which torch::Device this rank computes on, plus what the run file records about
// it (device name, PCI bus id, the CPU cores the process may run on).
#pragma once

#include <torch/types.h>

#include <mpi.h>

#include <string>
#include <vector>

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
// Why cuda_device_count() is 0, in words: "built without CUDA", or the CUDA runtime's own error
// from cudaGetDeviceCount (no driver, insufficient driver, no device, ...). "" when it is not 0.
std::string cuda_unavailable_reason();

// What one rank sees: its node, its node-local rank, and the PCI bus ids of the GPUs visible to
// it, in CUDA's order (per-task binding such as srun --gpus-per-task=1 or --gpu-bind gives each
// rank its own list; a plain launch gives every rank of a node the same one).
struct RankGpus {
    std::string host;
    int local_rank = 0;
    std::vector<std::string> pci_bus_ids;
};
// The device choice of every rank: index[r] = local_rank % (GPUs rank r sees) into its own list.
// `error` is set (NCCL only) when two ranks of one node chose the same physical GPU (the same PCI
// bus id), naming both ranks, the bus id and the fix: NCCL cannot put two ranks on one GPU.
// `shared` notes the same for the MPI backend, where sharing is allowed (tests, one-GPU smoke
// runs). Distinct GPUs are counted by PCI bus id across the node's ranks, never by how many
// devices one rank sees.
struct GpuAssignment {
    std::vector<int> index;
    std::string error, shared;
};
GpuAssignment assign_gpus(const std::vector<RankGpus>& ranks, bool nccl_backend);

// Collective over `world`. requested: "cpu" or "cuda" (resolved, see resolve_options). "cuda"
// binds the device assign_gpus picks (cuda:(local_rank % visible GPUs)) and makes it current.
// Throws ConfigError when no GPU is visible, and with nccl_backend when two ranks of a node
// would share a GPU.
DeviceBinding bind_device(const std::string& requested, const Topology& topo, bool nccl_backend,
                          MPI_Comm world);

// The CPU affinity mask of this process as a list string ("0-1", "0,2,4-7").
std::string cpu_affinity_string();

} // namespace trainscope::dist
