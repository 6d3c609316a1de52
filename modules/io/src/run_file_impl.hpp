// RunFile's private state (run_file.cpp: the public calls; run_file_flush.cpp: the flush, the
// aggregates' reduction and the raw row writes). Not installed; included by those two files only.
#pragma once

#include "h5_internal.hpp"
#include "run_file_support.hpp"

#include "trainscope/io/run_file.hpp"
#include "trainscope/io/schema.hpp"

#include <mpi.h>
#include <sys/statvfs.h>

#include <cstdint>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace trainscope::io {

// Private to the two files that include this header (run_file.cpp, run_file_flush.cpp).
using namespace detail;  // Handle and the support routines (run_file_support.hpp)
using schema::normalize; // "/a/b/" or "a/b" -> "/a/b"; "" -> "/"
namespace fs = std::filesystem;

// Below this much free space on the run file's file system a flush stops the job (every rank the
// same OutputError) instead of letting HDF5 fail a sync on some ranks only.
inline constexpr long long kFlushReserveBytes = 1024 * 1024;

// HDF5's metadata cache writes metadata (a sync point: barrier, broadcast, collective writes) once
// this much has been dirtied since the last write or at H5Fflush (RunFile's syncs), whichever
// comes first (H5AC_cache_config_t::dirty_bytes_threshold; HDF5's default is 256 KiB).
inline constexpr std::size_t kDirtyMetadataBytes = 4 * 1024 * 1024;

// A rank's per-rank rows of a series are written (one pwrite per column and chunk) once this many
// are pending, else at the next sync or status change. Row by row, 32 ranks' 8-byte writes to one
// file at every iteration's flush contend for its lock (each stalled write a flush of tens of ms
// on 64 oversubscribed ranks; on Lustre, extent locks moving between clients); 512 rows make each
// write 4 KiB. The rows reach the disk at syncs either way (fdatasync there).
inline constexpr std::size_t kRowBatch = 512;

struct Series {
    std::string group; // normalized, e.g. "/iterations"
    std::vector<Column> columns;
    std::vector<Handle> datasets;             // one per column, [R, extent]
    Handle rank_rows;                         // <group>/rank_rows, int64 [R]
    Handle handle;                            // the group, open while the file is
    std::vector<std::vector<double>> pending; // per column: this rank's rows not yet written
                                              // (empty unless this rank writes per-rank rows)
    std::int64_t appended = 0;                // this rank's rows so far
    hsize_t written = 0;                      // this rank's rows already in the file
    hsize_t extent = 0;                       // n of every dataset (identical on all ranks)
    hsize_t rows_attribute = 0;               // the group's `rows` as last written (at a sync)
    hsize_t chunk_rows = 1;                   // extents grow in steps of this many rows
    std::int64_t min_rows = 0;                // the fewest rows any rank has (as of the flush)
    std::int64_t max_rows = 0;                // the most rows any rank has (as of the flush)
    bool uneven = false;                      // ranks had different row counts at a flush
    // Aggregates over every rank (declare_series' aggregate_by); none when `key` is npos.
    std::size_t key = std::string::npos;           // the column that decides `slowest`
    std::vector<Handle> aggregates;                // per column, AggregateRow [agg_extent]
    Handle aggregate_group;                        // <group>/aggregate
    std::vector<std::vector<double>> unaggregated; // per column: rows from `aggregated` on
    hsize_t aggregated = 0;                        // rows reduced (identical on all ranks)
    hsize_t agg_extent = 0;                        // n of the aggregate datasets
    hsize_t padded = 0;     // this rank's slots written so far, rows or NaN (per-rank writers)
    hsize_t agg_padded = 0; // aggregate slots written so far, rows or empty (rank 0)
    // File addresses of every allocated chunk, per column (the rows' datasets; the aggregates'):
    // rows and aggregates are written to them with pwrite, outside HDF5 (RunFile::Impl::raw_fd).
    std::vector<std::vector<haddr_t>> chunk_addr, agg_chunk_addr;
    haddr_t rank_rows_addr = HADDR_UNDEF; // rank_rows' storage (contiguous)
    std::int64_t rank_rows_flush = 0;     // rank 0: the flush whose counts rank_rows holds
    bool aggregating() const { return key != std::string::npos; }
};

