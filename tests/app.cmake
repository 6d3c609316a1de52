# End-to-end and Python suites, run by ctest so that one command reports every test.
#   e2e_app       the real binary under mpirun, checked from Python (h5py, h5dump)   label e2e
#   e2e_bad_input tests/e2e/test_bad_input.py: the bad-input table, full/read-only disks  label e2e
#   e2e_faults    tests/e2e/test_faults.py: killed ranks, signals, checkpoint/resume, watchdog  label e2e
#   e2e_elastic   tests/e2e/test_elastic.py: --resume on another rank count  label e2e
#   e2e_coalloc   tests/e2e/test_coalloc.py: co-allocated jobs resized by it  label e2e
#   e2e_readme    tests/e2e/test_readme.py: the README's runnable blocks, as written  label e2e
#   python_tests  tests/python: run files from helper programs, the postprocess package  label python
#   jobscripts_tests  tests/jobscripts: job scripts, sweep generator, real Slurm  label jobscripts
if(TRAINSCOPE_PYTHON)
  set(_py_env "TRAINSCOPE_BUILD_DIR=${CMAKE_BINARY_DIR};PYTHONPATH=${PROJECT_SOURCE_DIR}/postprocess;OMP_NUM_THREADS=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  # pytest-xdist: three workers, one test file each at a time (--dist loadfile keeps a file's
  # module fixtures, e.g. the quickstart run, to one worker). A 2-rank launch spends most of its
  # ~2 s starting up (LibTorch, MPI), so three at once keep the 2 cores busy.
  add_test(NAME e2e_app
    COMMAND ${TRAINSCOPE_PYTHON} -m pytest -q --durations=15 -p no:cacheprovider -n 3 --dist loadfile
            --ignore=${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_bad_input.py
            --ignore=${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_faults.py
            --ignore=${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_elastic.py
            --ignore=${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_coalloc.py
            --ignore=${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_readme.py ${CMAKE_CURRENT_SOURCE_DIR}/e2e)
  set_tests_properties(e2e_app PROPERTIES LABELS "e2e" TIMEOUT 1200 PROCESSORS 2
    ENVIRONMENT "${_py_env}")
  # Faults (issue 8): a killed rank, signals + checkpoint + --resume equality, the watchdog,
  # non-finite losses. -s keeps the measured exit times and loss differences in the ctest log.
  add_test(NAME e2e_faults
    COMMAND ${TRAINSCOPE_PYTHON} -m pytest -q --durations=15 -s -p no:cacheprovider
            ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_faults.py)
  set_tests_properties(e2e_faults PROPERTIES LABELS "e2e" TIMEOUT 1200 PROCESSORS 2
    ENVIRONMENT "${_py_env}")
  # Elastic resume (issue 27): 2-rank checkpoints resumed on 1 and 4 ranks against uninterrupted
  # runs; -s keeps the measured loss and weight differences in the ctest log. Then, as its own
  # entry, a co-allocation (trainscope-study coalloc) whose dynamic mode shrinks and grows a job by
  # it. Both are deterministic under load (losses compared exactly; the co-allocation runs on given
  # idle models), so each holds one processor and ctest -j 2 runs them side by side.
  add_test(NAME e2e_elastic
    COMMAND ${TRAINSCOPE_PYTHON} -m pytest -q -s --durations=15 -p no:cacheprovider
            ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_elastic.py)
  set_tests_properties(e2e_elastic PROPERTIES LABELS "e2e" TIMEOUT 1200 PROCESSORS 1
    ENVIRONMENT "${_py_env}")
  add_test(NAME e2e_coalloc
    COMMAND ${TRAINSCOPE_PYTHON} -m pytest -q -s --durations=15 -p no:cacheprovider
            ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_coalloc.py)
  set_tests_properties(e2e_coalloc PROPERTIES LABELS "e2e" TIMEOUT 1200 PROCESSORS 1
    ENVIRONMENT "${_py_env}")
  # The README's tour (issue 41): its runnable blocks in one shell, as a newcomer pastes them,
  # without the root overrides above (the README's launches must be root-safe themselves).
  add_test(NAME e2e_readme
    COMMAND ${TRAINSCOPE_PYTHON} -m pytest -q -s -p no:cacheprovider
            ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_readme.py)
  set_tests_properties(e2e_readme PROPERTIES LABELS "e2e" TIMEOUT 1500 PROCESSORS 2
    ENVIRONMENT "${_py_env}")
  # The bad-input table (and the full / read-only file system tests, which mount tmpfs as root):
  # its own entry, so that ctest -j runs it beside the other suites.
  # Every row is a 2-rank launch that fails during start-up: three rows at a time (pytest-xdist).
  add_test(NAME e2e_bad_input
    COMMAND ${TRAINSCOPE_PYTHON} -m pytest -q --durations=15 -p no:cacheprovider -n 3
            ${CMAKE_CURRENT_SOURCE_DIR}/e2e/test_bad_input.py)
  set_tests_properties(e2e_bad_input PROPERTIES LABELS "e2e" TIMEOUT 900 PROCESSORS 2
    ENVIRONMENT "${_py_env}")
  # Two pytest workers, a test file each (module fixtures that launch the binary run once): most
  # of the ~400 cases wait on a subprocess (a CLI start-up, a signal, a timeout), so two at a
  # time use the 2 cores (serial: 384 s on 2026-11-28).
  add_test(NAME python_tests
    COMMAND ${TRAINSCOPE_PYTHON} -m pytest -q --durations=15 -p no:cacheprovider -n 2
            --dist loadfile ${CMAKE_CURRENT_SOURCE_DIR}/python)
  set_tests_properties(python_tests PROPERTIES LABELS "python" TIMEOUT 900 PROCESSORS 2
    ENVIRONMENT "${_py_env}")
  # jobscripts/: shellcheck, rendering, a PBS script under a stub PBS, a local study, and a real
  # single-node Slurm that the test starts and stops itself (tests/slurm/local_slurm.sh).
  add_test(NAME jobscripts_tests
    COMMAND ${TRAINSCOPE_PYTHON} -m pytest -q --durations=15 -p no:cacheprovider ${CMAKE_CURRENT_SOURCE_DIR}/jobscripts)
  set_tests_properties(jobscripts_tests PROPERTIES LABELS "jobscripts" TIMEOUT 1500 PROCESSORS 2
    ENVIRONMENT "${_py_env}")
else()
  message(WARNING "TRAINSCOPE_PYTHON is not set: the e2e and Python suites are not registered "
                  "(scripts/build passes the venv's python)")
endif()
