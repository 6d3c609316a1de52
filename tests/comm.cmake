# Communication accounting: nccl-tests' bandwidth conventions (serial), the comm benchmark's byte
# counts, bus-bandwidth factors and /comm tables at 2 and 4 ranks, and two benchmark programs (not
# tests) that scripts/bench comm_mpi runs side by side: trainscope's CommBenchmark and a plain
# MPI_Allreduce loop over the same sizes.
trainscope_add_test(NAME comm_unit_tests
  SOURCES unit/test_bandwidth.cpp
  LIBS trainscope::core
  LABELS comm unit)
# bandwidth.hpp is header-only and free of LibTorch: use it without linking trainscope::dist.
target_include_directories(comm_unit_tests PRIVATE ${PROJECT_SOURCE_DIR}/modules/dist/include)

trainscope_add_test(NAME comm_mpi_tests MPI TORCH
  SOURCES mpi/test_comm_benchmark.cpp
  LIBS trainscope::dist trainscope::io trainscope::train trainscope_hdf5
  LABELS comm
  MPI NP 2 4)

add_executable(comm_bench_driver bench/comm_bench_driver.cpp)
target_link_libraries(comm_bench_driver PRIVATE trainscope::dist trainscope::io trainscope::train)
trainscope_use_torch_pch(comm_bench_driver)

add_executable(mpi_allreduce_ref bench/mpi_allreduce_ref.cpp)
target_link_libraries(mpi_allreduce_ref PRIVATE MPI::MPI_CXX)
