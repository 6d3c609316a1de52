// The node-aware (two-level) allreduce of the MPI backend, dist.allreduce=hierarchical: reduce
// inside each node to its leader, allreduce among one leader per node, broadcast inside the node.
// Open MPI's own allreduce does not always keep inter-node traffic to one message per node (its
// ring sends 2(p-1)/p of the message over each node's link); this one does, whatever Open MPI
// picks for the leaders. Torch-free: it works on raw buffers, so tests drive it directly.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>

namespace trainscope::dist {

// dist.allreduce: how the MPI backend's communicator runs every allreduce.
//   Auto: Hierarchical when the communicator's ranks span two or more nodes and some node holds
//         two or more of them, else Flat (decided by the communicator, identically on every rank).
//   Flat: one MPI_Allreduce over all ranks (Open MPI chooses its algorithm).
//   Hierarchical: HierarchicalAllreduce, even on one node or with one rank per node.
enum class AllreduceAlgorithm { Auto, Flat, Hierarchical };
const char* to_string(AllreduceAlgorithm a); // "auto" | "flat" | "hierarchical"
// "auto" | "flat" | "hierarchical"; core::ConfigError naming dist.allreduce otherwise.
AllreduceAlgorithm parse_allreduce_algorithm(const std::string& name);

// The ConfigError of dist.allreduce=hierarchical on the NCCL backend (resolve_options and
// make_communicator): refused rather than ignored, since the run would not do what was asked.
inline constexpr const char* kNcclHierarchical =
    "dist.allreduce=hierarchical but dist.backend is nccl: NCCL's allreduce is already node-aware "
    "(its rings and trees cross each node's link once, over NVLink inside the node), and the "
    "two-level algorithm is the MPI backend's; use dist.allreduce=auto or flat with NCCL, or "
    "dist.backend=mpi";

// What make_communicator needs to choose the allreduce (the MPI backend's; NCCL ignores it).
struct AllreduceOptions {
    AllreduceAlgorithm algorithm = AllreduceAlgorithm::Flat;
    // Testing aid, not an option: > 0 makes consecutive blocks of this many ranks of the
    // communicator one node each (rank / emulated_node_size), so one host can stand for several
    // nodes; 0 (always, outside tests) groups ranks as MPI_Comm_split_type(SHARED) does
    // (core::NodeComm), so the emulated nodes of tests/multinode are apart.
    int emulated_node_size = 0;
};

// The two-level allreduce over a communicator's ranks. Builds its sub-communicators once (the
// node's and the leaders'); every run() then reuses them. Collective calls: the constructors,
// run() and run_bounded() (every rank of `comm`, same order, same count and type).
class HierarchicalAllreduce {
  public:
    // Nodes as core::NodeComm groups them (MPI_Comm_split_type SHARED).
    explicit HierarchicalAllreduce(MPI_Comm comm);
    // Nodes given by the caller: ranks of `comm` with equal `node_color` (>= 0) form one node,
    // in the order of `comm` (its lowest rank is the node's leader). Tests emulate several nodes
    // on one host with it.
    HierarchicalAllreduce(MPI_Comm comm, int node_color);
    // What `o` asks for over `comm`: null for a flat allreduce (Flat, or Auto where
    // spans_shared_nodes() is false; the same answer on every rank), else the algorithm over the
    // nodes `o` names. Collective over `comm` unless o.algorithm is Flat.
    static std::unique_ptr<HierarchicalAllreduce> choose(MPI_Comm comm, const AllreduceOptions& o);
    ~HierarchicalAllreduce(); // frees the sub-communicators
    HierarchicalAllreduce(const HierarchicalAllreduce&) = delete;
    HierarchicalAllreduce& operator=(const HierarchicalAllreduce&) = delete;

    int nodes() const { return nodes_; }                 // nodes among the ranks of `comm`
    int node_rank() const { return node_rank_; }         // 0: this node's leader
    int node_size() const { return node_size_; }         // ranks of this node
    int max_node_size() const { return max_node_size_; } // over all nodes
    bool leader() const { return node_rank_ == 0; }
    // Whether two levels can save anything: several nodes, at least one with several ranks.
    bool spans_shared_nodes() const { return nodes_ > 1 && max_node_size_ > 1; }

    // In place over `count` elements of `type` at `data`, reduced with `op` (MPI_SUM, MPI_MAX,
    // MPI_MIN): MPI_Reduce to the leader over the node, MPI_Allreduce over the leaders, MPI_Bcast
    // over the node, in pieces of at most 2^30 elements. Every rank ends with the leader's bytes
    // (the same on every rank). Sums are formed in another order than a flat allreduce's, so
    // floating-point results may differ from it in the last bits; integers are exact.
    void run(void* data, std::int64_t count, MPI_Datatype type, MPI_Op op) const;
    // The same with nonblocking calls (MPI_Ireduce, MPI_Iallreduce, MPI_Ibcast), each completed by
    // core::wait_for_peers within timeout_s (0: no limit; PeerTimeoutError naming `what`). At most
    // 2^31-1 elements (the callers' small blocking allreduces).
    void run_bounded(void* data, int count, MPI_Datatype type, MPI_Op op, double timeout_s,
                     const char* what) const;

  private:
    void init(MPI_Comm comm, MPI_Comm node); // takes ownership of `node`

    MPI_Comm node_ = MPI_COMM_NULL;    // this node's ranks; leader = node rank 0
    MPI_Comm leaders_ = MPI_COMM_NULL; // one rank per node; MPI_COMM_NULL on non-leaders
    int nodes_ = 1, node_rank_ = 0, node_size_ = 1, max_node_size_ = 1;
};

} // namespace trainscope::dist
