# train: MPI suites of the training path. train_mpi_tests checks sync batch-norm (cv.sync_bn)
# against one-process BatchNorm2d over the joint batch at 1 and 2 ranks (even, uneven and empty
# local batches, channels_last, eval mode, MobileNetV2 gradients under DDP's averaging convention),
# ZeRO-1/2 against plain data parallelism on a tiny Llama (fp64), and checkpoint directories
# (atomic saves, discovery, pruning, the --resume configuration check).
trainscope_add_test(NAME train_mpi_tests MPI TORCH
  SOURCES mpi/test_sync_bn.cpp mpi/test_zero.cpp mpi/test_checkpoint.cpp
  LIBS trainscope::train trainscope::models trainscope::dist trainscope_torch
  LABELS train
  MPI NP 1 2)

# dist.zero=3 (FSDP) against unsharded data parallelism through the real LlmTrainer: every method,
# with and without activation checkpointing, gradient accumulation, prefetching and resharding, at
# 2 and 4 ranks (fp64; parameters to 1e-10, losses to 1e-12); shard storage and traffic columns.
trainscope_add_test(NAME fsdp_mpi_tests MPI TORCH
  SOURCES mpi/test_fsdp.cpp
  LIBS trainscope::train trainscope::models trainscope::dist trainscope::data trainscope::prof
       trainscope_torch
  LABELS train
  MPI NP 2 4)
target_compile_definitions(fsdp_mpi_tests PRIVATE TRAINSCOPE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

# Label gpu (scripts/gpu-check): the tests that need a GPU, each skipping itself without one, so
# that the CPU suite runs them cleanly: the checkpoint's device mapping from cuda:0 and the NF4
# table on the device.
add_test(NAME gpu_checkpoint_np2
  COMMAND ${MPIEXEC_EXECUTABLE} ${_trainscope_root_flags} ${TRAINSCOPE_MPIEXEC_EXTRA_FLAGS}
          ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:train_mpi_tests> --gtest_filter=*Cuda*)
add_test(NAME gpu_nf4 COMMAND models_unit_tests --gtest_filter=Nf4.ByteTable*)
set_tests_properties(gpu_checkpoint_np2 gpu_nf4 PROPERTIES LABELS "gpu" TIMEOUT 300
  ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;OMP_NUM_THREADS=1")