// The reduction of the aggregates (RunFile::Impl::post_reduce), one element of a contiguous MPI
// type (MPI may split a reduction between elements, never inside one) that describes itself, since
// an MPI user function takes no context argument and runs wherever MPI makes progress: a header
// {S, counts, then rows and columns of each of the S series}, identical on every rank; `counts`
// doubles combined by max (each per-rank row's row count per series, while they differ); then
// per series, per row, per column five doubles {min, max, sum, count, argmax}, then the row's key
// {value, rank} and the key rank's whole row (columns doubles).
inline constexpr std::size_t kStats = 5; // min, max, sum, count, argmax

std::size_t row_width(std::size_t columns);
void reduce_aggregate_rows(void* in_v, void* inout_v, int* len, MPI_Datatype* type);

struct RunFile::Impl {
    MPI_Comm comm = MPI_COMM_NULL;
    int rank = 0;
    int size = 1;
    std::string path;
    hid_t file = H5I_INVALID_HID;
    Handle dxpl; // collective MPI-IO transfers
    // Link, group, dataset and attribute access lists asking for collective metadata reads. On
    // HDF5 1.10.5-1.10.8 the file-wide setting is ignored (HDFFV-11260, fixed in 1.10.9) and only
    // these per-call lists make the reads collective.
    Handle lapl, gapl, dapl, aapl;
    std::vector<Series> series;
    std::map<std::string, std::size_t> series_index; // normalized group -> position in `series`
    // Per-rank rows (select_per_rank): whether this rank writes them, its row, R, and on rank 0
    // the rank of every row.
    bool per_rank = true;
    hsize_t per_rank_row = 0;
    hsize_t per_rank_count = 1;
    std::vector<std::int64_t> per_rank_ranks;
    Handle aggregate_type; // AggregateRow in the file (little-endian, packed as in memory)
    SchemaCheck check = SchemaCheck::strict;
    // File syncs (H5Fflush: every rank's MPI_File_sync, i.e. an fsync) at most every
    // sync_every_s seconds of rank 0's clock; 0 = at every flush. Status changes always sync.
    double sync_every_s = 0;
    double last_sync = -std::numeric_limits<double>::infinity(); // MPI_Wtime on rank 0; the
                                                                 // first flush always syncs
    FlushStats stats;
    std::string write_error; // a write of this rank failed at a flush: raised by every rank at the
                             // next flush (write_pending)
    // This rank's own descriptor of the file for the series' rows and aggregates (opened at its
    // first write). Those writes go to chunk addresses every rank looked up together, not
    // through HDF5: only some ranks write them, and an HDF5 call on some ranks only leaves their
    // metadata caches different from the others', which HDF5 1.10's collective metadata reads
    // (always on for metadata-changing calls) turn into a broadcast the others never join.
    int raw_fd = -1;
    double arrived = 0, arrival_wait = 0; // the last write_pending's split (FlushStats)

    // Under SchemaCheck::strict: what is written must be in the schema table (schema.hpp). Every
    // rank calls these with the same arguments, so a refusal is the same everywhere.
    void check_object(const std::string& object, std::initializer_list<schema::Kind> kinds,
                      const std::string& units) const {
        if (check == SchemaCheck::strict) schema::require_object(path, object, kinds, units);
    }
    void check_member(schema::Kind kind, const std::string& object, const std::string& name,
                      const std::string& units) const {
        if (check == SchemaCheck::strict) schema::require_member(path, kind, object, name, units);
    }
    void check_table_column(const std::string& object, const std::string& units) const {
        const std::string table = parent_of(object);
        check_object(table, {schema::Kind::table}, "");
        check_member(schema::Kind::column, table, object.substr(table.size() + 1), units);
    }

    ~Impl() {
        if (raw_fd >= 0) ::close(raw_fd);
        // Reached with the file open only when a rank unwinds an exception: HDF5 closes the file
        // at MPI_Finalize/exit, and no call here may wait for peers that are elsewhere.
        if (file >= 0) {
            for (auto& s : series) {
                for (auto& d : s.datasets)
                    d.release();
                for (auto& d : s.aggregates)
                    d.release();
                s.rank_rows.release();
                s.aggregate_group.release();
                s.handle.release();
            }
            for (Handle* h : {&dxpl, &lapl, &gapl, &dapl, &aapl, &aggregate_type})
                h->release();
            return;
        }
        if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    }

