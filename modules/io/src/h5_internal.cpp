// HDF5 error reporting for the io module: the library's error stack is read into the exception
// message (innermost, most specific entries first) instead of being printed by HDF5 itself.
#include "h5_internal.hpp"

#include "trainscope/core/error.hpp"

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

} // namespace

void silence_hdf5_error_printing() {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

void throw_h5_error(std::string_view call, std::string_view file, std::string_view object) {
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
    throw core::OutputError(message);
}

} // namespace trainscope::io::detail
