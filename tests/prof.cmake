# prof: profiler window (Kineto) and /profile. prof_mpi_tests trains a small MobileNetV2 on CPU
# through the window at np 1 and 2, writes /profile with train's writer and reads it back; it also
# checks the summary arithmetic.
trainscope_add_test(NAME prof_mpi_tests TORCH
  SOURCES mpi/test_profiler.cpp
  LIBS trainscope::prof trainscope::models trainscope::io trainscope::train trainscope_torch
       trainscope_hdf5
  LABELS prof
  MPI NP 1 2)
