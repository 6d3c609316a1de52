# run.strategy=pipeline: stage planning, the GPipe engine over MPI point-to-point and pipeline x
# data-parallel groups, checked in fp64 against the unsplit MobileNetV2 with the same micro-batches.
trainscope_add_test(NAME pipeline_mpi_tests MPI TORCH
  SOURCES mpi/test_pipeline.cpp
  LIBS trainscope::train trainscope::dist trainscope::models trainscope_torch
  LABELS train
  MPI NP 2 4)
