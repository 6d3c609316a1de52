// Build information from the generated build_config.hpp.
#include "trainscope/core/build_info.hpp"

#include "trainscope/core/build_config.hpp"

namespace trainscope::core {

BuildInfo build_info() {
    BuildInfo b;
    b.trainscope_version = TRAINSCOPE_VERSION;
    b.git_sha = TRAINSCOPE_GIT_SHA;
    b.compiler = TRAINSCOPE_COMPILER;
    b.build_type = TRAINSCOPE_BUILD_TYPE;
    b.libtorch = TRAINSCOPE_LIBTORCH_VERSION;
    b.cuda = TRAINSCOPE_CUDA_VERSION;
    b.nccl = TRAINSCOPE_NCCL_VERSION;
    b.mpi = std::string("MPI ") + TRAINSCOPE_MPI_VERSION;
    b.hdf5 = TRAINSCOPE_HDF5_VERSION;
    b.features.push_back("parallel-hdf5");
    if (TRAINSCOPE_HAVE_CUDA) b.features.push_back("cuda");
    if (TRAINSCOPE_HAVE_NCCL) b.features.push_back("nccl");
    return b;
}

std::vector<std::pair<std::string, std::string>> BuildInfo::items() const {
    std::string feats;
    for (const auto& f : features)
        feats += (feats.empty() ? "" : ",") + f;
    return {{"trainscope", trainscope_version},
            {"git_sha", git_sha},
            {"compiler", compiler},
            {"build_type", build_type},
            {"libtorch", libtorch},
            {"cuda", cuda},
            {"nccl", nccl},
            {"mpi", mpi},
            {"hdf5", hdf5},
            {"features", feats}};
}

std::string BuildInfo::describe() const {
    std::string out;
    for (const auto& [k, v] : items())
        out += k + ": " + v + "\n";
    return out;
}

} // namespace trainscope::core
