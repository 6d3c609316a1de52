# The dependencies that come from the system (Debian packages or cluster modules), everything but
# LibTorch and CUDA: included by TrainscopeDependencies and by the sanitizer build (tests/fuzz).

# --- MPI -----------------------------------------------------------------------------------------
find_package(MPI 3.0 REQUIRED COMPONENTS C CXX)

# --- parallel HDF5 ---------------------------------------------------------------------------------
set(HDF5_PREFER_PARALLEL TRUE)
find_package(HDF5 REQUIRED COMPONENTS C)
include(TrainscopeCheckParallelHDF5)
trainscope_check_parallel_hdf5()

# --- Boost.Program_options, GoogleTest, zlib -------------------------------------------------------
find_package(Boost 1.71 REQUIRED COMPONENTS program_options)
find_package(ZLIB REQUIRED)
# JSON (safetensors headers, config.json, tokenizer.json, JSON/JSONL datasets): Debian nlohmann-json3-dev.
find_package(nlohmann_json 3.10 REQUIRED)
# Logging (timestamped, rank-prefixed lines; core/src/log.cpp): Debian libspdlog-dev (with fmt).
find_package(spdlog 1.9 REQUIRED)
if(TRAINSCOPE_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
