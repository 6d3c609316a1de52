# Helpers shared by every module and test directory.
#
# trainscope_add_module(NAME <m> SOURCES ... [PUBLIC_LIBS ...] [PRIVATE_LIBS ...] [TORCH])
#   builds library trainscope_<m> with alias trainscope::<m>, public headers in
#   modules/<m>/include/trainscope/<m>/. TORCH marks modules that include LibTorch: they reuse one
#   precompiled header so each translation unit does not re-parse torch/torch.h.
# The test executables (unit_tests, mpi_tests) are declared in tests/CMakeLists.txt.

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

# Unity build (TRAINSCOPE_UNITY_BUILD) for one target.
function(trainscope_use_unity_build target)
  if(TRAINSCOPE_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON
      UNITY_BUILD_BATCH_SIZE ${TRAINSCOPE_UNITY_BATCH_SIZE})
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
  trainscope_use_unity_build(${tgt})
  if(M_TORCH)
    trainscope_use_torch_pch(${tgt})
  endif()
endfunction()
