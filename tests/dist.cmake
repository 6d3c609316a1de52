# dist module: communicators, collective error agreement, device binding and the gradient
# synchronizer, all under mpiexec at 1, 2 and 4 ranks.
trainscope_add_test(NAME dist_mpi_tests MPI TORCH
  SOURCES mpi/test_communicator.cpp mpi/test_gradient_synchronizer.cpp
  LIBS trainscope::dist
  LABELS dist)

# Communication accounting and benchmark (bandwidth conventions, CommBenchmark, /comm).
include(${CMAKE_CURRENT_LIST_DIR}/comm.cmake)
