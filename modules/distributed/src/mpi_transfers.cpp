// Chunked MPI transfers (mpi_transfers.hpp).
#include "mpi_transfers.hpp"

#include <algorithm>
#include <climits>
#include <string>

#include "mpi_check.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/mpi_util.hpp"
#include "trainscope/core/nvtx.hpp"
#include "trainscope/distributed/hierarchical_allreduce.hpp"

namespace trainscope::dist::transfers {

void allreduce_chunked(void* data, std::int64_t count, std::size_t elem, MPI_Datatype type,
                       MPI_Op op, MPI_Comm comm, const HierarchicalAllreduce* hierarchical) {
    if (hierarchical) {
        nvtx::ScopedRange range("hierarchical allreduce");
        hierarchical->run(data, count, type, op);
        return;
    }
    nvtx::ScopedRange range("MPI_Allreduce");
    auto* p = static_cast<char*>(data);
    for (std::int64_t off = 0; off < count; off += kMaxChunk) {
        const int n = static_cast<int>(std::min(kMaxChunk, count - off));
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p + off * elem, n, type, op, comm));
    }
}

void bcast_bytes(void* data, std::int64_t bytes, int root, MPI_Comm comm) {
    nvtx::ScopedRange range("MPI_Bcast");
    auto* p = static_cast<char*>(data);
    for (std::int64_t off = 0; off < bytes; off += kMaxChunk)
        MPI_CHECK(MPI_Bcast(p + off, static_cast<int>(std::min(kMaxChunk, bytes - off)), MPI_BYTE,
                            root, comm));
}

void send_bytes(const void* data, std::int64_t bytes, int peer, MPI_Comm comm, double timeout_s) {
    nvtx::ScopedRange range("MPI_Send");
    const auto* p = static_cast<const char*>(data);
    for (std::int64_t off = 0; off < bytes; off += kMaxChunk) {
        MPI_Request request = MPI_REQUEST_NULL;
        MPI_CHECK(MPI_Isend(p + off, static_cast<int>(std::min(kMaxChunk, bytes - off)), MPI_BYTE,
                            peer, /*tag=*/0, comm, &request));
        core::wait_for_peers(request, timeout_s, "an MPI send (pipeline stages)");
    }
}

void recv_bytes(void* data, std::int64_t bytes, int peer, MPI_Comm comm, double timeout_s) {
    nvtx::ScopedRange range("MPI_Recv");
    auto* p = static_cast<char*>(data);
    for (std::int64_t off = 0; off < bytes; off += kMaxChunk) {
        MPI_Request request = MPI_REQUEST_NULL;
        MPI_CHECK(MPI_Irecv(p + off, static_cast<int>(std::min(kMaxChunk, bytes - off)), MPI_BYTE,
                            peer, /*tag=*/0, comm, &request));
        core::wait_for_peers(request, timeout_s, "an MPI receive (pipeline stages)");
    }
}

int checked_int(std::int64_t n, const char* what) {
    if (n > INT_MAX)
        throw core::DistributedError(std::string(what) + " of " + std::to_string(n) +
                                     " elements exceeds MPI's int count; split the tensor");
    return static_cast<int>(n);
}

} // namespace trainscope::dist::transfers
