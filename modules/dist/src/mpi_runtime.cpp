// MPI start-up/shut-down, topology discovery and collective error agreement. No LibTorch here: this
// file is what every rank runs first, and it stays cheap to compile.
#include "trainscope/dist/mpi_runtime.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

#include "mpi_check.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/dist/topology.hpp"

namespace trainscope::dist {
namespace {

std::atomic<bool> g_aborted{false};

std::string first_line(const std::string& text) {
    return text.substr(0, text.find('\n'));
}

std::string local_hostname() {
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    if (MPI_Get_processor_name(name, &len) == MPI_SUCCESS && len > 0) return std::string(name, len);
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) == 0) return host;
    return "unknown";
}

template <class E> [[noreturn]] void raise_collective(const std::string& message) {
    E error(message);
    error.set_collective(true);
    throw error;
}

// An error of `kind` as the typed exception main() and tests catch, marked collective.
[[noreturn]] void throw_kind(core::ErrorKind kind, const std::string& message) {
    switch (kind) {
    case core::ErrorKind::Config:
        raise_collective<core::ConfigError>(message);
    case core::ErrorKind::Input:
        raise_collective<core::InputError>(message);
    case core::ErrorKind::Output:
        raise_collective<core::OutputError>(message);
    case core::ErrorKind::Distributed:
        raise_collective<core::DistributedError>(message);
    case core::ErrorKind::Numerical:
        raise_collective<core::NumericalError>(message);
    case core::ErrorKind::Internal:
        break;
    }
    raise_collective<core::InternalError>(message);
}

} // namespace

MpiRuntime::MpiRuntime(int& argc, char**& argv, int thread_level) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) {
        MPI_Query_thread(&provided_);
    } else {
        if (MPI_Init_thread(&argc, &argv, thread_level, &provided_) != MPI_SUCCESS)
            throw core::DistributedError("MPI_Init_thread failed: was trainscope started with "
                                         "mpiexec/srun under a working MPI installation?");
        owns_mpi_ = true;
    }
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    core::log::set_identity(rank, size, local_hostname());
}

MpiRuntime::~MpiRuntime() {
    if (!owns_mpi_ || g_aborted) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

void MpiRuntime::abort(int code) {
    g_aborted = true;
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code); // MPI_Abort should not return; make sure this rank ends regardless
}

std::string thread_level_name(int level) {
    if (level == MPI_THREAD_SINGLE) return "MPI_THREAD_SINGLE";
    if (level == MPI_THREAD_FUNNELED) return "MPI_THREAD_FUNNELED";
    if (level == MPI_THREAD_SERIALIZED) return "MPI_THREAD_SERIALIZED";
    if (level == MPI_THREAD_MULTIPLE) return "MPI_THREAD_MULTIPLE";
    return "thread level " + std::to_string(level);
}

std::string mpi_library_version() {
    char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int len = 0;
    MPI_Get_library_version(text, &len);
    std::string version(text, std::max(len, 0));
    version = first_line(version);
    while (!version.empty() && (version.back() == '\0' || version.back() == ' '))
        version.pop_back();
    return version;
}

Topology discover_topology(MPI_Comm comm) {
    Topology t;
    MPI_CHECK(MPI_Comm_rank(comm, &t.rank));
    MPI_CHECK(MPI_Comm_size(comm, &t.world_size));

    // Ranks sharing memory form a node; key=rank keeps local ranks in world order.
    MPI_Comm local = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, t.rank, MPI_INFO_NULL, &local));
    MPI_CHECK(MPI_Comm_rank(local, &t.local_rank));
    MPI_CHECK(MPI_Comm_size(local, &t.local_size));

    // Node leaders (local rank 0) ordered by world rank number the nodes.
    MPI_Comm leaders = MPI_COMM_NULL;
    MPI_CHECK(MPI_Comm_split(comm, t.local_rank == 0 ? 0 : MPI_UNDEFINED, t.rank, &leaders));
    int node_info[2] = {0, 1}; // node index, number of nodes
    if (leaders != MPI_COMM_NULL) {
        MPI_CHECK(MPI_Comm_rank(leaders, &node_info[0]));
        MPI_CHECK(MPI_Comm_size(leaders, &node_info[1]));
        MPI_Comm_free(&leaders);
    }
    MPI_CHECK(MPI_Bcast(node_info, 2, MPI_INT, 0, local));
    MPI_Comm_free(&local);
    t.node = node_info[0];
    t.num_nodes = node_info[1];

    t.hostname = local_hostname();
    std::vector<char> mine(MPI_MAX_PROCESSOR_NAME, '\0');
    std::copy_n(t.hostname.begin(), std::min<std::size_t>(t.hostname.size(), mine.size() - 1),
                mine.begin());
    std::vector<char> all(mine.size() * static_cast<std::size_t>(t.world_size));
    MPI_CHECK(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, all.data(),
                            static_cast<int>(mine.size()), MPI_CHAR, comm));
    for (int r = 0; r < t.world_size; ++r)
        t.hostnames.emplace_back(all.data() + r * mine.size());
    return t;
}

void agree_on_errors(MPI_Comm comm, const std::function<void()>& fn) {
    std::exception_ptr error;
    std::string message;
    core::ErrorKind kind = core::ErrorKind::Internal;
    try {
        fn();
    } catch (const core::Error& e) {
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
    int failed = error ? 1 : 0;
    std::vector<int> flags(static_cast<std::size_t>(size));
    MPI_CHECK(MPI_Allgather(&failed, 1, MPI_INT, flags.data(), 1, MPI_INT, comm));
    std::vector<int> failing;
    for (int r = 0; r < size; ++r)
        if (flags[r]) failing.push_back(r);
    if (failing.empty()) return;

    // Every rank, failing or not, joins the broadcast of the lowest failing rank's error kind and
    // first message line; then each rank raises.
    const int root = failing.front();
    std::string line = first_line(message);
    int header[2] = {static_cast<int>(kind), static_cast<int>(line.size())};
    MPI_CHECK(MPI_Bcast(header, 2, MPI_INT, root, comm));
    line.resize(static_cast<std::size_t>(header[1]));
    if (header[1] > 0) MPI_CHECK(MPI_Bcast(line.data(), header[1], MPI_CHAR, root, comm));

    if (error) {
        // Our own error, unchanged but marked: every rank is raising together.
        try {
            std::rethrow_exception(error);
        } catch (core::Error& e) {
            e.set_collective(true);
            throw;
        } catch (...) {
            throw_kind(core::ErrorKind::Internal, message);
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
    throw_kind(static_cast<core::ErrorKind>(header[0]), who + line);
}

} // namespace trainscope::dist
