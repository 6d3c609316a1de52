// MPI_CHECK comes from core's shared MPI helpers (trainscope/core/mpi_util.hpp); this private
// header only keeps the dist sources' include stable.
#pragma once

#include "trainscope/core/mpi_util.hpp"
