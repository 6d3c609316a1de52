// Chunked MPI transfers of the MPI communicator (mpi_communicator.cpp): MPI counts are int, so
// large buffers go in pieces of at most 2^30 elements or bytes. Private to distributed/src.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>

namespace trainscope::dist {

class HierarchicalAllreduce;

namespace transfers {

// MPI counts are int: large buffers go in pieces of at most 2^30 elements.
inline constexpr std::int64_t kMaxChunk = std::int64_t{1} << 30;

// In place over `comm`, or through the two-level algorithm when `hierarchical` is given.
void allreduce_chunked(void* data, std::int64_t count, std::size_t elem, MPI_Datatype type,
                       MPI_Op op, MPI_Comm comm, const HierarchicalAllreduce* hierarchical);
void bcast_bytes(void* data, std::int64_t bytes, int root, MPI_Comm comm);
// Point-to-point in pieces of at most 2^30 bytes; MPI keeps messages between two ranks on one
// communicator and tag in order, so the pieces arrive in sequence. Nonblocking, completed by
// core::wait_for_peers within timeout_s (0: no limit): point-to-point runs on the caller's thread
// (its nonblocking form is the same protocol as the blocking one, so nothing is lost).
void send_bytes(const void* data, std::int64_t bytes, int peer, MPI_Comm comm, double timeout_s);
void recv_bytes(void* data, std::int64_t bytes, int peer, MPI_Comm comm, double timeout_s);
// n as an MPI count, or a DistributedError naming `what`.
int checked_int(std::int64_t n, const char* what);

} // namespace transfers
} // namespace trainscope::dist
