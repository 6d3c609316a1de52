# Finds and checks every dependency. Parallel HDF5 is verified, not assumed: the configure step
# fails when HDF5 is a serial build or was built against a different MPI than the one found here.

# MPI, parallel HDF5 (checked), Boost.Program_options, zlib, nlohmann_json, GoogleTest: shared
# with the sanitizer build in tests/fuzz, which has no LibTorch.
include(TrainscopeSystemDependencies)

# --- LibTorch (from a pip torch: CMAKE_PREFIX_PATH=torch.utils.cmake_prefix_path) ------------------
foreach(opt TRAINSCOPE_USE_CUDA TRAINSCOPE_USE_NCCL)
  if(NOT ${opt} MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${opt}=${${opt}} is invalid: use AUTO, ON or OFF")
  endif()
endforeach()
# With TRAINSCOPE_USE_CUDA=OFF a CUDA build of LibTorch still links its CUDA libraries; we simply
# compile none of our own CUDA code (events, NCCL communicator, allocator counters).
# LibTorch's CMake would otherwise compile and *run* a CUDA probe to detect GPU architectures, which
# fails on build hosts without a GPU. trainscope compiles no CUDA kernels of its own, so the list
# only has to be valid.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0" CACHE STRING "CUDA architectures LibTorch's CMake assumes")
endif()
find_package(Torch REQUIRED)
if(NOT TORCH_FOUND)
  message(FATAL_ERROR "LibTorch not found: run scripts/setup, or pass "
    "-DCMAKE_PREFIX_PATH=$(python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')")
endif()
# TorchConfig exports compile flags through TORCH_CXX_FLAGS (the ABI flag); apply them to our targets.
separate_arguments(_torch_cxx_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
add_library(trainscope_torch INTERFACE)
target_link_libraries(trainscope_torch INTERFACE ${TORCH_LIBRARIES})
target_compile_options(trainscope_torch INTERFACE ${_torch_cxx_flags})
# libstdc++ first among the needed libraries, ahead of libtorch: some LibTorch wheels (2.11) export
# a statically linked copy of std::filesystem whose remove_all calls a weak symbol that GCC 12's
# libstdc++ lacks, so with libtorch first the dynamic linker binds our fs::remove_all to that copy
# and it calls address 0 on a non-empty directory (checkpoint pruning). Link options come before
# the objects and libraries on the link line, hence first in DT_NEEDED; checked by the unit test
# Toolchain.StdFilesystemComesFromLibstdcxx.
target_link_options(trainscope_torch INTERFACE "LINKER:--push-state,--no-as-needed,-lstdc++,--pop-state")
set(TRAINSCOPE_LIBTORCH_VERSION "${Torch_VERSION}")
# A pip torch loads its CUDA libraries (cuBLAS, cuDNN, NCCL, ...) from the nvidia-* wheels next to
# it (RUNPATH $ORIGIN/../../nvidia/...). Let the linker resolve libtorch_cuda's dependencies in the
# same place, not in an older system copy (e.g. a toolkit NCCL lacking symbols LibTorch uses).
get_filename_component(_torch_site "${Torch_DIR}/../../../.." ABSOLUTE)
file(GLOB _torch_nvidia_libdirs LIST_DIRECTORIES true "${_torch_site}/nvidia/*/lib")
# The same directories lead the run path, ahead of the toolkit's lib/ that LibTorch's CMake adds,
# so that at run time the process loads the wheel's CUDA runtime and NCCL, never a second copy.
foreach(d IN LISTS _torch_nvidia_libdirs)
  target_link_options(trainscope_torch INTERFACE "LINKER:-rpath-link,${d}" "LINKER:-rpath,${d}")
endforeach()

# --- CUDA --------------------------------------------------------------------------------------------
set(TRAINSCOPE_HAVE_CUDA OFF)
set(_torch_has_cuda OFF)
if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda)
  set(_torch_has_cuda ON)
endif()
if(NOT TRAINSCOPE_USE_CUDA STREQUAL "OFF")
  # CMake 3.25's FindCUDAToolkit marks CUDA::nvToolsExt deprecated without checking that the
  # target exists; CUDA 13 ships no libnvToolsExt (NVTX 3 is header-only), so on a machine where
  # nothing else defined it the configure fails there. An empty stand-in (nothing here links it)
  # keeps the module working.
  if(NOT TARGET CUDA::nvToolsExt)
    add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND AND _torch_has_cuda)
    set(TRAINSCOPE_HAVE_CUDA ON)
  elseif(TRAINSCOPE_USE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TRAINSCOPE_USE_CUDA=ON but the CUDA toolkit found=${CUDAToolkit_FOUND} "
      "and LibTorch CUDA=${_torch_has_cuda}: load a CUDA module / set CUDAToolkit_ROOT, or use a "
      "CUDA build of LibTorch")
  endif()
