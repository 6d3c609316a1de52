# Helpers shared by every module and test directory.
#
# trainscope_add_module(NAME <m> SOURCES ... [PUBLIC_LIBS ...] [PRIVATE_LIBS ...] [TORCH])
#   builds library trainscope_<m> with alias trainscope::<m>, public headers in
#   modules/<m>/include/trainscope/<m>/. TORCH marks modules that include LibTorch: they reuse one
#   precompiled header so each translation unit does not re-parse torch/torch.h.
# trainscope_add_test(NAME <exe> SOURCES ... LIBS ... LABELS ... [MPI NP 1 2 4] [TORCH])
#   one GoogleTest executable; MPI tests run under mpiexec once per rank count.

set(TRAINSCOPE_MPIEXEC_EXTRA_FLAGS "--oversubscribe" CACHE STRING "Extra flags for mpiexec in tests")
if(NOT DEFINED ENV{OMPI_ALLOW_RUN_AS_ROOT} AND "$ENV{USER}" STREQUAL "root" OR "$ENV{HOME}" STREQUAL "/root")
  set(_trainscope_root_flags --allow-run-as-root)
endif()

function(trainscope_use_torch_pch target)
  if(TRAINSCOPE_USE_PCH)
    if(TARGET trainscope_torch_pch)
      target_precompile_headers(${target} REUSE_FROM trainscope_torch_pch)
      # The shared PCH is built with -fPIC (static libraries); GCC rejects it for executables
      # compiled with -fPIE and silently parses torch/torch.h again, so match the flag.
      target_compile_options(${target} PRIVATE -fPIC)
    endif()
  endif()
endfunction()

function(trainscope_add_module)
  cmake_parse_arguments(M "TORCH" "NAME" "SOURCES;PUBLIC_LIBS;PRIVATE_LIBS" ${ARGN})
  set(tgt trainscope_${M_NAME})
  add_library(${tgt} STATIC ${M_SOURCES})
  add_library(trainscope::${M_NAME} ALIAS ${tgt})
  target_include_directories(${tgt} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_link_libraries(${tgt} PUBLIC ${M_PUBLIC_LIBS} PRIVATE ${M_PRIVATE_LIBS})
  target_compile_options(${tgt} PRIVATE -Wall -Wextra)
  set_target_properties(${tgt} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  if(M_TORCH)
    trainscope_use_torch_pch(${tgt})
  endif()
endfunction()

function(trainscope_add_test)
  cmake_parse_arguments(T "MPI;TORCH" "NAME" "SOURCES;LIBS;LABELS;NP" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest)
  target_compile_definitions(${T_NAME} PRIVATE
    TRAINSCOPE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  if(T_TORCH)
    trainscope_use_torch_pch(${T_NAME})
  endif()
  if(T_MPI)
    target_sources(${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests/mpi/mpi_gtest_main.cpp)
    target_link_libraries(${T_NAME} PRIVATE MPI::MPI_CXX)
    if(NOT T_NP)
      set(T_NP 1 2 4)
    endif()
    foreach(np IN LISTS T_NP)
      add_test(NAME ${T_NAME}_np${np}
        COMMAND ${MPIEXEC_EXECUTABLE} ${_trainscope_root_flags} ${TRAINSCOPE_MPIEXEC_EXTRA_FLAGS}
                ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:${T_NAME}>)
      set_tests_properties(${T_NAME}_np${np} PROPERTIES
        LABELS "mpi;${T_LABELS}" TIMEOUT 600 PROCESSORS ${np}
        ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;OMP_NUM_THREADS=1")
    endforeach()
  else()
    target_link_libraries(${T_NAME} PRIVATE GTest::gtest_main)
    add_test(NAME ${T_NAME} COMMAND ${T_NAME})
    set_tests_properties(${T_NAME} PROPERTIES LABELS "unit;${T_LABELS}" TIMEOUT 600
      ENVIRONMENT "OMP_NUM_THREADS=1")
  endif()
endfunction()
