#include "run_file_support.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "trainscope/core/error.hpp"
#include "trainscope/core/mpi_util.hpp"
#include "trainscope/io/run_file.hpp"
#include "trainscope/io/schema.hpp"

namespace trainscope::io::detail {

namespace fs = std::filesystem;

namespace {

// Attributes travel from rank 0 as one byte string: per attribute the variant index, the name and
// the value (strings length-prefixed).
template <class T> void put(std::string& out, const T& value) {
    out.append(reinterpret_cast<const char*>(&value), sizeof value);
}
void put_text(std::string& out, const std::string& text) {
    put(out, static_cast<std::uint64_t>(text.size()));
    out += text;
}
template <class T> T take(const std::string& in, std::size_t& pos) {
    T value;
    std::memcpy(&value, in.data() + pos, sizeof value);
    pos += sizeof value;
    return value;
}
std::string take_text(const std::string& in, std::size_t& pos) {
    const auto n = take<std::uint64_t>(in, pos);
    std::string text = in.substr(pos, n);
    pos += n;
    return text;
}

} // namespace

// MPI failures in the run file are DistributedErrors naming the call (core's MPI_CHECK).
void mpi_check(int rc, const char* call) {
    core::mpi_check(rc, call, __FILE__, __LINE__);
}

// Replaces `text` on every rank by rank `root`'s value.
void bcast_string(MPI_Comm comm, std::string& text, int root) {
    text = core::broadcast_string(comm, text, root);
}

// Collective agreement on a step that may fail on some ranks only (core::first_failure).
std::string agree_on_error(MPI_Comm comm, const std::string& local_error) {
    return core::first_failure(comm, local_error);
}

[[noreturn]] void throw_collective_output_error(const std::string& message) {
    core::OutputError error(message);
    error.set_collective(true);
    throw error;
}

std::string pack(const std::vector<Attribute>& attrs) {
    std::string out;
    put(out, static_cast<std::uint64_t>(attrs.size()));
    for (const auto& a : attrs) {
        put(out, static_cast<std::uint8_t>(a.value.index()));
        put_text(out, a.name);
        if (auto* i = std::get_if<std::int64_t>(&a.value)) put(out, *i);
        if (auto* d = std::get_if<double>(&a.value)) put(out, *d);
        if (auto* s = std::get_if<std::string>(&a.value)) put_text(out, *s);
    }
    return out;
}

std::vector<Attribute> unpack(const std::string& in) {
    std::size_t pos = 0;
    std::vector<Attribute> attrs(take<std::uint64_t>(in, pos));
    for (auto& a : attrs) {
        const auto index = take<std::uint8_t>(in, pos);
        a.name = take_text(in, pos);
        if (index == 0) a.value = take<std::int64_t>(in, pos);
        if (index == 1) a.value = take<double>(in, pos);
        if (index == 2) a.value = take_text(in, pos);
    }
    return attrs;
}

std::string parent_of(const std::string& normalized) {
    const std::size_t slash = normalized.rfind('/');
    return slash == 0 ? "/" : normalized.substr(0, slash);
}

// Rank 0's check before any rank touches the file: "" when `path` may be created.
std::string check_output_path(const std::string& path, bool overwrite) {
    if (path.empty()) return "output.file is empty; set output.file to the path of the run file";
    std::error_code ec;
    const fs::path file(path);
    const fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
    const auto dir_status = fs::status(dir, ec);
    if (!fs::exists(dir_status)) {
        return "cannot create output file '" + path + "': directory '" + dir.string() +
               "' does not exist (" +
               (ec ? ec.message() : std::string("No such file or directory")) +
               "); create it (mkdir -p " + dir.string() +
               ") or set output.file to a path in an existing directory";
    }
    if (!fs::is_directory(dir_status)) {
        return "cannot create output file '" + path + "': '" + dir.string() +
               "' is not a directory; set output.file to a path in an existing directory";
    }
    // A symbolic link stands for its target: an existing target is kept unless
    // output.overwrite=true, which replaces the target's content (the link stays). A dangling link
    // is refused: creating its target would put the run file somewhere output.file does not name.
    const bool is_link = fs::is_symlink(fs::symlink_status(file, ec));
    const std::string link_note =
        is_link ? " (a symbolic link to '" + fs::read_symlink(file, ec).string() + "')" : "";
    const auto file_status = fs::status(file, ec);
    if (is_link && !fs::exists(file_status)) {
        return "output file '" + path + "'" + link_note +
               " is a dangling link: its target does not exist; remove the link or set "
               "output.file to another path";
    }
    if (fs::exists(file_status)) {
        if (fs::is_directory(file_status)) {
            return "output file '" + path + "'" + link_note +
                   " is a directory; set output.file to a file path inside it";
        }
        // Opening a FIFO for writing blocks until a reader comes; a device is no run file.
        if (!fs::is_regular_file(file_status)) {
            return "output file '" + path + "'" + link_note +
                   " exists and is not a regular file (a FIFO, device or socket): set "
                   "output.file to the path of a regular file";
        }
        if (!overwrite) {
            return "output file '" + path + "'" + link_note +
                   " exists; set output.overwrite=true or choose another output.file";
        }
        // Opening for writing (without truncating) proves we may replace it.
        const int fd = ::open(path.c_str(), O_WRONLY);
        if (fd < 0) {
            return "cannot overwrite output file '" + path + "': " + std::strerror(errno) +
                   "; fix its permissions or choose another output.file";
        }
        ::close(fd);
        return "";
    }
    // Creating (and removing) the file itself gives the OS's real answer, also for root on
    // read-only file systems, where access(2) would say yes.
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0 && errno == EEXIST) // created since the check above (another job starting?)
        return "output file '" + path +
               "' exists; set output.overwrite=true or choose another output.file";
    if (fd < 0) {
        return "cannot create output file '" + path + "' in directory '" + dir.string() +
               "': " + std::strerror(errno) +
               "; choose a writable directory with output.file or fix the directory's permissions";
    }
    ::close(fd);
    ::unlink(path.c_str());
    return "";
}

