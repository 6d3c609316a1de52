// The two-level allreduce (see hierarchical_allreduce.hpp). Inside a node the reduce and the
// broadcast go over the node's own transport (Open MPI's shared-memory BTL, or TCP over loopback
// where only tcp is enabled), so only the leaders' allreduce crosses the network: one message's
// worth per node and direction for two nodes, 2(N-1)/N of it for N nodes under a ring.
#include "trainscope/distributed/hierarchical_allreduce.hpp"

#include <algorithm>
#include <array>

#include "trainscope/core/error.hpp"
#include "trainscope/core/mpi_util.hpp"

namespace trainscope::dist {

const char* to_string(AllreduceAlgorithm a) {
    switch (a) {
    case AllreduceAlgorithm::Auto:
        return "auto";
    case AllreduceAlgorithm::Flat:
        return "flat";
    case AllreduceAlgorithm::Hierarchical:
        return "hierarchical";
    }
    return "?";
}

AllreduceAlgorithm parse_allreduce_algorithm(const std::string& name) {
    if (name == "auto") return AllreduceAlgorithm::Auto;
    if (name == "flat") return AllreduceAlgorithm::Flat;
    if (name == "hierarchical") return AllreduceAlgorithm::Hierarchical;
    throw core::ConfigError("option dist.allreduce = '" + name +
                            "' is invalid: expected auto, flat or hierarchical");
}

namespace {

// MPI counts are int: large buffers go in pieces of at most 2^30 elements (as the flat path).
constexpr std::int64_t kMaxPieceElements = std::int64_t{1} << 30;

} // namespace

HierarchicalAllreduce::HierarchicalAllreduce(MPI_Comm comm) {
    int rank = 0;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    MPI_Comm node = MPI_COMM_NULL;
    // key = rank: the node's leader is its lowest rank of `comm` (as core::NodeComm).
    MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    init(comm, node);
}

HierarchicalAllreduce::HierarchicalAllreduce(MPI_Comm comm, int node_color) {
    if (node_color < 0)
        throw core::InternalError("HierarchicalAllreduce: node colour " +
                                  std::to_string(node_color) + " must be >= 0");
    int rank = 0;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    MPI_Comm node = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split(comm, node_color, rank, &node));
    init(comm, node);
}

std::unique_ptr<HierarchicalAllreduce> HierarchicalAllreduce::choose(MPI_Comm comm,
                                                                     const AllreduceOptions& o) {
    if (o.algorithm == AllreduceAlgorithm::Flat) return nullptr;
    std::unique_ptr<HierarchicalAllreduce> h;
    if (o.emulated_node_size > 0) {
        int rank = 0;
        MPI_CHECK(MPI_Comm_rank(comm, &rank));
        h = std::make_unique<HierarchicalAllreduce>(comm, rank / o.emulated_node_size);
    } else {
        h = std::make_unique<HierarchicalAllreduce>(comm);
    }
    if (o.algorithm == AllreduceAlgorithm::Auto && !h->spans_shared_nodes()) return nullptr;
    return h;
}

void HierarchicalAllreduce::init(MPI_Comm comm, MPI_Comm node) {
    node_ = node;
    MPI_Comm_set_errhandler(node_, MPI_ERRORS_RETURN);
    MPI_CHECK(MPI_Comm_rank(node_, &node_rank_));
    MPI_CHECK(MPI_Comm_size(node_, &node_size_));
    int rank = 0;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    MPI_CHECK(MPI_Comm_split(comm, leader() ? 0 : MPI_UNDEFINED, rank, &leaders_));
    if (leaders_ != MPI_COMM_NULL) MPI_Comm_set_errhandler(leaders_, MPI_ERRORS_RETURN);
    // Nodes and the largest node, the same on every rank: one small allreduce at construction.
    std::array<int, 2> mine{leader() ? 1 : 0, node_size_}, all{};
    MPI_CHECK(MPI_Allreduce(mine.data(), &all[0], 1, MPI_INT, MPI_SUM, comm));
    MPI_CHECK(MPI_Allreduce(&mine[1], &all[1], 1, MPI_INT, MPI_MAX, comm));
    nodes_ = all[0];
    max_node_size_ = all[1];
}

HierarchicalAllreduce::~HierarchicalAllreduce() {
    if (leaders_ != MPI_COMM_NULL) MPI_Comm_free(&leaders_);
    if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
}

void HierarchicalAllreduce::run(void* data, std::int64_t count, MPI_Datatype type,
                                MPI_Op op) const {
    int elem = 0;
    MPI_CHECK(MPI_Type_size(type, &elem));
    auto* p = static_cast<char*>(data);
    for (std::int64_t off = 0; off < count; off += kMaxPieceElements) {
        const int n = static_cast<int>(std::min(kMaxPieceElements, count - off));
        char* piece = p + off * elem;
        if (node_size_ > 1) {
            // The leader reduces in place; the others only send (their buffer is not written).
            if (leader())
                MPI_CHECK(MPI_Reduce(MPI_IN_PLACE, piece, n, type, op, /*root=*/0, node_));
            else
                MPI_CHECK(MPI_Reduce(piece, nullptr, n, type, op, /*root=*/0, node_));
        }
        if (leaders_ != MPI_COMM_NULL && nodes_ > 1)
            MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, piece, n, type, op, leaders_));
        if (node_size_ > 1) MPI_CHECK(MPI_Bcast(piece, n, type, /*root=*/0, node_));
    }
}

void HierarchicalAllreduce::run_bounded(void* data, int count, MPI_Datatype type, MPI_Op op,
                                        double timeout_s, const char* what) const {
    MPI_Request request = MPI_REQUEST_NULL;
    if (node_size_ > 1) {
        if (leader())
            MPI_CHECK(MPI_Ireduce(MPI_IN_PLACE, data, count, type, op, 0, node_, &request));
        else
            MPI_CHECK(MPI_Ireduce(data, nullptr, count, type, op, 0, node_, &request));
        core::wait_for_peers(request, timeout_s, what);
    }
    if (leaders_ != MPI_COMM_NULL && nodes_ > 1) {
        MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, count, type, op, leaders_, &request));
        core::wait_for_peers(request, timeout_s, what);
    }
    if (node_size_ > 1) {
        MPI_CHECK(MPI_Ibcast(data, count, type, 0, node_, &request));
        core::wait_for_peers(request, timeout_s, what);
    }
}

} // namespace trainscope::dist
