# io: the parallel HDF5 run file. io_mpi_tests runs at np 1, 2, 4; io_runfile_writer is a helper
# program (not a test) that tests/python/test_run_file_h5py.py launches with mpirun, e.g. to
# SIGKILL a job after a flush and read what it left with h5py and h5dump.
trainscope_add_test(NAME io_mpi_tests
  SOURCES mpi/test_run_file.cpp
  LIBS trainscope::io trainscope_hdf5
  LABELS io
  MPI NP 1 2 4)

add_executable(io_runfile_writer mpi/io_runfile_writer.cpp)
target_link_libraries(io_runfile_writer PRIVATE trainscope::io)

if(TRAINSCOPE_PYTHON)
  add_test(NAME io_run_file_h5py
    COMMAND ${TRAINSCOPE_PYTHON} -m pytest -q -p no:cacheprovider
            ${PROJECT_SOURCE_DIR}/tests/python/test_run_file_h5py.py)
  set_tests_properties(io_run_file_h5py PROPERTIES
    LABELS "python;io" TIMEOUT 300 PROCESSORS 2
    ENVIRONMENT "TRAINSCOPE_BUILD_DIR=${CMAKE_BINARY_DIR};OMP_NUM_THREADS=1")
endif()
