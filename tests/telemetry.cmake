# prof telemetry and statistics (issue 3): serial unit tests (statistics, sampler, memory
# counters) with a fake NVML library standing in for the driver, and MPI tests that write
# /telemetry from 1 and 2 ranks (through train's run-file writers) and read it back.
add_library(trainscope_fake_nvml SHARED unit/fake_nvml.cpp)

trainscope_add_test(NAME prof_unit_tests
  SOURCES unit/test_statistics.cpp unit/test_telemetry.cpp
  LIBS trainscope::prof
  LABELS prof)
target_compile_definitions(prof_unit_tests PRIVATE
  TRAINSCOPE_FAKE_NVML="$<TARGET_FILE:trainscope_fake_nvml>")
add_dependencies(prof_unit_tests trainscope_fake_nvml)

trainscope_add_test(NAME telemetry_mpi_tests
  SOURCES mpi/test_telemetry_write.cpp
  LIBS trainscope::prof trainscope::train trainscope_hdf5
  LABELS prof
  MPI NP 1 2)
