// Internal: the NCCL backend's factory (defined only in builds with NCCL).
#pragma once

#include <mpi.h>
#include <torch/types.h>

#include <memory>

#include "trainscope/core/build_config.hpp"
#include "trainscope/distributed/communicator.hpp"

namespace trainscope::dist::detail {

#if TRAINSCOPE_HAVE_NCCL
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, torch::Device device,
                                                     double timeout_s);
#endif

} // namespace trainscope::dist::detail
