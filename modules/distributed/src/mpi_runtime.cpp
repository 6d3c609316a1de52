// MPI start-up/shut-down, topology discovery and collective error agreement. No LibTorch here: this
// file is what every rank runs first, and it stays cheap to compile.
#include "trainscope/distributed/mpi_runtime.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

#include "mpi_check.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/distributed/topology.hpp"

namespace trainscope::dist {
namespace {

std::atomic<bool> g_aborted{false};

std::string first_line(const std::string& text) {
    return text.substr(0, text.find('\n'));
}

std::string local_hostname() {
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    if (MPI_Get_processor_name(name, &len) == MPI_SUCCESS && len > 0) return std::string(name, len);
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) == 0) return host;
    return "unknown";
}

} // namespace

MpiRuntime::MpiRuntime(int& argc, char**& argv, int thread_level) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) {
        MPI_Query_thread(&provided_);
    } else {
        if (MPI_Init_thread(&argc, &argv, thread_level, &provided_) != MPI_SUCCESS)
            throw core::DistributedError("MPI_Init_thread failed: was trainscope started with "
                                         "mpiexec/srun under a working MPI installation?");
        owns_mpi_ = true;
    }
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    core::log::set_identity(rank, size, local_hostname());
}

MpiRuntime::~MpiRuntime() {
    if (!owns_mpi_ || g_aborted) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

void MpiRuntime::abort(int code) {
    g_aborted = true;
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code); // MPI_Abort should not return; make sure this rank ends regardless
}

std::string thread_level_name(int level) {
    if (level == MPI_THREAD_SINGLE) return "MPI_THREAD_SINGLE";
    if (level == MPI_THREAD_FUNNELED) return "MPI_THREAD_FUNNELED";
    if (level == MPI_THREAD_SERIALIZED) return "MPI_THREAD_SERIALIZED";
    if (level == MPI_THREAD_MULTIPLE) return "MPI_THREAD_MULTIPLE";
    return "thread level " + std::to_string(level);
}

std::string mpi_library_version() {
    char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int len = 0;
    MPI_Get_library_version(text, &len);
    std::string version(text, std::max(len, 0));
    version = first_line(version);
    while (!version.empty() && (version.back() == '\0' || version.back() == ' '))
        version.pop_back();
    return version;
}

Topology discover_topology(MPI_Comm comm) {
    Topology t;
    MPI_CHECK(MPI_Comm_rank(comm, &t.rank));
    MPI_CHECK(MPI_Comm_size(comm, &t.world_size));

    // The node: core::NodeComm's grouping (MPI_COMM_TYPE_SHARED, local ranks in world order),
    // the one every node-local read uses too.
    core::NodeComm local(comm);
    t.local_rank = local.rank();
    t.local_size = local.size();

    // Node leaders (local rank 0) ordered by world rank number the nodes.
    MPI_Comm leaders = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split(comm, t.local_rank == 0 ? 0 : MPI_UNDEFINED, t.rank, &leaders));
    int node_info[2] = {0, 1}; // node index, number of nodes
    if (leaders != MPI_COMM_NULL) {
        MPI_CHECK(MPI_Comm_rank(leaders, &node_info[0]));
        MPI_CHECK(MPI_Comm_size(leaders, &node_info[1]));
        MPI_Comm_free(&leaders);
    }
    MPI_CHECK(MPI_Bcast(node_info, 2, MPI_INT, 0, local.get()));
    t.node = node_info[0];
    t.num_nodes = node_info[1];

    // Every host name on rank 0 only: rank 0 alone prints the plan that lists them.
    t.hostname = local_hostname();
    t.hostnames = core::gather_strings(comm, t.hostname);
    return t;
}

} // namespace trainscope::dist