endif()
set(TRAINSCOPE_CUDA_VERSION "none")
if(TRAINSCOPE_HAVE_CUDA)
  set(TRAINSCOPE_CUDA_VERSION "${CUDAToolkit_VERSION}")
  # One CUDA runtime in the process: the one LibTorch itself loads. A pip torch ships it in its
  # nvidia wheel; trainscope compiles against the toolkit's headers (same major.minor, checked)
  # and links that very library. Other LibTorch distributions use the toolkit's runtime.
  add_library(trainscope_cudart INTERFACE)
  target_include_directories(trainscope_cudart SYSTEM INTERFACE ${CUDAToolkit_INCLUDE_DIRS})
  file(GLOB _wheel_cudart "${_torch_site}/nvidia/cu*/lib/libcudart.so.*")
  if(_wheel_cudart)
    list(GET _wheel_cudart 0 _wheel_cudart)
    string(REGEX MATCH "libcudart\\.so\\.([0-9]+)" _m "${_wheel_cudart}")
    if(NOT CMAKE_MATCH_1 STREQUAL CUDAToolkit_VERSION_MAJOR)
      message(FATAL_ERROR "LibTorch's CUDA runtime (${_wheel_cudart}) is CUDA ${CMAKE_MATCH_1} but "
        "the toolkit is CUDA ${CUDAToolkit_VERSION}: install the torch wheel built for this CUDA "
        "(scripts/setup pins one) or load the matching CUDA module")
    endif()
    target_link_libraries(trainscope_cudart INTERFACE ${_wheel_cudart})
    set(TRAINSCOPE_CUDART "${_wheel_cudart} (LibTorch's wheel)")
  else()
    target_link_libraries(trainscope_cudart INTERFACE CUDA::cudart)
    set(TRAINSCOPE_CUDART "${CUDA_cudart_LIBRARY} (toolkit)")
  endif()
endif()

# --- NCCL: prefer the copy LibTorch itself loads (pip's nvidia-nccl), so one NCCL is in the process --
set(TRAINSCOPE_HAVE_NCCL OFF)
set(TRAINSCOPE_NCCL_VERSION "none")
if(TRAINSCOPE_HAVE_CUDA AND NOT TRAINSCOPE_USE_NCCL STREQUAL "OFF")
  set(_nccl_hints "")
  if(TRAINSCOPE_PYTHON)
    execute_process(COMMAND ${TRAINSCOPE_PYTHON} -c
      "import importlib.util as u; s=u.find_spec('nvidia.nccl'); print(list(s.submodule_search_locations)[0] if s else '')"
      OUTPUT_VARIABLE _pip_nccl OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_pip_nccl)
      list(APPEND _nccl_hints ${_pip_nccl})
    endif()
  endif()
  if(_nccl_hints)
    find_path(NCCL_INCLUDE_DIR nccl.h PATHS ${_nccl_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
    find_library(NCCL_LIBRARY NAMES libnccl.so.2 nccl PATHS ${_nccl_hints} PATH_SUFFIXES lib
                 NO_DEFAULT_PATH)
  endif()
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} $ENV{NCCL_HOME} PATH_SUFFIXES include
            PATHS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints} $ENV{NCCL_HOME}
               PATH_SUFFIXES lib lib64 PATHS ${CUDAToolkit_LIBRARY_DIR})
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_ver REGEX "#define NCCL_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*"
           "\\1.\\2.\\3" TRAINSCOPE_NCCL_VERSION "${_nccl_ver}")
    add_library(trainscope_nccl INTERFACE)
    target_include_directories(trainscope_nccl SYSTEM INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(trainscope_nccl INTERFACE ${NCCL_LIBRARY} trainscope_cudart)
    set(TRAINSCOPE_HAVE_NCCL ON)
  elseif(TRAINSCOPE_USE_NCCL STREQUAL "ON")
    message(FATAL_ERROR "TRAINSCOPE_USE_NCCL=ON but nccl.h/libnccl were not found: set NCCL_HOME")
  endif()
elseif(TRAINSCOPE_USE_NCCL STREQUAL "ON")
  message(FATAL_ERROR "TRAINSCOPE_USE_NCCL=ON needs the CUDA path (TRAINSCOPE_USE_CUDA != OFF, a "
    "CUDA toolkit and a CUDA build of LibTorch)")
endif()

# One precompiled header for every translation unit that includes LibTorch.
if(TRAINSCOPE_USE_PCH)
  file(WRITE ${CMAKE_BINARY_DIR}/trainscope_pch.cpp "// precompiled LibTorch headers\n")
  add_library(trainscope_torch_pch OBJECT ${CMAKE_BINARY_DIR}/trainscope_pch.cpp)
  target_link_libraries(trainscope_torch_pch PUBLIC trainscope_torch)
  target_precompile_headers(trainscope_torch_pch PRIVATE <torch/torch.h>)
  set_target_properties(trainscope_torch_pch PROPERTIES POSITION_INDEPENDENT_CODE ON)
endif()