    // Opens group `group_path` (normalized), creating missing parents; collective.
    Handle ensure_group(const std::string& group_path) {
        if (group_path == "/")
            return Handle(H5_CHECK(H5Gopen2(file, "/", gapl), path, "/"), H5Gclose);
        std::string current;
        Handle group;
        std::size_t pos = 1;
        while (pos <= group_path.size()) {
            const std::size_t end = std::min(group_path.find('/', pos), group_path.size());
            current = group_path.substr(0, end);
            const htri_t exists = H5_CHECK(H5Lexists(file, current.c_str(), lapl), path, current);
            group = exists > 0
                        ? Handle(H5_CHECK(H5Gopen2(file, current.c_str(), gapl), path, current),
                                 H5Gclose)
                        : Handle(H5_CHECK(H5Gcreate2(file, current.c_str(), H5P_DEFAULT,
                                                     H5P_DEFAULT, gapl),
                                          path, current),
                                 H5Gclose);
            pos = end + 1;
        }
        return group;
    }

    // Removes the link `object` if it exists (to replace a dataset); collective.
    void unlink_if_exists(const std::string& object) {
        if (H5_CHECK(H5Lexists(file, object.c_str(), lapl), path, object) > 0)
            H5_CHECK(H5Ldelete(file, object.c_str(), lapl), path, object);
    }

    // Writes attribute `name` on `obj`, replacing an existing one; rewritten in place when the
    // type and shape match (flushes rewrite the same attributes many times). Collective.
    void write_attribute(hid_t obj, const std::string& obj_path, const std::string& name,
                         hid_t file_type, hid_t mem_type, hid_t space, const void* buf) {
        const std::string where = obj_path + (obj_path == "/" ? "" : "/") + "@" + name;
        if (H5_CHECK(H5Aexists(obj, name.c_str()), path, where) > 0) {
            Handle attr(H5_CHECK(H5Aopen(obj, name.c_str(), aapl), path, where), H5Aclose);
            Handle old_type(H5_CHECK(H5Aget_type(attr), path, where), H5Tclose);
            Handle old_space(H5_CHECK(H5Aget_space(attr), path, where), H5Sclose);
            const bool same = H5_CHECK(H5Tequal(old_type, file_type), path, where) > 0 &&
                              H5_CHECK(H5Sextent_equal(old_space, space), path, where) > 0;
            if (same) {
                H5_CHECK(H5Awrite(attr, mem_type, buf), path, where);
                return;
            }
            attr.reset();
            H5_CHECK(H5Adelete(obj, name.c_str()), path, where);
        }
        Handle attr(H5_CHECK(H5Acreate2(obj, name.c_str(), file_type, space, H5P_DEFAULT, aapl),
                             path, where),
                    H5Aclose);
        H5_CHECK(H5Awrite(attr, mem_type, buf), path, where);
    }

    void write_attribute(hid_t obj, const std::string& obj_path, const Attribute& a) {
        Handle scalar(H5_CHECK(H5Screate(H5S_SCALAR), path, obj_path), H5Sclose);
        if (auto* i = std::get_if<std::int64_t>(&a.value)) {
            write_attribute(obj, obj_path, a.name, H5T_STD_I64LE, H5T_NATIVE_INT64, scalar, i);
        } else if (auto* d = std::get_if<double>(&a.value)) {
            write_attribute(obj, obj_path, a.name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, scalar, d);
        } else {
            const char* text = std::get<std::string>(a.value).c_str();
            Handle type = variable_string_type(path);
            write_attribute(obj, obj_path, a.name, type, type, scalar, &text);
        }
    }

    void write_attribute(hid_t obj, const std::string& obj_path, const std::string& name,
                         const std::vector<std::int64_t>& values) {
        const hsize_t n = values.size();
        Handle space(H5_CHECK(H5Screate_simple(1, &n, nullptr), path, obj_path), H5Sclose);
        write_attribute(obj, obj_path, name, H5T_STD_I64LE, H5T_NATIVE_INT64, space, values.data());
    }

    void write_units(hid_t obj, const std::string& obj_path, const std::string& units) {
        write_attribute(obj, obj_path, Attribute{"units", units});
    }

    // Collective helpers of the 1-D per-rank layouts (write_ragged*, write_per_rank).
    std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>> ragged_layout(std::size_t mine);
    // Creates (replacing) 1-D dataset `name` of `length` elements; this rank writes `count`
    // elements of `buf` at `start` in one collective H5Dwrite, then the units attribute.
    void write_1d(const std::string& name, hid_t file_type, hid_t mem_type, hsize_t length,
                  hsize_t start, hsize_t count, const void* buf, const std::string& units);
    void write_ragged_index(const std::string& object, const std::vector<std::int64_t>& offsets,
                            const std::vector<std::int64_t>& counts);

