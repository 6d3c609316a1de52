# train: unit tests of the train module (serial, CPU). train_unit_tests checks the host tensor
# counter (prof; installed first, so the later suites run on it), the precision policy:
# run.precision parsing and device checks, TF32 math mode, CPU autocast regions and the dynamic
# loss scaler against PyTorch GradScaler's semantics.
trainscope_add_test(NAME train_unit_tests TORCH
  SOURCES unit/test_memory_counter.cpp unit/test_precision.cpp unit/test_data_parallel.cpp
          unit/test_llm_train.cpp
  LIBS trainscope::train
  LABELS train unit)
