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