    // Collective: root attributes that every rank computes from rank 0's clock.
    void write_root_attributes(const std::vector<Attribute>& attrs) {
        std::string packed = rank == 0 ? pack(attrs) : std::string();
        bcast_string(comm, packed);
        Handle root = ensure_group("/");
        for (const auto& a : unpack(packed))
            write_attribute(root, "/", a);
    }

    // Collective: writes the buffered rows of every series (the per-rank rows of the ranks that
    // write them, the aggregates on rank 0); syncs the file (and then writes the root attribute
    // flushed_utc) when `force_sync` or when sync_every_s has passed. `exact`: every extent is
    // set to the longest rank's rows and every row is aggregated (status changes and close);
    // otherwise extents grow in steps of the series' chunk rows, so a flush changes metadata only
    // once in chunk_rows rows, and a row is aggregated once every rank has it.
    //
    // Its global collectives (issue 39, counted by tests/mpi/pmpi_counter.cpp): one MPI_Allreduce
    // (every series' longest and shortest rank, rank 0's clock, its decision to sync, a write
    // error left by the previous flush), one MPI_Ireduce to rank 0 of the aggregates when there
    // are rows to aggregate and of the row counts while ranks hold different counts (completed
    // at a later flush by MPI_Test, so that none waits for it; at once at a sync or status
    // change); HDF5's metadata goes to the file at syncs only (kDirtyMetadataBytes); at a sync
    // or status change also one MPI_Allreduce agreeing on a write error (core::first_failure)
    // and H5Fflush's own. A rank writes its own rows with one pwrite per column and chunk
    // (write_raw: no MPI-IO collective, no HDF5 call on some ranks only); rank 0 writes the
    // aggregates and the rank_rows datasets. Dataset extents and attributes are metadata: every
    // rank makes the same calls, and makes them only when an extent grows or at a sync. Returns
    // true when the file was synced.
    bool write_pending(bool force_sync, bool exact = false);

    // Collective: every series' datasets to `extent` and its aggregates to `agg_extent` where
    // that grows them (`grow`) or shrinks them (not `grow`); the chunk addresses follow.
    void set_extents(const std::vector<hsize_t>& extent, const std::vector<hsize_t>& agg_extent,
                     bool grow);

    // Collective: the per-rank datasets of `s` to `extent` rows, their chunks' addresses looked
    // up (the group's attribute `rows` follows at the next sync).
    void resize_rows(Series& s, hsize_t extent);

    // Collective: the aggregate datasets of `s` to `extent` rows, their chunks' addresses looked
    // up.
    void resize_aggregates(Series& s, hsize_t extent);

    // Local: the aggregate rows in the file, those of the reductions completed so far (the same
    // on every rank at a sync, where every reduction has completed).
    hsize_t written_rows(std::size_t g) const;

    // An extent that holds `rows`: exactly (status changes), else grown in steps of chunk_rows.
    static hsize_t grown_extent(hsize_t extent, hsize_t rows, hsize_t chunk_rows, bool exact);

    struct Reduced {
        std::vector<std::vector<AggregateRow>> rows; // per series, column-major (rank 0)
        std::vector<hsize_t> from, to;               // per series: the rows reduced
        std::vector<std::int64_t> counts;            // [R x series]: rows of each per-rank row
        bool has_counts = false;
        std::int64_t flush = 0; // the flush that posted it (flush_serial)
    };
    // The reductions posted at flushes and completed at later ones (MPI_Test), oldest first, or
    // all at once at a status change or a sync, so that no ordinary flush waits for them: rank 0
    // writes a flush's aggregates once its reduction has completed.
    struct InFlight {
        MPI_Request request = MPI_REQUEST_NULL;
        MPI_Datatype element = MPI_DATATYPE_NULL;
        std::vector<double> send, result;
        std::vector<hsize_t> from, to;
        std::size_t header = 0, count_slots = 0;
        std::int64_t flush = 0; // flush_serial when posted
    };
    std::int64_t flush_serial = 0; // write_pending calls so far, this one included
    std::deque<InFlight> inflight;
    // At most this many reductions in flight: a flush waits for the oldest beyond it (memory:
    // each holds its send buffer, and on rank 0 its result).
    static constexpr std::size_t kMaxInFlight = 4;

