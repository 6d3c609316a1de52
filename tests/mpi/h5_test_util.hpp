// HDF5 read-back helpers shared by the MPI test suites (rank 0 reads a closed run file).
#pragma once

#include <hdf5.h>

#include <cstdint>
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

// Variable-length string attribute `name` of object `obj`; a "<missing …>" / "<not a …>" marker
// (which no test expects) when it is absent or of another type.
inline std::string read_string_attr(hid_t file, const std::string& obj, const std::string& name) {
    const hid_t a = H5Aopen_by_name(file, obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0) return "<missing " + obj + "@" + name + ">";
    const hid_t t = H5Aget_type(a);
    std::string value = "<not a variable-length string>";
    char* text = nullptr;
    if (H5Tget_class(t) == H5T_STRING && H5Tis_variable_str(t) > 0 && H5Aread(a, t, &text) >= 0) {
        value = text ? text : "";
        H5free_memory(text);
    }
    H5Tclose(t);
    H5Aclose(a);
    return value;
}

// Integer attribute `name` of object `obj`; -12345 when it is absent or not an integer.
inline std::int64_t read_int_attr(hid_t file, const std::string& obj, const std::string& name) {
    std::int64_t v = -12345;
    const hid_t a = H5Aopen_by_name(file, obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0) return v;
    const hid_t t = H5Aget_type(a);
    if (H5Tget_class(t) == H5T_INTEGER) H5Aread(a, H5T_NATIVE_INT64, &v);
    H5Tclose(t);
    H5Aclose(a);
    return v;
}

} // namespace trainscope::testing
