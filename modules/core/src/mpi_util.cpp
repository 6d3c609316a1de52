// The shared MPI helpers (see mpi_util.hpp).
#include "trainscope/core/mpi_util.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <iomanip>
#include <sstream>
#include <thread>

#include "trainscope/core/error.hpp"

namespace trainscope::core {
namespace {

std::string first_line(const std::string& text) {
    return text.substr(0, text.find('\n'));
}

template <class E> [[noreturn]] void raise_collective(const std::string& message) {
    E error(message);
    error.set_collective(true);
    throw error;
}

// An error of `kind` as the typed exception main() and tests catch, marked collective.
[[noreturn]] void throw_kind(ErrorKind kind, const std::string& message) {
    switch (kind) {
    case ErrorKind::Config:
        raise_collective<ConfigError>(message);
    case ErrorKind::Input:
        raise_collective<InputError>(message);
    case ErrorKind::Output:
        raise_collective<OutputError>(message);
    case ErrorKind::Distributed:
        raise_collective<DistributedError>(message);
    case ErrorKind::Numerical:
        raise_collective<NumericalError>(message);
    case ErrorKind::Internal:
        break;
    }
    raise_collective<InternalError>(message);
}

} // namespace

void mpi_check(int code, const char* call, const char* file, int line) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {0};
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
    throw DistributedError(std::string(call) + " failed: " + std::string(text, len) + " (" + file +
                           ":" + std::to_string(line) + ")");
}

std::string peer_timeout_message(const std::string& what, double timeout_s) {
    std::ostringstream o;
    o << what << " did not complete within dist.timeout=" << std::setprecision(6) << timeout_s
      << " s: a peer rank stopped making progress (stopped or hung process, stalled file system, "
         "unreachable node) or is far behind. The job is aborted so that no rank waits forever; "
         "the ranks that do not report this wait are the ones to look at. Raise dist.timeout if "
         "steps, evaluation or checkpoint writes legitimately take longer";
    return o.str();
}

void wait_for_peers(MPI_Request& request, double timeout_s, const char* what) {
    int done = 0;
    MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return; // the common case of a small collective: no clock read at all
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    // The polling schedule of the header: spin, then yield, then sleep with a growing interval.
    constexpr double kSpinS = 2e-3, kYieldS = 20e-3;
    auto nap = std::chrono::microseconds(50);
    bool spinning = true;
    for (unsigned polls = 1;; ++polls) {
        MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
        if (done) return;
        if (spinning && polls % 64 != 0) continue; // spinning: the clock every 64th poll only
        const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
        if (timeout_s > 0 && waited > timeout_s)
            throw PeerTimeoutError(peer_timeout_message(what, timeout_s));
        spinning = waited < kSpinS;
        if (spinning) continue;
        if (waited < kYieldS) {
            sched_yield();
            continue;
        }
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, std::chrono::microseconds(250));
    }
}

std::string broadcast_string(MPI_Comm comm, const std::string& text, int root, double timeout_s) {
    constexpr const char* kWhat = "a broadcast of a string between the ranks";
    // On the heap: a timed-out broadcast may still write into its buffers (wait_for_peers).
    struct Buffers {
        std::uint64_t size = 0;
        std::string text;
    };
    auto b = std::make_unique<Buffers>();
    b->text = text;
    b->size = text.size();
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Ibcast(&b->size, 1, MPI_UINT64_T, root, comm, &request));
    wait_for_peers(request, b, timeout_s, kWhat);
    b->text.resize(b->size);
    constexpr std::uint64_t piece = 1u << 30; // MPI counts are int
    for (std::uint64_t off = 0; off < b->size; off += piece) {
        const int n = static_cast<int>(std::min(piece, b->size - off));
        MPI_CHECK(MPI_Ibcast(b->text.data() + off, n, MPI_CHAR, root, comm, &request));
        wait_for_peers(request, b, timeout_s, kWhat);
    }
    return std::move(b->text);
}

std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& mine) {
    int size = 1;
    MPI_CHECK(MPI_Comm_size(comm, &size));
    int len = static_cast<int>(mine.size());
    std::vector<int> lens(static_cast<std::size_t>(size)), offs(static_cast<std::size_t>(size));
    MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm));
    int total = 0;
    for (int i = 0; i < size; ++i)
        offs[i] = total, total += lens[i];
    std::string all(static_cast<std::size_t>(total), '\0');
    MPI_CHECK(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(),
                             MPI_CHAR, comm));
    std::vector<std::string> out;
    for (int i = 0; i < size; ++i)
        out.push_back(
            all.substr(static_cast<std::size_t>(offs[i]), static_cast<std::size_t>(lens[i])));
    return out;
}

std::vector<std::string> gather_strings(MPI_Comm comm, const std::string& mine, int root) {
    int rank = 0, size = 1;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    MPI_CHECK(MPI_Comm_size(comm, &size));
    int len = static_cast<int>(mine.size());
    std::vector<int> lens(rank == root ? static_cast<std::size_t>(size) : 0), offs(lens.size());
    MPI_CHECK(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, root, comm));
    int total = 0;
    for (std::size_t i = 0; i < lens.size(); ++i)
        offs[i] = total, total += lens[i];
    std::string all(static_cast<std::size_t>(total), '\0');
    MPI_CHECK(MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(),
                          MPI_CHAR, root, comm));
    std::vector<std::string> out;
    for (std::size_t i = 0; i < lens.size(); ++i)
        out.push_back(
            all.substr(static_cast<std::size_t>(offs[i]), static_cast<std::size_t>(lens[i])));
    return out;
}

