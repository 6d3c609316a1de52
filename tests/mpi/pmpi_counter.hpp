// A PMPI counter for the MPI tests: tests/mpi/pmpi_counter.cpp defines the MPI collectives and
// collective MPI-IO calls in the mpi_tests executable itself, counts each call and forwards it to
// its PMPI_ entry point. The executable's definitions take precedence over libmpi's for every
// caller in the process, HDF5 and its MPI-IO driver included, so a test can count what one
// RunFile::flush costs in collectives (issue 39: at most 5 on the world communicator).
#pragma once

#include <map>
#include <string>

namespace trainscope::testing::pmpi {

// Starts counting from zero (counting is off until the first reset).
void reset();
// Stops counting; the counts stay readable.
void stop();
// Calls per MPI function since reset() on a communicator spanning every rank of MPI_COMM_WORLD
// (MPI-IO calls: every call on a file opened by all ranks). Calls on smaller communicators are in
// subset_counts().
std::map<std::string, long> global_counts();
std::map<std::string, long> subset_counts();
long global_total();
// "MPI_Allreduce 2, MPI_Gather 1": for a failure message.
std::string describe(const std::map<std::string, long>& counts);

} // namespace trainscope::testing::pmpi
