// Device binding: which torch::Device this rank computes on, plus what the run file records about
// it (device name, PCI bus id, the CPU cores the process may run on).
#pragma once

#include <torch/types.h>

#include <mpi.h>

#include <string>
#include <vector>

#include "trainscope/distributed/topology.hpp"

namespace trainscope::dist {

struct DeviceBinding {
    torch::Device device{torch::kCPU};
    std::string name;         // "cpu" or the GPU's name
    std::string pci_bus_id;   // "" on CPU, else cudaDeviceGetPCIBusId, e.g. "0000:41:00.0"
    std::string cpu_affinity; // sched_getaffinity as a list, e.g. "0-3,8"
    // Notes for the log (the same on every rank, "" when there is nothing to say): ranks sharing
    // a GPU under the MPI backend; GPUs a node's ranks see but none uses.
    std::string shared, idle;
};

// CUDA devices this process can see (0 in builds without CUDA or without a driver/GPU).
int cuda_device_count();
// Why cuda_device_count() is 0, in words: "built without CUDA", or the CUDA runtime's own error
// from cudaGetDeviceCount (no driver, insufficient driver, no device, ...). "" when it is not 0.
std::string cuda_unavailable_reason();
// Bytes of one cuBLAS workspace on `device` as LibTorch sizes it (at::cuda::getChosenWorkspaceSize:
// CUBLAS_WORKSPACE_CONFIG, else 32 MiB from Hopper on, ~8 MiB before). LibTorch allocates one per
// (thread, stream) that runs a matmul, through the caching allocator, so they count in the
// device's allocated bytes. 0 for a non-CUDA device.
double cublas_workspace_bytes(const torch::Device& device);

// What one rank sees: its node, its node-local rank, the PCI bus ids of the GPUs visible to it in
// CUDA's order, and whether it computes on a GPU (run.device resolved to cuda). Per-task binding
// (srun --gpus-per-task=1, --gpu-bind, a CUDA_VISIBLE_DEVICES per rank) gives each rank its own
// list; a plain launch gives every rank of a node the same one.
struct RankGpus {
    std::string host;
    int local_rank = 0;
    std::vector<std::string> pci_bus_ids;
    bool cuda = true;
};
// The device choice of every rank, from what all ranks see (no MPI, no CUDA: unit tests fake it).
// index[r] = local_rank % (GPUs rank r sees), into rank r's own list; -1 for a CPU rank or a rank
// that sees no GPU (bind_device refuses the latter on that rank). Distinct GPUs are counted by PCI
// bus id across a node's ranks, never by how many devices one rank sees.
// error (refuse on every rank): some ranks compute on cuda and others on cpu; or, with NCCL, two
//   ranks of one node chose the same bus id (naming both ranks, the bus id and the fix).
// shared: the same two ranks under the MPI backend, where sharing is allowed (one-GPU tests).
// idle: a node whose ranks see GPUs that none of them uses (its name, the counts, the bus ids).
struct GpuAssignment {
    std::vector<int> index;
    std::string error, shared, idle;
};
GpuAssignment assign_gpus(const std::vector<RankGpus>& ranks, bool nccl_backend);

// Collective over `world` (every rank calls it, whatever it requests: the ranks exchange what
// they see before any of them can fail). requested: "cpu" or "cuda" (resolved, see
// resolve_options). "cuda" binds the GPU assign_gpus picks and makes it current. Throws
// ConfigError on the rank that sees no GPU, and on every rank for an assign_gpus error or
// dist.backend=nccl on the CPU.
DeviceBinding bind_device(const std::string& requested, const Topology& topo, bool nccl_backend,
                          MPI_Comm world);

// The CPU affinity mask of this process as a list string ("0-1", "0,2,4-7").
std::string cpu_affinity_string();

} // namespace trainscope::dist
