// The PMPI counter of pmpi_counter.hpp: every collective the MPI standard defines on
// intracommunicators that trainscope, HDF5 or the MPI-IO layer call, and the collective MPI-IO
// calls (File_open/close/set_view/set_size/sync and the _all/_at_all transfers).
#include "pmpi_counter.hpp"

#include <mpi.h>

#include <atomic>
#include <mutex>
#include <sstream>

namespace trainscope::testing::pmpi {
namespace {

std::atomic<bool> counting{false};
std::mutex guard;
std::map<std::string, long> global, subset;

bool spans_world(MPI_Comm comm) {
    if (comm == MPI_COMM_NULL) return false;
    int n = 0, world = 0;
    PMPI_Comm_size(comm, &n);
    PMPI_Comm_size(MPI_COMM_WORLD, &world);
    return n == world;
}

bool file_spans_world(MPI_File fh) {
    MPI_Group group, world_group;
    if (PMPI_File_get_group(fh, &group) != MPI_SUCCESS) return true;
    int n = 0, world = 0;
    PMPI_Group_size(group, &n);
    PMPI_Group_free(&group);
    PMPI_Comm_group(MPI_COMM_WORLD, &world_group);
    PMPI_Group_size(world_group, &world);
    PMPI_Group_free(&world_group);
    return n == world;
}

void note(const char* name, bool global_call) {
    std::lock_guard<std::mutex> lock(guard);
    ++(global_call ? global : subset)[name];
}

} // namespace

void reset() {
    std::lock_guard<std::mutex> lock(guard);
    global.clear();
    subset.clear();
    counting = true;
}

void stop() {
    counting = false;
}

std::map<std::string, long> global_counts() {
    std::lock_guard<std::mutex> lock(guard);
    return global;
}

std::map<std::string, long> subset_counts() {
    std::lock_guard<std::mutex> lock(guard);
    return subset;
}

long global_total() {
    long n = 0;
    for (const auto& [name, count] : global_counts())
        n += count;
    return n;
}

std::string describe(const std::map<std::string, long>& counts) {
    std::ostringstream out;
    for (const auto& [name, count] : counts)
        out << (out.tellp() > 0 ? ", " : "") << name << " " << count;
    return out.str().empty() ? "none" : out.str();
}

} // namespace trainscope::testing::pmpi

