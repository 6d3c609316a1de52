// Where each rank runs: world rank/size, rank within its node (shared-memory domain), node index
// and host names. Computed once, collectively, right after MPI start-up.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace trainscope::dist {

struct Topology {
    int rank = 0, world_size = 1;
    int local_rank = 0, local_size = 1; // within this node (core::NodeComm)
    int node = 0, num_nodes = 1;        // nodes numbered by their lowest world rank
    std::string hostname;               // this rank's host
    std::vector<std::string> hostnames; // [world_size] per rank on rank 0; empty elsewhere
};

// Collective over `comm`.
Topology discover_topology(MPI_Comm comm);

} // namespace trainscope::dist
