// Versions of everything trainscope was built with, for --version and the run file's /build group.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace trainscope::core {

struct BuildInfo {
    std::string trainscope_version;
    std::string git_sha;
    std::string compiler;
    std::string build_type;
    std::string libtorch;
    std::string cuda; // "none" when built without CUDA
    std::string nccl; // "none" when built without NCCL
    std::string mpi;  // compile-time MPI standard + library (runtime library version added by dist)
    std::string hdf5;
    std::vector<std::string> features; // e.g. "cuda", "nccl", "parallel-hdf5"

    std::vector<std::pair<std::string, std::string>> items() const;
    std::string describe() const; // multi-line text for --version
};

// Build information as configured by CMake (see build_config.hpp.in).
BuildInfo build_info();

} // namespace trainscope::core