// Only while counting: the checks themselves call PMPI, never the counted entry points.
#define TS_COUNT_COMM(name, comm)                                                                  \
    if (trainscope::testing::pmpi::counting.load())                                                \
    trainscope::testing::pmpi::note(#name, trainscope::testing::pmpi::spans_world(comm))
#define TS_COUNT_FILE(name, fh)                                                                    \
    if (trainscope::testing::pmpi::counting.load())                                                \
    trainscope::testing::pmpi::note(#name, trainscope::testing::pmpi::file_spans_world(fh))

extern "C" {

int MPI_Barrier(MPI_Comm comm) {
    TS_COUNT_COMM(MPI_Barrier, comm);
    return PMPI_Barrier(comm);
}
int MPI_Bcast(void* buf, int count, MPI_Datatype type, int root, MPI_Comm comm) {
    TS_COUNT_COMM(MPI_Bcast, comm);
    return PMPI_Bcast(buf, count, type, root, comm);
}
int MPI_Allreduce(const void* s, void* r, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
    TS_COUNT_COMM(MPI_Allreduce, comm);
    return PMPI_Allreduce(s, r, count, type, op, comm);
}
int MPI_Reduce(const void* s, void* r, int count, MPI_Datatype type, MPI_Op op, int root,
               MPI_Comm comm) {
    TS_COUNT_COMM(MPI_Reduce, comm);
    return PMPI_Reduce(s, r, count, type, op, root, comm);
}
int MPI_Ireduce(const void* s, void* r, int count, MPI_Datatype type, MPI_Op op, int root,
                MPI_Comm comm, MPI_Request* request) {
    TS_COUNT_COMM(MPI_Ireduce, comm);
    return PMPI_Ireduce(s, r, count, type, op, root, comm, request);
}
int MPI_Iallreduce(const void* s, void* r, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                   MPI_Request* request) {
    TS_COUNT_COMM(MPI_Iallreduce, comm);
    return PMPI_Iallreduce(s, r, count, type, op, comm, request);
}
int MPI_Allgather(const void* s, int sc, MPI_Datatype st, void* r, int rc, MPI_Datatype rt,
                  MPI_Comm comm) {
    TS_COUNT_COMM(MPI_Allgather, comm);
    return PMPI_Allgather(s, sc, st, r, rc, rt, comm);
}
int MPI_Allgatherv(const void* s, int sc, MPI_Datatype st, void* r, const int rc[],
                   const int displs[], MPI_Datatype rt, MPI_Comm comm) {
    TS_COUNT_COMM(MPI_Allgatherv, comm);
    return PMPI_Allgatherv(s, sc, st, r, rc, displs, rt, comm);
}
int MPI_Gather(const void* s, int sc, MPI_Datatype st, void* r, int rc, MPI_Datatype rt, int root,
               MPI_Comm comm) {
    TS_COUNT_COMM(MPI_Gather, comm);
    return PMPI_Gather(s, sc, st, r, rc, rt, root, comm);
}
int MPI_Gatherv(const void* s, int sc, MPI_Datatype st, void* r, const int rc[], const int displs[],
                MPI_Datatype rt, int root, MPI_Comm comm) {
    TS_COUNT_COMM(MPI_Gatherv, comm);
    return PMPI_Gatherv(s, sc, st, r, rc, displs, rt, root, comm);
}
int MPI_Scatter(const void* s, int sc, MPI_Datatype st, void* r, int rc, MPI_Datatype rt, int root,
                MPI_Comm comm) {
    TS_COUNT_COMM(MPI_Scatter, comm);
    return PMPI_Scatter(s, sc, st, r, rc, rt, root, comm);
}
int MPI_Alltoall(const void* s, int sc, MPI_Datatype st, void* r, int rc, MPI_Datatype rt,
                 MPI_Comm comm) {
    TS_COUNT_COMM(MPI_Alltoall, comm);
    return PMPI_Alltoall(s, sc, st, r, rc, rt, comm);
}
int MPI_Alltoallv(const void* s, const int sc[], const int sd[], MPI_Datatype st, void* r,
                  const int rc[], const int rd[], MPI_Datatype rt, MPI_Comm comm) {
    TS_COUNT_COMM(MPI_Alltoallv, comm);
    return PMPI_Alltoallv(s, sc, sd, st, r, rc, rd, rt, comm);
}
int MPI_Scan(const void* s, void* r, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
    TS_COUNT_COMM(MPI_Scan, comm);
    return PMPI_Scan(s, r, count, type, op, comm);
}
int MPI_Exscan(const void* s, void* r, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
    TS_COUNT_COMM(MPI_Exscan, comm);
    return PMPI_Exscan(s, r, count, type, op, comm);
}
int MPI_Reduce_scatter_block(const void* s, void* r, int count, MPI_Datatype type, MPI_Op op,
                             MPI_Comm comm) {
    TS_COUNT_COMM(MPI_Reduce_scatter_block, comm);
    return PMPI_Reduce_scatter_block(s, r, count, type, op, comm);
}
int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* out) {
    TS_COUNT_COMM(MPI_Comm_dup, comm);
    return PMPI_Comm_dup(comm, out);
}
int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* out) {
    TS_COUNT_COMM(MPI_Comm_split, comm);
    return PMPI_Comm_split(comm, color, key, out);
}
int MPI_File_set_view(MPI_File fh, MPI_Offset disp, MPI_Datatype etype, MPI_Datatype filetype,
                      const char* datarep, MPI_Info info) {
    TS_COUNT_FILE(MPI_File_set_view, fh);
    return PMPI_File_set_view(fh, disp, etype, filetype, datarep, info);
}
int MPI_File_set_size(MPI_File fh, MPI_Offset size) {
    TS_COUNT_FILE(MPI_File_set_size, fh);
    return PMPI_File_set_size(fh, size);
}
int MPI_File_sync(MPI_File fh) {
    TS_COUNT_FILE(MPI_File_sync, fh);
    return PMPI_File_sync(fh);
}
int MPI_File_write_all(MPI_File fh, const void* buf, int count, MPI_Datatype type,
                       MPI_Status* status) {
    TS_COUNT_FILE(MPI_File_write_all, fh);
    return PMPI_File_write_all(fh, buf, count, type, status);
}
int MPI_File_write_at_all(MPI_File fh, MPI_Offset offset, const void* buf, int count,
                          MPI_Datatype type, MPI_Status* status) {
    TS_COUNT_FILE(MPI_File_write_at_all, fh);
    return PMPI_File_write_at_all(fh, offset, buf, count, type, status);
}
int MPI_File_read_all(MPI_File fh, void* buf, int count, MPI_Datatype type, MPI_Status* status) {
    TS_COUNT_FILE(MPI_File_read_all, fh);
    return PMPI_File_read_all(fh, buf, count, type, status);
}
int MPI_File_read_at_all(MPI_File fh, MPI_Offset offset, void* buf, int count, MPI_Datatype type,
                         MPI_Status* status) {
    TS_COUNT_FILE(MPI_File_read_at_all, fh);
    return PMPI_File_read_at_all(fh, offset, buf, count, type, status);
}

} // extern "C"
