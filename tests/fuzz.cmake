# fuzz: scripts/fuzz --smoke (label fuzz): builds the clang ASan+UBSan project in tests/fuzz into
# <build>/fuzz, fuzzes each parser ~12 s from its seed corpus, and runs the sanitizer unit tests
# and the run-file MPI tests at 2 ranks. Fails, never skips, when clang or libFuzzer is missing.
add_test(NAME fuzz_smoke COMMAND ${PROJECT_SOURCE_DIR}/scripts/fuzz --smoke)
set_tests_properties(fuzz_smoke PROPERTIES LABELS "fuzz" TIMEOUT 900 PROCESSORS 2
  ENVIRONMENT "BUILD_DIR=${CMAKE_BINARY_DIR};OMP_NUM_THREADS=1")