    // Collective when any series has rows to aggregate or `counts` (every rank knows the same
    // arguments): posts one MPI_Ireduce to rank 0 of rows [aggregated, to) of every aggregating
    // series and, with `counts`, of every series' row count of each per-rank row
    // (complete_reductions completes it). Each rank drops the rows it posted.
    void post_reduce(const std::vector<hsize_t>& to, bool counts);

    // Local, oldest first: the reductions in flight that have completed (MPI_Test), waiting for
    // the oldest only while kMaxInFlight or more are in flight; every one with `all` (which every
    // rank asks at the same flush). Returns their rows (rank 0) and what they cover.
    std::vector<Reduced> complete_reductions(bool all);

    // Local: a completed reduction's rows (rank 0; the range on every rank).
    Reduced reduced_rows(const InFlight& f) const;

    // Rank 0: what a completed reduction gives, into the file: its aggregate rows, and the
    // per-rank rows' counts when it carried them.
    void write_reduced(const Reduced& red);

    // Rank 0, outside HDF5: rows [from, to) of every aggregate dataset of `s` (`rows`,
    // column-major).
    void write_aggregates(Series& s, const std::vector<AggregateRow>& rows, hsize_t from,
                          hsize_t to);

    // Rank 0, outside HDF5: empty rows (count 0, NaN, argmax -1) in [from, to) of every aggregate
    // dataset of `s`: the slots a grown extent added (no fill values), until their rows come.
    void write_empty_aggregates(Series& s, hsize_t from, hsize_t to);

    // Collective (every rank the same calls): the file addresses of the chunks of `ds` that
    // cover `extent` rows along its last dimension (chunks of chunk_rows rows, one chunk across
    // the other dimension), looked up for the chunks not yet known; HDF5 allocates every chunk
    // of an extent when it grows (the MPI-IO driver's early allocation).
    void refresh_chunks(hid_t ds, int ndims, hsize_t extent, hsize_t chunk_rows,
                        std::vector<haddr_t>& addr, const std::string& object);

    // Local: `count` elements of `element` bytes from `data` into row `row` of a chunked dataset
    // whose chunks span every row and chunk_rows elements along the last dimension ([R,
    // chunk_rows] row-major; a 1-D dataset: row 0), from element `start` on, with pwrite at the
    // chunks' addresses. The file's types are the memory's (declare_series checks).
    void write_raw(const std::vector<haddr_t>& addr, hsize_t chunk_rows, hsize_t row, hsize_t start,
                   hsize_t count, const void* data, std::size_t element, const std::string& object);

    // Local: `size` bytes at file address `at` through raw_fd (opened at the first call).
    void pwrite_all(const char* p, std::size_t size, haddr_t at, const std::string& object);

    // AggregateRow in memory (native types): the file's type (aggregate_type) must equal it.
    hid_t aggregate_memory_type();

    // Local: this rank's new rows of every series into its row of each column, and NaN in its
    // slots that a grown extent added beyond them (the datasets have no fill values: the MPI-IO
    // driver would write them with collective writes whenever an extent grows). One pwrite per
    // column and chunk (write_raw); nothing on a rank that does not write per-rank rows
    // (select_per_rank). A series' rows are written once kRowBatch of them are pending, or
    // every pending row with `all` (a sync or status change: what a sync makes durable).
    void write_rows(bool all);

    // Collective: one root attribute, the same value on every rank (no broadcast).
    void write_root_attribute(const Attribute& a) {
        Handle root(H5_CHECK(H5Gopen2(file, "/", gapl), path, "/"), H5Gclose);
        write_attribute(root, "/", a);
    }

    void flush_file() { H5_CHECK(H5Fflush(file, H5F_SCOPE_GLOBAL), path, "/"); }

    // Free bytes on the run file's file system (statvfs; unknown: a large number).
    double free_bytes() const {
        struct statvfs st {};
        const fs::path dir =
            fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
        if (statvfs(dir.c_str(), &st) != 0) return 1e18;
        return static_cast<double>(st.f_bavail) * static_cast<double>(st.f_frsize);
    }

    Series& find_series(std::string_view group, const char* what) {
        const auto it = series_index.find(normalize(group));
        if (it == series_index.end())
            throw core::InternalError(std::string("RunFile::") + what + ": series group '" +
                                      std::string(group) + "' was not declared in '" + path + "'");
        return series[it->second];
    }
};

} // namespace trainscope::io
