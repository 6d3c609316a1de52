trainscope_add_test(NAME models_unit_tests TORCH
  SOURCES unit/test_mobilenet_v2.cpp
  LIBS trainscope::models LABELS models)
