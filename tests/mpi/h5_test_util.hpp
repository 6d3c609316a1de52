// HDF5 read-back helpers shared by the MPI test suites (rank 0 reads a closed run file).
#pragma once

#include <hdf5.h>

#include <string>
#include <vector>

namespace trainscope::testing {

// All elements of dataset `path` converted to `mem_type` (e.g. H5T_NATIVE_DOUBLE), flattened;
// empty when the dataset is missing or empty.
template <class T>
std::vector<T> read_dataset(hid_t file, const std::string& path, hid_t mem_type) {
    const hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
    if (d < 0) return {};
    const hid_t s = H5Dget_space(d);
    std::vector<T> v(static_cast<std::size_t>(H5Sget_simple_extent_npoints(s)));
    if (!v.empty()) H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Sclose(s);
    H5Dclose(d);
    return v;
}

} // namespace trainscope::testing
