// The run file's support routines (internal to io): MPI agreement, the attribute byte strings
// broadcast from rank 0, output-path checks and HDF5 string types.
#pragma once

#include <mpi.h>

#include <array>
#include <string>
#include <vector>

#include "h5_internal.hpp"
#include "trainscope/io/run_file.hpp"

namespace trainscope::io::detail {

inline const std::array<const char*, 4> kStatuses = {"running", "completed", "failed",
                                                     "interrupted"};

// MPI failures in the run file are DistributedErrors naming the call (core's MPI_CHECK).
void mpi_check(int rc, const char* call);

// Replaces `text` on every rank by rank `root`'s value.
void bcast_string(MPI_Comm comm, std::string& text, int root = 0);

// Collective agreement on a step that may fail on some ranks only (core::first_failure).
std::string agree_on_error(MPI_Comm comm, const std::string& local_error);

[[noreturn]] void throw_collective_output_error(const std::string& message);

// Attributes travel from rank 0 as one byte string: per attribute the variant index, the name and
// the value (strings length-prefixed).
std::string pack(const std::vector<Attribute>& attrs);

std::vector<Attribute> unpack(const std::string& in);

std::string parent_of(const std::string& normalized);

// Rank 0's check before any rank touches the file: "" when `path` may be created.
std::string check_output_path(const std::string& path, bool overwrite);

Handle variable_string_type(const std::string& file);

// Fixed-length UTF-8 string of `width` bytes, padded with NULs (h5py reads it as bytes).
Handle fixed_string_type(std::size_t width, const std::string& file);

} // namespace trainscope::io::detail
