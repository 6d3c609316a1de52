// Device binding (see device.hpp): which device each rank computes on, and why CUDA is not there
// when it is not. A node's GPUs are told apart by PCI bus id across all of its ranks: per-task
// binding (srun --gpus-per-task=1, --gpu-bind, a CUDA_VISIBLE_DEVICES per rank) gives every rank
// its own one-device list, so one rank's device count cannot say whether ranks share a GPU.
// assign_gpus decides from faked lists in the unit tests; bind_device feeds it the real ones.
#include "trainscope/distributed/device.hpp"

#include <sched.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "trainscope/core/build_config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/mpi_util.hpp"

#if TRAINSCOPE_HAVE_CUDA
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace trainscope::dist {

int cuda_device_count() {
#if TRAINSCOPE_HAVE_CUDA
    return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
#else
    return 0;
#endif
}

double cublas_workspace_bytes(const torch::Device& device) {
#if TRAINSCOPE_HAVE_CUDA
    if (!device.is_cuda()) return 0;
    const c10::cuda::CUDAGuard guard(device);
    return static_cast<double>(at::cuda::getChosenWorkspaceSize());
#else
    (void)device;
    return 0;
#endif
}

std::string cuda_unavailable_reason() {
#if TRAINSCOPE_HAVE_CUDA
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess)
        return std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + ", " +
               cudaGetErrorString(err);
    if (count == 0) return "the CUDA runtime sees no device";
    if (!torch::cuda::is_available()) return "LibTorch's CUDA backend is not available";
    return "";
#else
    return "this trainscope was built without CUDA";
#endif
}

std::string cpu_affinity_string() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return "";
    std::string out;
    for (int c = 0; c < CPU_SETSIZE;) {
        if (!CPU_ISSET(c, &set)) {
            ++c;
            continue;
        }
        int end = c;
        while (end + 1 < CPU_SETSIZE && CPU_ISSET(end + 1, &set))
            ++end;
        if (!out.empty()) out += ',';
        out += std::to_string(c);
        if (end > c) out += "-" + std::to_string(end);
        c = end + 1;
    }
    return out;
}

GpuAssignment assign_gpus(const std::vector<RankGpus>& ranks, bool nccl_backend) {
    GpuAssignment a;
    a.index.assign(ranks.size(), -1);
    // run.device=auto resolves on each rank from what it sees: a node without working CUDA among
    // GPU nodes would compute on the CPU (and pick another backend) while its peers use GPUs.
    const auto cpu = std::find_if(ranks.begin(), ranks.end(), [](auto& g) { return !g.cuda; });
    const auto gpu = std::find_if(ranks.begin(), ranks.end(), [](auto& g) { return g.cuda; });
    if (cpu != ranks.end() && gpu != ranks.end()) {
        a.error = "the ranks disagree on the device: rank " + std::to_string(gpu - ranks.begin()) +
                  " (node " + gpu->host + ") computes on cuda but rank " +
                  std::to_string(cpu - ranks.begin()) + " (node " + cpu->host +
                  ") on cpu, where run.device=auto found no usable GPU. Fix CUDA on that node or "
                  "leave it out of the job, or set run.device=cpu (or cuda) for every rank";
        return a;
    }
    // (host, PCI bus id) -> the first rank that chose it; host -> the bus ids its ranks see.
    std::map<std::pair<std::string, std::string>, std::size_t> owner;
    std::map<std::string, std::set<std::string>> visible;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
        const RankGpus& g = ranks[r];
        if (!g.cuda || g.pci_bus_ids.empty()) continue; // no GPU: bind_device says so on that rank
        const int i = g.local_rank % static_cast<int>(g.pci_bus_ids.size());
        a.index[r] = i;
        visible[g.host].insert(g.pci_bus_ids.begin(), g.pci_bus_ids.end());
        const std::string& bus = g.pci_bus_ids[static_cast<std::size_t>(i)];
        const auto [it, fresh] = owner.emplace(std::make_pair(g.host, bus), r);
        if (fresh || !a.error.empty() || !a.shared.empty()) continue;
        const std::string what =
            "ranks " + std::to_string(it->second) + " and " + std::to_string(r) + " on node " +
            g.host + " both use the GPU at PCI bus id " + bus + " (rank " + std::to_string(r) +
            " sees " + std::to_string(g.pci_bus_ids.size()) + " GPU(s))";
        if (nccl_backend)
            a.error = what + ": NCCL cannot put two ranks on one GPU. Launch one rank per GPU: "
                             "as many ranks per node as GPUs (--ntasks-per-node = "
                             "--gpus-per-node), or bind one GPU per task (srun "
                             "--gpus-per-task=1)";
        else
            a.shared = what + ": allowed with dist.backend=mpi, but they compete for it";
    }
    if (!a.error.empty()) return a;
    for (const auto& [host, ids] : visible) {
        std::size_t used = 0;
        std::string idle;
        for (const std::string& bus : ids) {
            if (owner.count({host, bus}))
                ++used;
            else
                idle += (idle.empty() ? "" : ", ") + bus;
        }
        if (idle.empty()) continue;
        a.idle = "node " + host + ": its ranks use " + std::to_string(used) + " of the " +
                 std::to_string(ids.size()) + " GPUs they see; idle: " + idle +
                 " (launch one rank per GPU, or request fewer GPUs)";
        break; // one node says it; the launch is the same everywhere
    }
    return a;
}

