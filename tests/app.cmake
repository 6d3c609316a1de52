# End-to-end: the real binary under mpirun, checked from Python (h5py, h5dump). Label e2e.
if(TRAINSCOPE_PYTHON)
  add_test(NAME e2e_app
    COMMAND ${TRAINSCOPE_PYTHON} -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_SOURCE_DIR}/e2e)
  set_tests_properties(e2e_app PROPERTIES LABELS "e2e" TIMEOUT 1200 PROCESSORS 2
    ENVIRONMENT "TRAINSCOPE_BUILD_DIR=${CMAKE_BINARY_DIR};PYTHONPATH=${PROJECT_SOURCE_DIR}/postprocess;OMP_NUM_THREADS=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
endif()
