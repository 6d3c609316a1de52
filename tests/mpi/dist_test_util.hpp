// Helpers for MPI test suites that link trainscope::dist.
#pragma once

#include <memory>

#include "trainscope/dist/communicator.hpp"

namespace trainscope::testing {

// An MPI-backend communicator over MPI_COMM_WORLD on the CPU (collective).
inline std::unique_ptr<dist::Communicator> mpi_communicator() {
    return dist::make_communicator("mpi", MPI_COMM_WORLD, torch::Device(torch::kCPU));
}

} // namespace trainscope::testing