namespace {

// One rank's RankGpus as text for allgather_strings: host, local rank, cuda|cpu, then bus ids.
std::string encode(const RankGpus& g) {
    std::string s = g.host + "\n" + std::to_string(g.local_rank) + "\n" + (g.cuda ? "cuda" : "cpu");
    for (const std::string& bus : g.pci_bus_ids)
        s += "\n" + bus;
    return s;
}

RankGpus decode(const std::string& text) {
    RankGpus g;
    std::istringstream in(text);
    std::string line;
    std::getline(in, g.host);
    std::getline(in, line);
    g.local_rank = std::stoi(line);
    std::getline(in, line);
    g.cuda = line == "cuda";
    while (std::getline(in, line))
        g.pci_bus_ids.push_back(line);
    return g;
}

} // namespace

DeviceBinding bind_device(const std::string& requested, const Topology& topo, bool nccl_backend,
                          MPI_Comm world) {
    DeviceBinding b;
    b.cpu_affinity = cpu_affinity_string();
    // What this rank sees, exchanged before anything can throw: every rank must reach the
    // allgather, whatever its own verdict.
    RankGpus mine{topo.hostname, topo.local_rank, {}, requested != "cpu"};
    const int gpus = requested == "cuda" ? cuda_device_count() : 0;
#if TRAINSCOPE_HAVE_CUDA
    for (int i = 0; i < gpus; ++i) {
        char bus[32] = {};
        // An unknown bus id is made unique so that it can never look shared.
        mine.pci_bus_ids.push_back(cudaDeviceGetPCIBusId(bus, sizeof(bus), i) == cudaSuccess
                                       ? std::string(bus)
                                       : "unknown-" + std::to_string(topo.rank) + "-" +
                                             std::to_string(i));
    }
#endif
    std::vector<RankGpus> all;
    for (const std::string& text : core::allgather_strings(world, encode(mine)))
        all.push_back(decode(text));

    if (requested == "cpu") {
        if (nccl_backend)
            throw core::ConfigError(
                "dist.backend=nccl needs run.device=cuda (run.device=cpu): NCCL "
                "cannot communicate host memory; use dist.backend=mpi");
    } else if (requested != "cuda") {
        throw core::ConfigError("run.device = '" + requested +
                                "': expected cpu or cuda (resolve "
                                "'auto' with dist::resolve_options first)");
    } else if (gpus == 0) {
        throw core::ConfigError("run.device=cuda but no CUDA device is visible on host " +
                                topo.hostname + " (" + cuda_unavailable_reason() + "): " +
                                (TRAINSCOPE_HAVE_CUDA
                                     ? "check the job's GPU request (e.g. --gpus-per-node) and "
                                       "CUDA_VISIBLE_DEVICES, or use run.device=cpu"
                                     : "use run.device=cpu"));
    }
    const GpuAssignment a = assign_gpus(all, nccl_backend);
    if (!a.error.empty()) throw core::ConfigError(a.error);
    b.shared = a.shared;
    b.idle = a.idle;
    if (requested == "cpu") {
        b.device = torch::Device(torch::kCPU);
        b.name = "cpu";
        return b;
    }
    const int index = a.index[static_cast<std::size_t>(topo.rank)];
    b.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
#if TRAINSCOPE_HAVE_CUDA
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, index) == cudaSuccess) b.name = prop.name;
    b.pci_bus_id = mine.pci_bus_ids[static_cast<std::size_t>(index)];
    if (b.pci_bus_id.rfind("unknown-", 0) == 0) b.pci_bus_id.clear();
#endif
    return b;
}

} // namespace trainscope::dist