Handle variable_string_type(const std::string& file) {
    Handle type(H5_CHECK(H5Tcopy(H5T_C_S1), file, "string type"), H5Tclose);
    H5_CHECK(H5Tset_size(type, H5T_VARIABLE), file, "string type");
    H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8), file, "string type");
    return type;
}

// Fixed-length UTF-8 string of `width` bytes, padded with NULs (h5py reads it as bytes).
Handle fixed_string_type(std::size_t width, const std::string& file) {
    Handle type(H5_CHECK(H5Tcopy(H5T_C_S1), file, "string type"), H5Tclose);
    H5_CHECK(H5Tset_size(type, std::max<std::size_t>(width, 1)), file, "string type");
    H5_CHECK(H5Tset_strpad(type, H5T_STR_NULLPAD), file, "string type");
    H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8), file, "string type");
    return type;
}

} // namespace trainscope::io::detail

// The public io functions that need no open RunFile (run_file.hpp).
namespace trainscope::io {

using namespace detail;

std::string utc_iso8601(std::time_t when) {
    std::tm tm{};
    gmtime_r(&when, &tm);
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return text;
}

std::string utc_now_iso8601() {
    return utc_iso8601(std::time(nullptr));
}

std::size_t series_chunk_rows(std::int64_t rows, int world_size) {
    const std::int64_t ranks = std::max(world_size, 1);
    const std::int64_t most = std::max<std::int64_t>(1, (std::int64_t{1} << 20) / (8 * ranks));
    std::int64_t chunk = 8;
    while (chunk < rows && chunk < most)
        chunk *= 2;
    return static_cast<std::size_t>(std::min(chunk, most));
}

void annotate_closed_run_file(const std::string& path, const std::vector<Attribute>& attrs) {
    detail::silence_hdf5_error_printing();
    for (const Attribute& a : attrs) // the table declares what is added to a closed file too
        schema::require_member(path, schema::Kind::attribute, "/", a.name, "");
    // Serial access (default file driver) by one process: the job that wrote the file is gone.
    Handle file(H5_CHECK(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), path, "/"), H5Fclose);
    Handle root(H5_CHECK(H5Gopen2(file, "/", H5P_DEFAULT), path, "/"), H5Gclose);
    Handle scalar(H5_CHECK(H5Screate(H5S_SCALAR), path, "/"), H5Sclose);
    for (const Attribute& a : attrs) {
        const std::string where = "/@" + a.name;
        if (H5_CHECK(H5Aexists(root, a.name.c_str()), path, where) > 0)
            H5_CHECK(H5Adelete(root, a.name.c_str()), path, where);
        if (auto* i = std::get_if<std::int64_t>(&a.value)) {
            Handle attr(H5_CHECK(H5Acreate2(root, a.name.c_str(), H5T_STD_I64LE, scalar,
                                            H5P_DEFAULT, H5P_DEFAULT),
                                 path, where),
                        H5Aclose);
            H5_CHECK(H5Awrite(attr, H5T_NATIVE_INT64, i), path, where);
        } else if (auto* d = std::get_if<double>(&a.value)) {
            Handle attr(H5_CHECK(H5Acreate2(root, a.name.c_str(), H5T_IEEE_F64LE, scalar,
                                            H5P_DEFAULT, H5P_DEFAULT),
                                 path, where),
                        H5Aclose);
            H5_CHECK(H5Awrite(attr, H5T_NATIVE_DOUBLE, d), path, where);
        } else {
            const char* text = std::get<std::string>(a.value).c_str();
            Handle type = variable_string_type(path);
            Handle attr(
                H5_CHECK(H5Acreate2(root, a.name.c_str(), type, scalar, H5P_DEFAULT, H5P_DEFAULT),
                         path, where),
                H5Aclose);
            H5_CHECK(H5Awrite(attr, type, &text), path, where);
        }
    }
    root.reset();
    H5_CHECK(H5Fclose(file.get()), path, "/");
    file.release();
}

} // namespace trainscope::io
