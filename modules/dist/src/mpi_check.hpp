// MPI_CHECK: turns a failing MPI call into a DistributedError naming the call and MPI's own
// message. Only meaningful on communicators whose error handler is MPI_ERRORS_RETURN (ours are; the
// default MPI_ERRORS_ARE_FATAL aborts before we could report).
#pragma once

#include <mpi.h>

#include <string>

#include "trainscope/core/error.hpp"

namespace trainscope::dist::detail {

inline void mpi_check(int code, const char* call, const char* file, int line) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
    throw core::DistributedError(std::string(call) + " failed: " + std::string(text, len) + " (" +
                                 file + ":" + std::to_string(line) + ")");
}

} // namespace trainscope::dist::detail

#define MPI_CHECK(call) ::trainscope::dist::detail::mpi_check((call), #call, __FILE__, __LINE__)