void broadcast_bytes(MPI_Comm comm, void* data, std::size_t bytes, int root) {
    constexpr std::size_t piece = std::size_t{1} << 30; // MPI counts are int
    auto* p = static_cast<char*>(data);
    for (std::size_t off = 0; off < bytes; off += piece)
        MPI_CHECK(MPI_Bcast(p + off, static_cast<int>(std::min(piece, bytes - off)), MPI_BYTE, root,
                            comm));
}

NodeComm::NodeComm(MPI_Comm comm) {
    int rank = 0;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    // key = rank: local ranks in the order of `comm`, so local rank 0 is the node's lowest rank.
    MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &comm_));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

NodeComm::~NodeComm() {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::string read_whole_file(const std::string& path, std::string& bytes) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return std::string("cannot open: ") + std::strerror(errno);
    struct stat st {};
    std::string error;
    if (::fstat(fd, &st) != 0) {
        error = std::string("cannot stat: ") + std::strerror(errno);
    } else if (!S_ISREG(st.st_mode)) {
        error = "not a regular file";
    } else {
        bytes.resize(static_cast<std::size_t>(st.st_size));
        std::size_t done = 0;
        while (done < bytes.size()) {
            const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
                error = std::string("read failed: ") + std::strerror(errno);
                break;
            }
            if (n == 0) { // shrank while reading
                bytes.resize(done);
                break;
            }
            done += static_cast<std::size_t>(n);
        }
    }
    ::close(fd);
    if (!error.empty()) bytes.clear();
    return error;
}

SharedFile read_file_on_node(MPI_Comm comm, const std::string& path, int reader) {
    int rank = 0;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    SharedFile f;
    if (rank == reader) f.error = read_whole_file(path, f.bytes);
    f.error = broadcast_string(comm, f.error, reader); // the verdict before any data
    if (f.error.empty()) f.bytes = broadcast_string(comm, f.bytes, reader);
    return f;
}

std::string first_failure(MPI_Comm comm, const std::string& local_error) {
    int rank = 0, size = 1;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    MPI_CHECK(MPI_Comm_size(comm, &size));
    int mine = local_error.empty() ? size : rank, first = size;
    MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
    if (first == size) return "";
    std::string message = broadcast_string(comm, local_error, first);
    if (first != 0) message += " (on rank " + std::to_string(first) + ")";
    return message;
}

void agree_on_errors(MPI_Comm comm, const std::function<void()>& fn, double timeout_s) {
    std::exception_ptr error;
    std::string message;
    ErrorKind kind = ErrorKind::Internal;
    try {
        fn();
    } catch (const PeerTimeoutError&) {
        throw; // the peers are out of reach: agreeing with them would wait again
    } catch (const Error& e) {
        error = std::current_exception();
        message = e.what();
        kind = e.kind();
    } catch (const std::exception& e) {
        error = std::current_exception();
        message = e.what();
    } catch (...) {
        error = std::current_exception();
        message = "unknown exception";
    }

    int rank = 0, size = 1;
    MPI_CHECK(MPI_Comm_rank(comm, &rank));
    MPI_CHECK(MPI_Comm_size(comm, &size));
    // On the heap: a timed-out collective may still write into its buffers (wait_for_peers).
    struct Buffers {
        int failed = 0, header = 0;
        std::vector<int> flags;
    };
    auto b = std::make_unique<Buffers>();
    b->failed = error ? 1 : 0;
    b->flags.resize(static_cast<std::size_t>(size));
    constexpr const char* kWhat = "the ranks' agreement on errors";
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Iallgather(&b->failed, 1, MPI_INT, b->flags.data(), 1, MPI_INT, comm, &request));
    wait_for_peers(request, b, timeout_s, kWhat);
    std::vector<int> failing;
    for (int r = 0; r < size; ++r)
        if (b->flags[r]) failing.push_back(r);
    if (failing.empty()) return;

    // Every rank, failing or not, joins the broadcast of the lowest failing rank's error kind and
    // first message line; then each rank raises.
    const int root = failing.front();
    b->header = static_cast<int>(kind);
    MPI_CHECK(MPI_Ibcast(&b->header, 1, MPI_INT, root, comm, &request));
    wait_for_peers(request, b, timeout_s, kWhat);
    const int header = b->header;
    const std::string line = broadcast_string(comm, first_line(message), root, timeout_s);

    if (error) {
        // Our own error, unchanged but marked: every rank is raising together.
        try {
            std::rethrow_exception(error);
        } catch (Error& e) {
            e.set_collective(true);
            throw;
        } catch (...) {
            throw_kind(ErrorKind::Internal, message);
        }
    }
    std::string who;
    if (failing.size() == 1) {
        who = "rank " + std::to_string(root) + " failed: ";
    } else {
        who = "ranks ";
        for (std::size_t i = 0; i < failing.size(); ++i)
            who += (i ? ", " : "") + std::to_string(failing[i]);
        who += " failed; rank " + std::to_string(root) + ": ";
    }
    throw_kind(static_cast<ErrorKind>(header), who + line);
}

} // namespace trainscope::core
