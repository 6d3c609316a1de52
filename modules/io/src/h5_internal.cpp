// HDF5 error reporting for the io module: the library's error stack is read into the exception
// message (innermost, most specific entries first) instead of being printed by HDF5 itself.
#include "h5_internal.hpp"

#include "trainscope/core/error.hpp"

#include <sys/statvfs.h>

#include <cerrno>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <vector>

namespace trainscope::io::detail {

namespace {

herr_t collect_error(unsigned /*n*/, const H5E_error2_t* err, void* data) {
    auto* lines = static_cast<std::vector<std::string>*>(data);
    std::string line = err->desc && *err->desc ? err->desc : "(no description)";
    char minor[160] = {0};
    if (H5Eget_msg(err->min_num, nullptr, minor, sizeof minor) > 0) {
        line += " [";
        line += minor;
        line += "]";
    }
    if (err->func_name) line += " in " + std::string(err->func_name);
    lines->push_back(std::move(line));
    return 0;
}

// HDF5's MPI-IO driver reports a failed write without the OS's reason ("file write failed"): a
// full or read-only file system under the run file is named here, with the fix.
std::string file_system_diagnosis(std::string_view file, int saved_errno) {
    std::filesystem::path dir = std::filesystem::path(file).parent_path();
    if (dir.empty()) dir = ".";
    struct statvfs fs {};
    if (::statvfs(dir.c_str(), &fs) != 0) return "";
    if (fs.f_flag & ST_RDONLY)
        return "; the file system holding '" + dir.string() +
               "' is read-only (Read-only file system): set output.file to a writable location";
    const double free_bytes = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize);
    constexpr double kNearlyFull = 4.0 * 1024 * 1024;
    if (saved_errno != ENOSPC && free_bytes >= kNearlyFull) return "";
    std::ostringstream o;
    o << "; the file system holding '" << dir.string()
      << "' is full (No space left on device: " << std::fixed << std::setprecision(0)
      << free_bytes / 1024 << " KiB free): free space there "
      << "or set output.file to a file system with room (this run file is incomplete)";
    return o.str();
}

} // namespace

void silence_hdf5_error_printing() {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

void throw_h5_error(std::string_view call, std::string_view file, std::string_view object) {
    const int saved_errno = errno; // the failed write's, if HDF5 left it
    std::vector<std::string> lines;
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &lines);
    H5Eclear2(H5E_DEFAULT);

    // "H5Dwrite(ds, ...)" -> "H5Dwrite": the arguments are C identifiers, useless to a user.
    std::string function(call.substr(0, call.find('(')));
    std::string message = "HDF5 " + function + " failed on '" + std::string(file) + "'";
    if (!object.empty()) message += " (" + std::string(object) + ")";
    if (lines.empty()) {
        message += ": no HDF5 error details";
    } else {
        // The innermost entries name the cause (e.g. "errno = 28, ... No space left on device");
        // the outer ones only repeat the API call.
        message += ": ";
        const std::size_t shown = std::min<std::size_t>(lines.size(), 3);
        for (std::size_t i = 0; i < shown; ++i)
            message += (i ? "; " : "") + lines[i];
    }
    message += file_system_diagnosis(file, saved_errno);
    throw core::OutputError(message);
}

} // namespace trainscope::io::detail
