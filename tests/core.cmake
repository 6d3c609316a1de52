trainscope_add_test(NAME core_unit_tests
  SOURCES unit/test_config.cpp unit/test_lr_schedule.cpp
  LIBS trainscope::core trainscope::train LABELS core)
