// RunFile implementation: one HDF5 file opened by all ranks through the MPI-IO driver with
// collective metadata reads and writes (HDF5 1.10.5-1.10.8 need per-call access lists for the
// reads, bug HDFFV-11260). Values that must
// identical on every rank (attributes, strings) are broadcast from rank 0 before they reach HDF5;
// every rank writes its own series rows with independent I/O (write_rows); tables written once
// (/ranks, ragged, per-rank) use collective writes.
#include "trainscope/io/run_file.hpp"

#include "h5_internal.hpp"
#include "run_file_support.hpp"

#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/core/mpi_util.hpp"
#include "trainscope/io/schema.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <utility>

namespace trainscope::io {

using namespace detail;  // Handle and the support routines (run_file_support.hpp)
using schema::normalize; // "/a/b/" or "a/b" -> "/a/b"; "" -> "/"
namespace fs = std::filesystem;

// Below this much free space on the run file's file system a flush stops the job (every rank the
// same OutputError) instead of letting HDF5 fail a sync on some ranks only.
constexpr long long kFlushReserveBytes = 1024 * 1024;

// ------------------------------------------------------------------------------------------------

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
    bool aggregating() const { return key != std::string::npos; }
};

// The reduction of the aggregates (RunFile::Impl::post_reduce), one element of a contiguous MPI
// type (MPI may split a reduction between elements, never inside one) that describes itself, since
// an MPI user function takes no context argument and runs wherever MPI makes progress: a header
// {S, counts, then rows and columns of each of the S series}, identical on every rank; `counts`
// doubles combined by max (each per-rank row's row count per series, while they differ); then
// per series, per row, per column five doubles {min, max, sum, count, argmax}, then the row's key
// {value, rank} and the key rank's whole row (columns doubles).
constexpr std::size_t kStats = 5; // min, max, sum, count, argmax

std::size_t row_width(std::size_t columns) {
    return kStats * columns + 2 + columns;
}

void reduce_aggregate_rows(void* in_v, void* inout_v, int* len, MPI_Datatype* type) {
    int doubles = 0;
    MPI_Type_size(*type, &doubles);
    doubles /= static_cast<int>(sizeof(double));
    const auto* element_in = static_cast<const double*>(in_v);
    auto* element_io = static_cast<double*>(inout_v);
    for (int element = 0; element < *len; ++element) {
        const double* in = element_in + static_cast<std::ptrdiff_t>(element) * doubles;
        double* io = element_io + static_cast<std::ptrdiff_t>(element) * doubles;
        const auto nseries = static_cast<std::size_t>(in[0]);
        const auto counts = static_cast<std::size_t>(in[1]);
        const double* shape = in + 2;
        in += 2 + 2 * nseries;
        io += 2 + 2 * nseries;
        for (std::size_t i = 0; i < counts; ++i, ++in, ++io)
            *io = std::max(*io, *in);
        for (std::size_t g = 0; g < nseries; ++g) {
            const auto rows = static_cast<std::size_t>(shape[2 * g]);
            const auto columns = static_cast<std::size_t>(shape[2 * g + 1]);
            for (std::size_t r = 0; r < rows; ++r) {
                for (std::size_t c = 0; c < columns; ++c, in += kStats, io += kStats) {
                    if (in[3] == 0) continue; // no value on the incoming side
                    if (io[3] == 0 || in[0] < io[0]) io[0] = in[0];
                    if (io[3] == 0 || in[1] > io[1] || (in[1] == io[1] && in[4] < io[4])) {
                        io[1] = in[1];
                        io[4] = in[4];
                    }
                    io[2] += in[2];
                    io[3] += in[3];
                }
                // The key: the larger value wins, the lower rank on a tie; rank -1 = none.
                if (in[1] >= 0 && (io[1] < 0 || in[0] > io[0] || (in[0] == io[0] && in[1] < io[1])))
                    std::copy(in, in + 2 + columns, io);
                in += 2 + columns;
                io += 2 + columns;
            }
        }
    }
}

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
    // at the next flush, so that none waits for it; at once at a status change); at a sync
    // or status change also one MPI_Allreduce agreeing on a write error (core::first_failure)
    // and H5Fflush's own. A rank writes its own rows with one pwrite per column and chunk
    // (write_raw: no MPI-IO collective, no HDF5 call on some ranks only); rank 0 writes the
    // aggregates and the rank_rows datasets. Dataset extents and attributes are metadata: every
    // rank makes the same calls, and makes them only when an extent grows or at a sync. Returns
    // true when the file was synced.
    bool write_pending(bool force_sync, bool exact = false) {
        const double entered = MPI_Wtime();
        const std::size_t groups = series.size();
        std::vector<double> reduced(2 * groups + 4);
        for (std::size_t g = 0; g < groups; ++g) {
            const auto rows = static_cast<double>(series[g].appended);
            reduced[g] = rows;
            reduced[groups + g] = -rows;
        }
        const double now = MPI_Wtime();
        if (rank == 0) {
            reduced[2 * groups] = static_cast<double>(std::time(nullptr));
            reduced[2 * groups + 1] =
                force_sync || sync_every_s <= 0 || now - last_sync >= sync_every_s ? 1.0 : 0.0;
            const double free = free_bytes();
            reduced[2 * groups + 2] = free < kFlushReserveBytes ? free : -1.0;
        } else {
            reduced[2 * groups] = reduced[2 * groups + 1] = reduced[2 * groups + 2] = -1.0;
        }
        reduced[2 * groups + 3] = write_error.empty() ? -1.0 : 1.0;
        mpi_check(MPI_Allreduce(MPI_IN_PLACE, reduced.data(), static_cast<int>(reduced.size()),
                                MPI_DOUBLE, MPI_MAX, comm),
                  "MPI_Allreduce");
        arrived = MPI_Wtime();
        arrival_wait = arrived - entered;
        const bool sync = reduced[2 * groups + 1] > 0;
        // A write that failed on some rank at the previous flush: every rank raises its text now,
        // before any metadata call.
        if (reduced[2 * groups + 3] > 0)
            throw_collective_output_error(agree_on_error(comm, write_error));
        // A sync that runs out of space fails inside H5Fflush on some ranks only, which leaves
        // the others waiting in HDF5's own collectives: stop every rank before, together.
        if (reduced[2 * groups + 2] >= 0)
            throw_collective_output_error(
                "No space left on device for the run file '" + path +
                "': " + std::to_string(static_cast<long long>(reduced[2 * groups + 2]) / 1024) +
                " KiB free on its file system, less than the " +
                std::to_string(kFlushReserveBytes / 1024) +
                " KiB a flush may need for HDF5's metadata: free space there or choose another "
                "output.file");

        // Row counts per rank reach rank 0 only while they differ (uneven shards, telemetry);
        // every rank knows from the reduction whether they do.
        bool gather = false;
        for (std::size_t g = 0; g < groups; ++g) {
            const bool uneven = reduced[g] != -reduced[groups + g];
            gather = gather || uneven || series[g].uneven;
        }
        // Aggregates: rows every rank has (all rows when exact), reduced to rank 0 together with
        // the per-rank rows' counts when those differ.
        std::vector<hsize_t> aggregate_to(groups);
        for (std::size_t g = 0; g < groups; ++g)
            aggregate_to[g] = static_cast<hsize_t>(exact ? reduced[g] : -reduced[groups + g]);
        // The previous flush's reduction completes (long done, while training went on), this
        // flush's is posted; a status change or a sync completes it at once (what a sync makes
        // durable is every row up to it: a killed run's file holds them).
        const Reduced previous = complete_reduce();
        post_reduce(aggregate_to, gather);
        const Reduced current = exact || sync ? complete_reduce() : Reduced{};

        // Extents: metadata, the same calls on every rank. An extent grows before the writes;
        // one that shrinks (to the exact rows at a status change) shrinks after them: HDF5 then
        // rewrites the partial last chunk from the file, rows included, where a shrink before
        // the writes had it rewrite that chunk over them later.
        std::vector<hsize_t> extent(groups), agg_extent(groups);
        for (std::size_t g = 0; g < groups; ++g) {
            Series& s = series[g];
            extent[g] =
                grown_extent(s.extent, static_cast<hsize_t>(reduced[g]), s.chunk_rows, exact);
            agg_extent[g] = grown_extent(s.agg_extent, aggregate_to[g], s.chunk_rows, exact);
        }
        set_extents(extent, agg_extent, /*grow=*/true);
        for (std::size_t g = 0; g < groups; ++g)
            if (series[g].aggregating()) series[g].aggregated = aggregate_to[g];
        // The writes are independent, so one rank may fail where the others succeed (a full
        // file system, a quota): the failed rank keeps the error (write_error) and every rank
        // raises the same error together (below, or at the next flush), rather than the others
        // going on into a collective the failed rank never reaches.
        try {
            write_rows();
            for (Series& s : series)
                if (rank == 0 && s.aggregating() && s.agg_padded < s.agg_extent) {
                    write_empty_aggregates(s, s.agg_padded, s.agg_extent);
                    s.agg_padded = s.agg_extent;
                }
            write_reduced(previous);
            write_reduced(current);
            for (std::size_t g = 0; g < groups; ++g) {
                Series& s = series[g];
                const auto longest = static_cast<std::int64_t>(reduced[g]);
                const auto shortest = static_cast<std::int64_t>(-reduced[groups + g]);
                const bool uneven = longest != shortest;
                const bool counts_changed =
                    longest != s.max_rows || shortest != s.min_rows || uneven || s.uneven;
                // Even counts: every per-rank row has `longest` (uneven ones came with a
                // reduction: write_reduced).
                if (rank == 0 && counts_changed && !gather && per_rank_count > 0) {
                    const std::vector<std::int64_t> rank_rows(per_rank_count, longest);
                    pwrite_all(reinterpret_cast<const char*>(rank_rows.data()),
                               rank_rows.size() * sizeof(std::int64_t), s.rank_rows_addr,
                               s.group + "/rank_rows");
                }
                s.min_rows = shortest;
                s.max_rows = longest;
                s.uneven = uneven;
            }
        } catch (const core::OutputError& e) {
            write_error = e.what();
        }
        // The writes are independent: a rank that failed goes on, and every rank learns of it
        // from the next flush's first MPI_Allreduce, so a flush needs no collective after its
        // writes. A status change (the last flush) and a sync agree at once.
        if (exact || sync) {
            const std::string shared_error = agree_on_error(comm, write_error);
            if (!shared_error.empty()) throw_collective_output_error(shared_error);
        }
        // After the agreement, which every rank enters once its writes are done: a shrink makes
        // HDF5 rewrite the partial last chunk, which must hold every rank's rows by then.
        set_extents(extent, agg_extent, /*grow=*/false);
        if (sync) {
            write_root_attribute(Attribute{
                "flushed_utc", utc_iso8601(static_cast<std::time_t>(reduced[2 * groups]))});
            for (std::size_t g = 0; g < groups; ++g)
                if (series[g].aggregating())
                    write_attribute(series[g].aggregate_group, series[g].group + "/aggregate",
                                    Attribute{"rows", static_cast<std::int64_t>(written_rows(g))});
            // With collective metadata writes each rank writes its share of the metadata, so a
            // full file system may fail the sync on some ranks only: agree here too.
            std::string sync_error;
            try {
                // The rows this rank wrote outside HDF5 reach the disk with the file's sync.
                if (raw_fd >= 0 && ::fdatasync(raw_fd) != 0)
                    throw core::OutputError("syncing the run file '" + path +
                                            "' failed: " + std::strerror(errno));
                flush_file();
            } catch (const core::OutputError& e) {
                sync_error = e.what();
            }
            const std::string shared = agree_on_error(comm, sync_error);
            if (!shared.empty()) throw_collective_output_error(shared);
            last_sync = now;
            ++stats.syncs;
        }
        return sync;
    }

    // Collective: every series' datasets to `extent` and its aggregates to `agg_extent` where
    // that grows them (`grow`) or shrinks them (not `grow`); the chunk addresses follow.
    void set_extents(const std::vector<hsize_t>& extent, const std::vector<hsize_t>& agg_extent,
                     bool grow) {
        for (std::size_t g = 0; g < series.size(); ++g) {
            Series& s = series[g];
            if (extent[g] != s.extent && (extent[g] > s.extent) == grow) resize_rows(s, extent[g]);
            if (s.aggregating() && agg_extent[g] != s.agg_extent &&
                (agg_extent[g] > s.agg_extent) == grow)
                resize_aggregates(s, agg_extent[g]);
        }
    }

    // Collective: the per-rank datasets of `s` to `extent` rows (attribute `rows` with them),
    // their chunks' addresses looked up.
    void resize_rows(Series& s, hsize_t extent) {
        for (std::size_t c = 0; c < s.columns.size(); ++c) {
            const std::string object = s.group + "/" + s.columns[c].name;
            const hsize_t dims[2] = {per_rank_count, extent};
            H5_CHECK(H5Dset_extent(s.datasets[c], dims), path, object);
            if (per_rank_count > 0)
                refresh_chunks(s.datasets[c], 2, extent, s.chunk_rows, s.chunk_addr[c], object);
        }
        write_attribute(s.handle, s.group, Attribute{"rows", static_cast<std::int64_t>(extent)});
        s.extent = extent;
    }

    // Collective: the aggregate datasets of `s` to `extent` rows, their chunks' addresses looked
    // up.
    void resize_aggregates(Series& s, hsize_t extent) {
        for (std::size_t c = 0; c < s.columns.size(); ++c) {
            const std::string object = s.group + "/aggregate/" + s.columns[c].name;
            H5_CHECK(H5Dset_extent(s.aggregates[c], &extent), path, object);
            refresh_chunks(s.aggregates[c], 1, extent, s.chunk_rows, s.agg_chunk_addr[c], object);
        }
        s.agg_extent = extent;
    }

    // Local, the same on every rank: the aggregate rows in the file, those of the reductions
    // completed so far (the rows of one in flight come at the next flush).
    hsize_t written_rows(std::size_t g) const {
        return inflight.request != MPI_REQUEST_NULL ? inflight.from[g] : series[g].aggregated;
    }

    // An extent that holds `rows`: exactly (status changes), else grown in steps of chunk_rows.
    static hsize_t grown_extent(hsize_t extent, hsize_t rows, hsize_t chunk_rows, bool exact) {
        if (exact) return rows;
        if (rows > extent) return (rows + chunk_rows - 1) / chunk_rows * chunk_rows;
        return extent;
    }

    struct Reduced {
        std::vector<std::vector<AggregateRow>> rows; // per series, column-major (rank 0)
        std::vector<hsize_t> from, to;               // per series: the rows reduced
        std::vector<std::int64_t> counts;            // [R x series]: rows of each per-rank row
        bool has_counts = false;
    };
    // The reduction posted at a flush and completed at the next (or at once at a status
    // change), so that no flush waits for it: rank 0 writes a flush's aggregates one flush later.
    struct InFlight {
        MPI_Request request = MPI_REQUEST_NULL;
        MPI_Datatype element = MPI_DATATYPE_NULL;
        std::vector<double> send, result;
        std::vector<hsize_t> from, to;
        std::size_t header = 0, count_slots = 0;
    } inflight;

    // Collective when any series has rows to aggregate or `counts` (every rank knows the same
    // arguments): posts one MPI_Ireduce to rank 0 of rows [aggregated, to) of every aggregating
    // series and, with `counts`, of every series' row count of each per-rank row
    // (complete_reduce waits for it). Each rank drops the rows it posted.
    void post_reduce(const std::vector<hsize_t>& to, bool counts) {
        const double nan = std::numeric_limits<double>::quiet_NaN();
        const std::size_t groups = series.size();
        const std::size_t count_slots =
            counts ? static_cast<std::size_t>(per_rank_count) * groups : 0;
        std::vector<std::size_t> rows(groups);
        std::size_t payload = count_slots;
        for (std::size_t g = 0; g < groups; ++g) {
            const Series& s = series[g];
            rows[g] = s.aggregating() && to[g] > s.aggregated
                          ? static_cast<std::size_t>(to[g] - s.aggregated)
                          : 0;
            payload += rows[g] * row_width(s.columns.size());
        }
        if (payload == 0) return;
        InFlight& f = inflight;
        f.header = 2 + 2 * groups;
        f.count_slots = count_slots;
        f.send.assign(f.header + payload, 0.0);
        f.send[0] = static_cast<double>(groups);
        f.send[1] = static_cast<double>(count_slots);
        f.from.assign(groups, 0);
        f.to.assign(groups, 0);
        for (std::size_t g = 0; g < groups; ++g) {
            f.send[2 + 2 * g] = static_cast<double>(rows[g]);
            f.send[3 + 2 * g] = static_cast<double>(series[g].columns.size());
            f.from[g] = series[g].aggregated;
            f.to[g] = series[g].aggregated + rows[g];
        }
        if (per_rank && count_slots > 0) // the others leave zeros, the identity of max
            for (std::size_t g = 0; g < groups; ++g)
                f.send[f.header + per_rank_row * groups + g] =
                    static_cast<double>(series[g].appended);
        double* p = f.send.data() + f.header + count_slots;
        for (std::size_t g = 0; g < groups; ++g) {
            Series& s = series[g];
            const std::size_t columns = s.columns.size();
            // unaggregated holds this rank's rows [appended - held, appended), all >= aggregated.
            const std::int64_t held =
                s.unaggregated.empty() ? 0 : static_cast<std::int64_t>(s.unaggregated[0].size());
            const std::int64_t front = s.appended - held;
            for (std::size_t r = 0; r < rows[g]; ++r) {
                const std::int64_t i = static_cast<std::int64_t>(s.aggregated + r) - front;
                const bool have = i >= 0 && i < held;
                const std::size_t at = have ? static_cast<std::size_t>(i) : 0;
                for (std::size_t c = 0; c < columns; ++c, p += kStats) {
                    const double v = have ? s.unaggregated[c][at] : nan;
                    if (std::isfinite(v)) {
                        p[0] = p[1] = p[2] = v;
                        p[3] = 1;
                        p[4] = rank;
                    } else {
                        p[0] = p[1] = p[2] = p[3] = 0;
                        p[4] = -1;
                    }
                }
                const double key = have ? s.unaggregated[s.key][at] : nan;
                p[0] = std::isfinite(key) ? key : 0;
                p[1] = std::isfinite(key) ? rank : -1;
                for (std::size_t c = 0; c < columns; ++c)
                    p[2 + c] = std::isfinite(key) ? s.unaggregated[c][at] : nan;
                p += 2 + columns;
            }
            if (rows[g] > 0 && !s.unaggregated.empty()) { // drop the rows now below `to`
                const std::int64_t drop =
                    std::clamp<std::int64_t>(static_cast<std::int64_t>(f.to[g]) - front, 0, held);
                for (auto& column : s.unaggregated)
                    column.erase(column.begin(), column.begin() + drop);
            }
        }
        static MPI_Op op = [] {
            MPI_Op created = MPI_OP_NULL;
            MPI_Op_create(&reduce_aggregate_rows, /*commute=*/1, &created);
            return created;
        }();
        mpi_check(MPI_Type_contiguous(static_cast<int>(f.send.size()), MPI_DOUBLE, &f.element),
                  "MPI_Type_contiguous");
        MPI_Type_commit(&f.element);
        f.result.assign(rank == 0 ? f.send.size() : 0, 0.0);
        mpi_check(MPI_Ireduce(f.send.data(), rank == 0 ? f.result.data() : nullptr, 1, f.element,
                              op, 0, comm, &f.request),
                  "MPI_Ireduce");
    }

    // Collective (every rank has the same reduction in flight, or none): waits for the posted
    // reduction and returns its rows (rank 0) and what they cover; empty when none was posted.
    Reduced complete_reduce() {
        const double nan = std::numeric_limits<double>::quiet_NaN();
        Reduced out;
        InFlight& f = inflight;
        if (f.request == MPI_REQUEST_NULL) return out;
        const int rc = MPI_Wait(&f.request, MPI_STATUS_IGNORE);
        MPI_Type_free(&f.element);
        mpi_check(rc, "MPI_Wait (the aggregates' MPI_Ireduce)");
        out.from = f.from;
        out.to = f.to;
        out.rows.resize(series.size());
        out.has_counts = f.count_slots > 0;
        if (rank == 0) {
            const double* q = f.result.data() + f.header;
            out.counts.assign(q, q + f.count_slots);
            q += f.count_slots;
            for (std::size_t g = 0; g < series.size(); ++g) {
                const std::size_t rows = static_cast<std::size_t>(f.to[g] - f.from[g]);
                const std::size_t columns = series[g].columns.size();
                out.rows[g].resize(rows * columns);
                for (std::size_t r = 0; r < rows; ++r) {
                    const double* key = q + kStats * columns;
                    for (std::size_t c = 0; c < columns; ++c, q += kStats) {
                        AggregateRow& a = out.rows[g][c * rows + r]; // column-major
                        const bool any = q[3] > 0;
                        a.min = any ? q[0] : nan;
                        a.max = any ? q[1] : nan;
                        a.mean = any ? q[2] / q[3] : nan;
                        a.count = static_cast<std::int64_t>(q[3]);
                        a.argmax = any ? static_cast<std::int64_t>(q[4]) : -1;
                        a.slowest = key[1] >= 0 ? key[2 + c] : nan;
                    }
                    q += 2 + columns;
                }
            }
        }
        f = InFlight{};
        return out;
    }

    // Rank 0: what a completed reduction gives, into the file: its aggregate rows, and the
    // per-rank rows' counts when it carried them.
    void write_reduced(const Reduced& red) {
        if (rank != 0 || red.from.empty()) return;
        for (std::size_t g = 0; g < series.size(); ++g) {
            Series& s = series[g];
            if (s.aggregating() && red.to[g] > red.from[g]) {
                write_aggregates(s, red.rows[g], red.from[g], red.to[g]);
            }
            if (red.has_counts && per_rank_count > 0) {
                std::vector<std::int64_t> rank_rows(per_rank_count);
                for (hsize_t j = 0; j < per_rank_count; ++j)
                    rank_rows[j] = static_cast<std::int64_t>(red.counts[j * series.size() + g]);
                pwrite_all(reinterpret_cast<const char*>(rank_rows.data()),
                           rank_rows.size() * sizeof(std::int64_t), s.rank_rows_addr,
                           s.group + "/rank_rows");
            }
        }
    }

    // Rank 0, outside HDF5: rows [from, to) of every aggregate dataset of `s` (`rows`,
    // column-major).
    void write_aggregates(Series& s, const std::vector<AggregateRow>& rows, hsize_t from,
                          hsize_t to) {
        const hsize_t count = to - from;
        for (std::size_t c = 0; c < s.columns.size(); ++c)
            write_raw(s.agg_chunk_addr[c], s.chunk_rows, 0, from, count,
                      rows.data() + static_cast<std::ptrdiff_t>(c * count), sizeof(AggregateRow),
                      s.group + "/aggregate/" + s.columns[c].name);
    }

    // Rank 0, outside HDF5: empty rows (count 0, NaN, argmax -1) in [from, to) of every aggregate
    // dataset of `s`: the slots a grown extent added (no fill values), until their rows come.
    void write_empty_aggregates(Series& s, hsize_t from, hsize_t to) {
        if (to <= from) return;
        const double nan = std::numeric_limits<double>::quiet_NaN();
        const std::vector<AggregateRow> empty(to - from, AggregateRow{nan, nan, nan, -1, 0, nan});
        for (std::size_t c = 0; c < s.columns.size(); ++c)
            write_raw(s.agg_chunk_addr[c], s.chunk_rows, 0, from, to - from, empty.data(),
                      sizeof(AggregateRow), s.group + "/aggregate/" + s.columns[c].name);
    }

    // Collective (every rank the same calls): the file addresses of the chunks of `ds` that
    // cover `extent` rows along its last dimension (chunks of chunk_rows rows, one chunk across
    // the other dimension), looked up for the chunks not yet known; HDF5 allocates every chunk
    // of an extent when it grows (the MPI-IO driver's early allocation).
    void refresh_chunks(hid_t ds, int ndims, hsize_t extent, hsize_t chunk_rows,
                        std::vector<haddr_t>& addr, const std::string& object) {
        const std::size_t chunks = static_cast<std::size_t>((extent + chunk_rows - 1) / chunk_rows);
        for (std::size_t k = addr.size(); k < chunks; ++k) {
            hsize_t offset[2] = {0, 0};
            offset[ndims - 1] = static_cast<hsize_t>(k) * chunk_rows;
            unsigned filter_mask = 0;
            haddr_t where = HADDR_UNDEF;
            hsize_t bytes = 0;
            H5_CHECK(H5Dget_chunk_info_by_coord(ds, offset, &filter_mask, &where, &bytes), path,
                     object);
            if (where == HADDR_UNDEF)
                throw core::InternalError("RunFile: chunk " + std::to_string(k) + " of '" + object +
                                          "' in '" + path + "' is not allocated");
            addr.push_back(where);
        }
        addr.resize(chunks);
    }

    // Local: `count` elements of `element` bytes from `data` into row `row` of a chunked dataset
    // whose chunks span every row and chunk_rows elements along the last dimension ([R,
    // chunk_rows] row-major; a 1-D dataset: row 0), from element `start` on, with pwrite at the
    // chunks' addresses. The file's types are the memory's (declare_series checks).
    void write_raw(const std::vector<haddr_t>& addr, hsize_t chunk_rows, hsize_t row, hsize_t start,
                   hsize_t count, const void* data, std::size_t element,
                   const std::string& object) {
        const auto* bytes = static_cast<const char*>(data);
        hsize_t i = start;
        while (i < start + count) {
            const std::size_t k = static_cast<std::size_t>(i / chunk_rows);
            const hsize_t within = i % chunk_rows;
            const hsize_t run = std::min(chunk_rows - within, start + count - i);
            if (k >= addr.size())
                throw core::InternalError("RunFile: row " + std::to_string(i) + " of '" + object +
                                          "' lies beyond its allocated chunks in '" + path + "'");
            pwrite_all(bytes + (i - start) * element, static_cast<std::size_t>(run) * element,
                       addr[k] + (row * chunk_rows + within) * element, object);
            i += run;
        }
    }

    // Local: `size` bytes at file address `at` through raw_fd (opened at the first call).
    void pwrite_all(const char* p, std::size_t size, haddr_t at, const std::string& object) {
        if (raw_fd < 0) {
            raw_fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
            if (raw_fd < 0)
                throw core::OutputError("cannot open the run file '" + path +
                                        "' to write its rows: " + std::strerror(errno));
        }
        auto offset = static_cast<off_t>(at);
        while (size > 0) {
            const ssize_t wrote = ::pwrite(raw_fd, p, size, offset);
            if (wrote < 0 && errno == EINTR) continue;
            if (wrote <= 0) {
                const int error = wrote < 0 ? errno : EIO;
                throw core::OutputError(
                    "writing the run file '" + path + "' (" + object +
                    ") failed: " + std::strerror(error) +
                    (error == ENOSPC || error == EDQUOT
                         ? ": free space on its file system or choose another output.file"
                         : ""));
            }
            size -= static_cast<std::size_t>(wrote);
            p += wrote;
            offset += wrote;
        }
    }

    // AggregateRow in memory (native types): the file's type (aggregate_type) must equal it.
    hid_t aggregate_memory_type() {
        static const hid_t type = [] {
            const hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(AggregateRow));
            H5Tinsert(t, "min", HOFFSET(AggregateRow, min), H5T_NATIVE_DOUBLE);
            H5Tinsert(t, "mean", HOFFSET(AggregateRow, mean), H5T_NATIVE_DOUBLE);
            H5Tinsert(t, "max", HOFFSET(AggregateRow, max), H5T_NATIVE_DOUBLE);
            H5Tinsert(t, "argmax", HOFFSET(AggregateRow, argmax), H5T_NATIVE_INT64);
            H5Tinsert(t, "count", HOFFSET(AggregateRow, count), H5T_NATIVE_INT64);
            H5Tinsert(t, "slowest", HOFFSET(AggregateRow, slowest), H5T_NATIVE_DOUBLE);
            return t; // lives for the process, like HDF5's predefined types
        }();
        return type;
    }

    // Local: this rank's new rows of every series into its row of each column, and NaN in its
    // slots that a grown extent added beyond them (the datasets have no fill values: the MPI-IO
    // driver would write them with collective writes whenever an extent grows). One pwrite per
    // column and chunk (write_raw); nothing on a rank that does not write per-rank rows
    // (select_per_rank).
    void write_rows() {
        if (!per_rank) return;
        const double nan = std::numeric_limits<double>::quiet_NaN();
        for (std::size_t g = 0; g < series.size(); ++g) {
            Series& s = series[g];
            const hsize_t n = s.pending[0].size();
            hsize_t to = std::min(s.written + n, s.extent);
            if (s.padded < s.extent) to = s.extent; // slots an extent added: rows, then NaN
            if (to > s.written) {
                const hsize_t count = to - s.written;
                std::vector<double> buffer(count, nan);
                for (std::size_t c = 0; c < s.columns.size(); ++c) {
                    std::copy(s.pending[c].begin(), s.pending[c].end(), buffer.begin());
                    write_raw(s.chunk_addr[c], s.chunk_rows, per_rank_row, s.written, count,
                              buffer.data(), sizeof(double), s.group + "/" + s.columns[c].name);
                }
            }
            s.padded = std::max(s.padded, to);
            for (auto& column : s.pending)
                column.clear();
            s.written += n;
            stats.rows_written += static_cast<std::int64_t>(n);
        }
    }

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

// ------------------------------------------------------------------------------------------------

RunFile::RunFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RunFile::RunFile(RunFile&&) noexcept = default;
RunFile& RunFile::operator=(RunFile&& other) noexcept {
    if (this != &other) {
        if (impl_ && impl_->file >= 0 && std::uncaught_exceptions() == 0) {
            try {
                close();
            } catch (const std::exception& e) {
                core::log::error() << "closing run file '" << impl_->path << "': " << e.what();
            }
        }
        impl_ = std::move(other.impl_);
    }
    return *this;
}

RunFile::~RunFile() {
    if (!impl_ || impl_->file < 0) return;
    if (std::uncaught_exceptions() > 0) return; // see the header: never wait for absent peers
    try {
        close();
    } catch (const std::exception& e) {
        core::log::error() << "closing run file '" << impl_->path << "': " << e.what();
    }
}

RunFile RunFile::create(MPI_Comm comm, const std::string& path, bool overwrite,
                        const std::vector<Attribute>& root_attrs, SchemaCheck check,
                        const AccessHints& hints) {
    detail::silence_hdf5_error_printing();
    auto impl = std::make_unique<Impl>();
    impl->check = check;
    impl->path = path;
    for (const Attribute& a : root_attrs) // before anything is created: the same on every rank
        impl->check_member(schema::Kind::attribute, "/", a.name, "");
    mpi_check(MPI_Comm_dup(comm, &impl->comm), "MPI_Comm_dup");
    MPI_Comm_rank(impl->comm, &impl->rank);
    MPI_Comm_size(impl->comm, &impl->size);
    impl->per_rank_row = static_cast<hsize_t>(impl->rank); // every rank (select_per_rank)
    impl->per_rank_count = static_cast<hsize_t>(impl->size);
    if (impl->rank == 0) {
        impl->per_rank_ranks.resize(static_cast<std::size_t>(impl->size));
        std::iota(impl->per_rank_ranks.begin(), impl->per_rank_ranks.end(), std::int64_t{0});
    }

    // Rank 0 decides whether the path is usable; every rank raises the same error.
    std::string verdict = impl->rank == 0 ? check_output_path(path, overwrite) : std::string();
    bcast_string(impl->comm, verdict);
    if (!verdict.empty()) throw_collective_output_error(verdict);

    std::string local_error;
    try {
        Handle fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS), path, "file access list"), H5Pclose);
        MPI_Info info = MPI_INFO_NULL;
        if (!hints.mpi_hints.empty()) {
            MPI_Info_create(&info);
            for (const auto& [key, value] : hints.mpi_hints)
                MPI_Info_set(info, key.c_str(), value.c_str());
        }
        const herr_t set = H5Pset_fapl_mpio(fapl, impl->comm, info); // HDF5 keeps a copy
        if (info != MPI_INFO_NULL) MPI_Info_free(&info);
        H5_CHECK(set, path, "file access list");
        if (hints.alignment_bytes > 0)
            H5_CHECK(H5Pset_alignment(fapl, static_cast<hsize_t>(hints.alignment_bytes),
                                      static_cast<hsize_t>(hints.alignment_bytes)),
                     path, "file access list");
        // Collective metadata reads (rank 0 reads, then broadcasts) need every rank's metadata
        // cache to miss at the same calls: every rank writes its own rows into the same chunks
        // (a chunk spans all ranks, declare_series), so their chunk lookups load the same index
        // nodes. A first version had one writer per node, whose lookups alone then turned a
        // later cache miss into a broadcast the other ranks never joined (MPI_ERR_TRUNCATE).
        H5_CHECK(H5Pset_all_coll_metadata_ops(fapl, 1), path, "file access list");
        H5_CHECK(H5Pset_coll_metadata_write(fapl, 1), path, "file access list");
        // EXCL when not overwriting: a file appearing since rank 0's check is not clobbered.
        impl->file = H5_CHECK(
            H5Fcreate(path.c_str(), overwrite ? H5F_ACC_TRUNC : H5F_ACC_EXCL, H5P_DEFAULT, fapl),
            path, "");
    } catch (const core::OutputError& e) {
        local_error = e.what();
        if (std::error_code ec; !overwrite && fs::exists(path, ec))
            local_error = "output file '" + path +
                          "' appeared while this job was starting (another job with the same "
                          "output.file?) and is left untouched: choose another output.file, or "
                          "set output.overwrite=true to replace it";
    }
    const std::string shared_error = agree_on_error(impl->comm, local_error);
    if (!shared_error.empty()) {
        if (impl->file >= 0) { // created on some ranks only: close it there (best effort)
            H5Fclose(impl->file);
            impl->file = H5I_INVALID_HID;
        }
        throw_collective_output_error(shared_error);
    }

    impl->dxpl = Handle(H5_CHECK(H5Pcreate(H5P_DATASET_XFER), path, "transfer list"), H5Pclose);
    H5_CHECK(H5Pset_dxpl_mpio(impl->dxpl, H5FD_MPIO_COLLECTIVE), path, "transfer list");
    for (auto [list, cls] :
         {std::pair{&impl->lapl, H5P_LINK_ACCESS}, std::pair{&impl->gapl, H5P_GROUP_ACCESS},
          std::pair{&impl->dapl, H5P_DATASET_ACCESS},
          std::pair{&impl->aapl, H5P_ATTRIBUTE_ACCESS}}) {
        *list = Handle(H5_CHECK(H5Pcreate(cls), path, "access list"), H5Pclose);
        H5_CHECK(H5Pset_all_coll_metadata_ops(*list, 1), path, "access list");
    }

    std::vector<Attribute> attrs = {
        {"schema", std::string(kSchema)},
        {"status", std::string("running")},
        {"created_utc", utc_now_iso8601()},
        {"world_size", static_cast<std::int64_t>(impl->size)},
    };
    attrs.insert(attrs.end(), root_attrs.begin(), root_attrs.end());
    RunFile run_file(std::move(impl));
    run_file.impl_->write_root_attributes(attrs);
    run_file.impl_->flush_file();
    return run_file; // last_sync stays -inf: the first flush (the run's preamble) syncs too
}

void RunFile::set_attributes(std::string_view group_path, const std::vector<Attribute>& attrs) {
    Impl& m = checked("set_attributes");
    std::string packed = m.rank == 0 ? pack(attrs) : std::string();
    bcast_string(m.comm, packed);
    const std::string group_name = normalize(group_path);
    const std::vector<Attribute> shared = unpack(packed);
    for (const Attribute& a : shared)
        m.check_member(schema::Kind::attribute, group_name, a.name, "");
    Handle group = m.ensure_group(group_name);
    for (const auto& a : shared)
        m.write_attribute(group, group_name, a);
}

void RunFile::write_string_dataset(std::string_view dataset_path, const std::string& text) {
    Impl& m = checked("write_string_dataset");
    std::string shared = text;
    bcast_string(m.comm, shared);
    const std::string object = normalize(dataset_path);
    m.check_object(object, {schema::Kind::text}, "text");
    Handle parent = m.ensure_group(parent_of(object));
    m.unlink_if_exists(object);

    Handle type = fixed_string_type(shared.size(), m.path);
    Handle space(H5_CHECK(H5Screate(H5S_SCALAR), m.path, object), H5Sclose);
    Handle ds(
        H5_CHECK(H5Dcreate2(m.file, object.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, m.dapl),
                 m.path, object),
        H5Dclose);
    // Rank 0 writes the value; the others join the collective write with empty selections.
    Handle mspace(H5_CHECK(H5Screate(H5S_SCALAR), m.path, object), H5Sclose);
    Handle fspace(H5_CHECK(H5Dget_space(ds), m.path, object), H5Sclose);
    if (m.rank != 0) {
        H5_CHECK(H5Sselect_none(mspace), m.path, object);
        H5_CHECK(H5Sselect_none(fspace), m.path, object);
    }
    shared.resize(std::max<std::size_t>(shared.size(), 1), '\0'); // width is at least 1
    H5_CHECK(H5Dwrite(ds, type, mspace, fspace, m.dxpl, shared.data()), m.path, object);
    m.write_units(ds, object, "text");
}

void RunFile::write_ranks(const RankRow& mine) {
    Impl& m = checked("write_ranks");
    const std::string object(schema::kRanks);
    m.check_object(object, {schema::Kind::compound}, "1");
    const std::array<const std::string*, 5> texts = {
        &mine.hostname, &mine.device, &mine.device_name, &mine.pci_bus_id, &mine.cpu_affinity};
    // Fixed-length string fields as wide as the longest value on any rank.
    std::array<std::int64_t, 5> local{}, width{};
    for (std::size_t i = 0; i < texts.size(); ++i)
        local[i] = static_cast<std::int64_t>(texts[i]->size());
    mpi_check(MPI_Allreduce(local.data(), width.data(), 5, MPI_INT64_T, MPI_MAX, m.comm),
              "MPI_Allreduce");
    for (auto& w : width)
        w = std::max<std::int64_t>(w, 1);

    // Packed record layout, in the order of RankRow; file and memory types differ only in the
    // byte order of the integers (HDF5 converts field by field, matched by name).
    struct Field {
        const char* name;
        std::size_t offset;
        hid_t file_type;
        hid_t mem_type;
        std::size_t text; // index into texts/width, or npos for integers
    };
    constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();
    std::vector<Field> fields;
    std::size_t offset = 0;
    auto add_int = [&](const char* name, hid_t ft, hid_t mt, std::size_t bytes) {
        fields.push_back({name, offset, ft, mt, npos});
        offset += bytes;
    };
    auto add_text = [&](const char* name, std::size_t i) {
        fields.push_back({name, offset, H5I_INVALID_HID, H5I_INVALID_HID, i});
        offset += static_cast<std::size_t>(width[i]);
    };
    add_int("rank", H5T_STD_I32LE, H5T_NATIVE_INT32, 4);
    add_int("local_rank", H5T_STD_I32LE, H5T_NATIVE_INT32, 4);
    add_int("node", H5T_STD_I32LE, H5T_NATIVE_INT32, 4);
    add_text("hostname", 0);
    add_int("pid", H5T_STD_I64LE, H5T_NATIVE_INT64, 8);
    add_text("device", 1);
    add_text("device_name", 2);
    add_text("pci_bus_id", 3);
    add_text("cpu_affinity", 4);
    const std::size_t record = offset;

    Handle file_type(H5_CHECK(H5Tcreate(H5T_COMPOUND, record), m.path, object), H5Tclose);
    Handle mem_type(H5_CHECK(H5Tcreate(H5T_COMPOUND, record), m.path, object), H5Tclose);
    std::vector<Handle> string_types;
    for (const auto& f : fields) {
        if (f.text == npos) {
            H5_CHECK(H5Tinsert(file_type, f.name, f.offset, f.file_type), m.path, object);
            H5_CHECK(H5Tinsert(mem_type, f.name, f.offset, f.mem_type), m.path, object);
        } else {
            string_types.push_back(fixed_string_type(width[f.text], m.path));
            H5_CHECK(H5Tinsert(file_type, f.name, f.offset, string_types.back()), m.path, object);
            H5_CHECK(H5Tinsert(mem_type, f.name, f.offset, string_types.back()), m.path, object);
        }
    }

    std::vector<char> row(record, '\0');
    const std::int32_t ints[3] = {mine.rank, mine.local_rank, mine.node};
    const std::int64_t pid = mine.pid;
    for (std::size_t i = 0; i < 3; ++i)
        std::memcpy(row.data() + fields[i].offset, &ints[i], 4);
    std::memcpy(row.data() + fields[4].offset, &pid, 8);
    for (const auto& f : fields)
        if (f.text != npos)
            std::memcpy(row.data() + f.offset, texts[f.text]->data(), texts[f.text]->size());

    m.unlink_if_exists(object);
    const hsize_t n = static_cast<hsize_t>(m.size);
    Handle space(H5_CHECK(H5Screate_simple(1, &n, nullptr), m.path, object), H5Sclose);
    Handle ds(H5_CHECK(H5Dcreate2(m.file, object.c_str(), file_type, space, H5P_DEFAULT,
                                  H5P_DEFAULT, m.dapl),
                       m.path, object),
              H5Dclose);
    const hsize_t start = static_cast<hsize_t>(m.rank), count = 1;
    Handle fspace(H5_CHECK(H5Dget_space(ds), m.path, object), H5Sclose);
    H5_CHECK(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, nullptr, &count, nullptr), m.path,
             object);
    Handle mspace(H5_CHECK(H5Screate_simple(1, &count, nullptr), m.path, object), H5Sclose);
    H5_CHECK(H5Dwrite(ds, mem_type, mspace, fspace, m.dxpl, row.data()), m.path, object);
    m.write_units(ds, object, "1");
}

void RunFile::select_per_rank(bool mine) {
    Impl& m = checked("select_per_rank");
    if (!m.series.empty())
        throw core::InternalError("RunFile::select_per_rank: call it before declare_series ('" +
                                  m.path + "')");
    const int flag = mine ? 1 : 0;
    int before = 0, count = 0;
    mpi_check(MPI_Exscan(&flag, &before, 1, MPI_INT, MPI_SUM, m.comm), "MPI_Exscan");
    if (m.rank == 0) before = 0; // MPI_Exscan leaves rank 0's result undefined
    mpi_check(MPI_Allreduce(&flag, &count, 1, MPI_INT, MPI_SUM, m.comm), "MPI_Allreduce");
    std::vector<int> flags(m.rank == 0 ? static_cast<std::size_t>(m.size) : 0);
    mpi_check(MPI_Gather(&flag, 1, MPI_INT, flags.data(), 1, MPI_INT, 0, m.comm), "MPI_Gather");
    m.per_rank = mine;
    m.per_rank_row = static_cast<hsize_t>(before);
    m.per_rank_count = static_cast<hsize_t>(count);
    m.per_rank_ranks.clear();
    for (int r = 0; r < static_cast<int>(flags.size()); ++r)
        if (flags[static_cast<std::size_t>(r)]) m.per_rank_ranks.push_back(r);
}

int RunFile::per_rank_count() const {
    return static_cast<int>(checked("per_rank_count").per_rank_count);
}

void RunFile::declare_series(std::string_view group, const std::vector<Column>& columns,
                             std::size_t chunk_rows, const std::string& aggregate_by) {
    Impl& m = checked("declare_series");
    const std::string name = normalize(group);
    if (name == "/" || columns.empty() || chunk_rows == 0)
        throw core::InternalError(
            "RunFile::declare_series('" + name +
            "'): needs a group name, at least one column and chunk_rows >= 1");
    if (m.series_index.count(name))
        throw core::InternalError("RunFile::declare_series: series '" + name +
                                  "' is already declared in '" + m.path + "'");
    std::string signature = name + ":" + std::to_string(chunk_rows) + ":" + aggregate_by;
    std::size_t key = std::string::npos;
    for (std::size_t i = 0; i < columns.size(); ++i) {
        const auto& c = columns[i];
        if (c.name.empty() || c.name.find('/') != std::string::npos || c.name == "ranks" ||
            c.name == "rank_rows" || c.name == "aggregate")
            throw core::InternalError("RunFile::declare_series('" + name + "'): bad column name '" +
                                      c.name + "'");
        for (std::size_t j = 0; j < i; ++j)
            if (columns[j].name == c.name)
                throw core::InternalError("RunFile::declare_series('" + name +
                                          "'): duplicate column '" + c.name + "'");
        if (c.name == aggregate_by) key = i;
        signature += "," + c.name + "[" + c.units + "]";
    }
    if (!aggregate_by.empty() && key == std::string::npos)
        throw core::InternalError("RunFile::declare_series('" + name + "'): aggregate_by '" +
                                  aggregate_by + "' is not one of its columns");
    m.check_object(name, {schema::Kind::series}, "");
    for (const Column& c : columns)
        m.check_member(schema::Kind::column, name, c.name, c.units);
    if (!aggregate_by.empty()) {
        m.check_object(name + "/aggregate", {schema::Kind::group}, "");
        for (const Column& c : columns)
            m.check_object(name + "/aggregate/" + c.name, {schema::Kind::compound}, "");
    }
    // Every rank must create the same datasets: compare a hash of the declaration.
    const std::uint64_t h = std::hash<std::string>{}(signature);
    std::uint64_t mine[2] = {h, ~h}, most[2] = {0, 0};
    mpi_check(MPI_Allreduce(mine, most, 2, MPI_UINT64_T, MPI_MAX, m.comm), "MPI_Allreduce");
    if (most[0] != h || most[1] != ~h)
        throw core::InternalError("RunFile::declare_series('" + name +
                                  "'): ranks declared different columns");

    Handle grp = m.ensure_group(name);
    // Chunks span every per-rank row and chunk_rows rows (RunFile::declare_series in the
    // header), so the writing ranks' independent writes of a flush land in the same chunks. The
    // MPI-IO driver allocates every chunk of an extent when the extent grows, so chunks stay
    // small for short runs; there are no fill values (the allocation would write them with
    // collective writes): each writing rank writes NaN into its slots that a grown extent adds
    // (write_rows), rank 0 empty rows into the aggregates' (write_aggregates).
    const hsize_t rows_r = m.per_rank_count;
    const hsize_t chunk_r = std::max<hsize_t>(rows_r, 1); // a chunk of a [0, n] dataset
    Handle dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE), m.path, name), H5Pclose);
    const hsize_t chunk[2] = {chunk_r, static_cast<hsize_t>(chunk_rows)};
    H5_CHECK(H5Pset_chunk(dcpl, 2, chunk), m.path, name);
    H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER), m.path, name);
    const hsize_t dims[2] = {rows_r, 0};
    const hsize_t max_dims[2] = {chunk_r, H5S_UNLIMITED};
    Handle space(H5_CHECK(H5Screate_simple(2, dims, max_dims), m.path, name), H5Sclose);

    // The rows and aggregates are written as bytes (write_raw): the file's types must be the
    // memory's.
    if (H5Tequal(H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE) <= 0 ||
        H5Tequal(H5T_STD_I64LE, H5T_NATIVE_INT64) <= 0)
        throw core::InternalError("RunFile: this host's doubles or int64 are not little-endian "
                                  "IEEE, which the run file's raw row writes assume");
    Series s;
    s.group = name;
    s.columns = columns;
    s.pending.resize(columns.size());
    s.chunk_addr.resize(columns.size());
    s.handle = Handle(H5_CHECK(H5Gopen2(m.file, name.c_str(), m.gapl), m.path, name), H5Gclose);
    s.chunk_rows = static_cast<hsize_t>(chunk_rows);
    std::string column_list;
    for (const auto& c : columns) {
        const std::string object = name + "/" + c.name;
        s.datasets.emplace_back(H5_CHECK(H5Dcreate2(m.file, object.c_str(), H5T_IEEE_F64LE, space,
                                                    H5P_DEFAULT, dcpl, m.dapl),
                                         m.path, object),
                                H5Dclose);
        m.write_units(s.datasets.back(), object, c.units);
        column_list += (column_list.empty() ? "" : ",") + c.name;
    }
    // Rows per per-rank row, and the rank of each: datasets (an attribute of world_size elements
    // outgrows HDF5's 64 KiB object-header message limit at 8,184 ranks). rank_rows is zeros
    // until rank 0 rewrites it at a flush; rank 0 writes `ranks` now.
    for (const char* index : {"rank_rows", "ranks"}) {
        const std::string object = name + "/" + index;
        Handle ispace(H5_CHECK(H5Screate_simple(1, &rows_r, nullptr), m.path, object), H5Sclose);
        Handle idcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE), m.path, object), H5Pclose);
        const std::int64_t zero = 0;
        H5_CHECK(H5Pset_fill_value(idcpl, H5T_NATIVE_INT64, &zero), m.path, object);
        Handle ds(H5_CHECK(H5Dcreate2(m.file, object.c_str(), H5T_STD_I64LE, ispace, H5P_DEFAULT,
                                      idcpl, m.dapl),
                           m.path, object),
                  H5Dclose);
        m.write_units(ds, object, "1");
        // Contiguous storage, allocated at creation (the MPI-IO driver); written with pwrite.
        const haddr_t at = rows_r > 0 ? H5Dget_offset(ds) : HADDR_UNDEF;
        if (rows_r > 0 && at == HADDR_UNDEF)
            throw core::InternalError("RunFile: '" + object + "' in '" + m.path +
                                      "' has no storage");
        if (std::string_view(index) == "ranks") {
            if (m.rank == 0 && rows_r > 0) {
                try { // rank 0 alone: every rank raises a failure at the next flush
                    m.pwrite_all(reinterpret_cast<const char*>(m.per_rank_ranks.data()),
                                 rows_r * sizeof(std::int64_t), at, object);
                } catch (const core::OutputError& e) {
                    m.write_error = e.what();
                }
            }
        } else {
            s.rank_rows = std::move(ds);
            s.rank_rows_addr = at;
        }
    }
    m.write_attribute(grp, name, Attribute{"columns", column_list});

    if (key != std::string::npos) {
        // Aggregates over every rank: one compound dataset [n] per column, chunked like the
        // series' rows (a chunk of 64 rows is 3 KiB).
        s.key = key;
        s.unaggregated.resize(columns.size());
        s.agg_chunk_addr.resize(columns.size());
        const std::string agg = name + "/aggregate";
        s.aggregate_group = m.ensure_group(agg);
        if (m.aggregate_type < 0) {
            Handle t(H5_CHECK(H5Tcreate(H5T_COMPOUND, sizeof(AggregateRow)), m.path, agg),
                     H5Tclose);
            const std::pair<const char*, std::pair<std::size_t, hid_t>> fields[] = {
                {"min", {HOFFSET(AggregateRow, min), H5T_IEEE_F64LE}},
                {"mean", {HOFFSET(AggregateRow, mean), H5T_IEEE_F64LE}},
                {"max", {HOFFSET(AggregateRow, max), H5T_IEEE_F64LE}},
                {"argmax", {HOFFSET(AggregateRow, argmax), H5T_STD_I64LE}},
                {"count", {HOFFSET(AggregateRow, count), H5T_STD_I64LE}},
                {"slowest", {HOFFSET(AggregateRow, slowest), H5T_IEEE_F64LE}},
            };
            for (const auto& [field, where] : fields)
                H5_CHECK(H5Tinsert(t, field, where.first, where.second), m.path, agg);
            if (H5Tequal(t, m.aggregate_memory_type()) <= 0)
                throw core::InternalError("RunFile: AggregateRow's memory layout is not the "
                                          "file's, which the raw aggregate writes assume");
            m.aggregate_type = std::move(t);
        }
        Handle adcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE), m.path, agg), H5Pclose);
        const hsize_t achunk = static_cast<hsize_t>(chunk_rows);
        H5_CHECK(H5Pset_chunk(adcpl, 1, &achunk), m.path, agg);
        H5_CHECK(H5Pset_fill_time(adcpl, H5D_FILL_TIME_NEVER), m.path, agg);
        const hsize_t adims = 0, amax = H5S_UNLIMITED;
        Handle aspace(H5_CHECK(H5Screate_simple(1, &adims, &amax), m.path, agg), H5Sclose);
        for (const auto& c : columns) {
            const std::string object = agg + "/" + c.name;
            s.aggregates.emplace_back(H5_CHECK(H5Dcreate2(m.file, object.c_str(), m.aggregate_type,
                                                          aspace, H5P_DEFAULT, adcpl, m.dapl),
                                               m.path, object),
                                      H5Dclose);
            m.write_units(s.aggregates.back(), object, c.units);
        }
        m.write_attribute(s.aggregate_group, agg, Attribute{"slowest_by", aggregate_by});
        m.write_attribute(s.aggregate_group, agg, Attribute{"rows", std::int64_t{0}});
    }
    // The first chunk of rows is allocated now, at start-up, not inside the first flush: growing
    // every column's extent (and finding its chunks' addresses) is the flush's costliest
    // collective metadata work, done again only every chunk_rows rows.
    m.resize_rows(s, s.chunk_rows);
    if (s.aggregating()) m.resize_aggregates(s, s.chunk_rows);
    m.series_index[name] = m.series.size();
    m.series.push_back(std::move(s));
}

void RunFile::append(std::string_view group, const std::vector<double>& row) {
    Series& s = checked("append").find_series(group, "append");
    if (row.size() != s.columns.size())
        throw core::InternalError("RunFile::append('" + s.group + "'): row has " +
                                  std::to_string(row.size()) + " values, the series has " +
                                  std::to_string(s.columns.size()) + " columns");
    const Impl& m = *impl_;
    if (m.per_rank)
        for (std::size_t c = 0; c < row.size(); ++c)
            s.pending[c].push_back(row[c]);
    // A row that a status change already aggregated without this rank (it was behind) stays out.
    if (s.aggregating() && static_cast<hsize_t>(s.appended) >= s.aggregated)
        for (std::size_t c = 0; c < row.size(); ++c)
            s.unaggregated[c].push_back(row[c]);
    ++s.appended;
}

std::size_t RunFile::rows(std::string_view group) const {
    const Series& s = checked("rows").find_series(group, "rows");
    return static_cast<std::size_t>(s.appended);
}

std::size_t RunFile::columns(std::string_view group) const {
    return checked("columns").find_series(group, "columns").columns.size();
}

MPI_Comm RunFile::comm() const {
    return checked("comm").comm;
}

void RunFile::flush() {
    Impl& m = checked("flush");
    m.write_pending(/*force_sync=*/false);
    m.stats.record(MPI_Wtime() - m.arrived, m.arrival_wait);
}

void RunFile::set_status(const std::string& status) {
    Impl& m = checked("set_status");
    if (std::find(kStatuses.begin(), kStatuses.end(), status) == kStatuses.end())
        throw core::InternalError("RunFile::set_status: '" + status +
                                  "' is not one of running|completed|failed|interrupted");
    const double start = MPI_Wtime();
    std::vector<Attribute> attrs = {{"status", status}};
    if (status != "running") attrs.push_back({"finished_utc", utc_now_iso8601()});
    m.write_root_attributes(attrs);
    // A status change always reaches the disk (and rewrites flushed_utc with it); extents become
    // exact.
    const double before = MPI_Wtime();
    m.write_pending(/*force_sync=*/true, /*exact=*/true);
    // The status attributes' broadcast and writes before it count as the flush's work.
    m.stats.record(MPI_Wtime() - m.arrived + (before - start), m.arrival_wait);
}

void RunFile::set_sync_interval(double seconds) {
    checked("set_sync_interval").sync_every_s = std::max(0.0, seconds);
}

const FlushStats& RunFile::flush_stats() const {
    return checked("flush_stats").stats;
}

// Every rank needs every count (for the index datasets), so one allgather replaces the MPI_Exscan
// + MPI_Allreduce pair: offsets are its prefix sums. Returns {offsets, counts}, each [world_size].
std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>
RunFile::Impl::ragged_layout(std::size_t mine) {
    const std::int64_t n = static_cast<std::int64_t>(mine);
    std::vector<std::int64_t> counts(size), offsets(size, 0);
    mpi_check(MPI_Allgather(&n, 1, MPI_INT64_T, counts.data(), 1, MPI_INT64_T, comm),
              "MPI_Allgather");
    for (int r = 1; r < size; ++r)
        offsets[r] = offsets[r - 1] + counts[r - 1];
    return {offsets, counts};
}

void RunFile::Impl::write_1d(const std::string& name, hid_t file_type, hid_t mem_type,
                             hsize_t length, hsize_t start, hsize_t count, const void* buf,
                             const std::string& units) {
    unlink_if_exists(name);
    Handle space(H5_CHECK(H5Screate_simple(1, &length, nullptr), path, name), H5Sclose);
    Handle ds(
        H5_CHECK(H5Dcreate2(file, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT, dapl),
                 path, name),
        H5Dclose);
    // A rank with nothing to write still joins the collective H5Dwrite with empty selections; the
    // buffer must then be non-null but is never read.
    static const std::int64_t nothing[8] = {};
    const hsize_t mdims = std::max<hsize_t>(count, 1);
    Handle mspace(H5_CHECK(H5Screate_simple(1, &mdims, nullptr), path, name), H5Sclose);
    Handle fspace(H5_CHECK(H5Dget_space(ds), path, name), H5Sclose);
    if (count > 0) {
        H5_CHECK(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, nullptr, &count, nullptr),
                 path, name);
    } else {
        H5_CHECK(H5Sselect_none(fspace), path, name);
        H5_CHECK(H5Sselect_none(mspace), path, name);
    }
    // An empty dataset has no storage to write to (HDF5 fails with an address overflow); every
    // rank knows `length`, so all skip the write together.
    if (length > 0)
        H5_CHECK(H5Dwrite(ds, mem_type, mspace, fspace, dxpl, count > 0 ? buf : nothing), path,
                 name);
    write_units(ds, name, units);
}

void RunFile::Impl::write_ragged_index(const std::string& object,
                                       const std::vector<std::int64_t>& offsets,
                                       const std::vector<std::int64_t>& counts) {
    // The index datasets are identical on every rank: rank 0 writes them whole.
    const hsize_t ws = static_cast<hsize_t>(size);
    const hsize_t index_count = rank == 0 ? ws : 0;
    write_1d(object + "_offset", H5T_STD_I64LE, H5T_NATIVE_INT64, ws, 0, index_count,
             offsets.data(), "1");
    write_1d(object + "_count", H5T_STD_I64LE, H5T_NATIVE_INT64, ws, 0, index_count, counts.data(),
             "1");
}

void RunFile::write_ragged(std::string_view dataset_path, const std::vector<double>& mine,
                           const std::string& units) {
    Impl& m = checked("write_ragged");
    const std::string object = normalize(dataset_path);
    m.check_table_column(object, units);
    const auto [offsets, counts] = m.ragged_layout(mine.size());
    const hsize_t total = static_cast<hsize_t>(offsets.back() + counts.back());
    m.ensure_group(parent_of(object));
    m.write_1d(object, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, total,
               static_cast<hsize_t>(offsets[m.rank]), mine.size(), mine.data(), units);
    m.write_ragged_index(object, offsets, counts);
}

void RunFile::write_ragged_strings(std::string_view dataset_path,
                                   const std::vector<std::string>& mine) {
    Impl& m = checked("write_ragged_strings");
    const std::string object = normalize(dataset_path);
    m.check_table_column(object, "text");
    const auto [offsets, counts] = m.ragged_layout(mine.size());
    const hsize_t total = static_cast<hsize_t>(offsets.back() + counts.back());
    // One fixed width for the whole dataset: the longest string on any rank (at least 1 byte).
    std::int64_t local_width = 1, width = 1;
    for (const auto& text : mine)
        local_width = std::max<std::int64_t>(local_width, static_cast<std::int64_t>(text.size()));
    mpi_check(MPI_Allreduce(&local_width, &width, 1, MPI_INT64_T, MPI_MAX, m.comm),
              "MPI_Allreduce");
    const std::size_t w = static_cast<std::size_t>(width);
    std::vector<char> packed(mine.size() * w, '\0'); // NUL-padded, row i at i * w
    for (std::size_t i = 0; i < mine.size(); ++i)
        std::memcpy(packed.data() + i * w, mine[i].data(), mine[i].size());
    m.ensure_group(parent_of(object));
    Handle type = fixed_string_type(w, m.path);
    m.write_1d(object, type, type, total, static_cast<hsize_t>(offsets[m.rank]), mine.size(),
               packed.data(), "text");
    m.write_ragged_index(object, offsets, counts);
}

void RunFile::write_per_rank(std::string_view dataset_path, double mine, const std::string& units) {
    Impl& m = checked("write_per_rank");
    const std::string object = normalize(dataset_path);
    m.check_object(object, {schema::Kind::per_rank}, units);
    m.ensure_group(parent_of(object));
    m.write_1d(object, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, static_cast<hsize_t>(m.size),
               static_cast<hsize_t>(m.rank), 1, &mine, units);
}

void RunFile::write_vector(std::string_view dataset_path, const std::vector<double>& values,
                           const std::string& units) {
    Impl& m = checked("write_vector");
    const std::string object = normalize(dataset_path);
    m.check_object(object, {schema::Kind::vector}, units);
    // Every rank must create the dataset with the same extent: rank 0's length decides.
    std::uint64_t n = values.size();
    mpi_check(MPI_Bcast(&n, 1, MPI_UINT64_T, 0, m.comm), "MPI_Bcast");
    m.ensure_group(parent_of(object));
    m.unlink_if_exists(object);
    const hsize_t length = n;
    Handle space(H5_CHECK(H5Screate_simple(1, &length, nullptr), m.path, object), H5Sclose);
    Handle ds(H5_CHECK(H5Dcreate2(m.file, object.c_str(), H5T_IEEE_F64LE, space, H5P_DEFAULT,
                                  H5P_DEFAULT, m.dapl),
                       m.path, object),
              H5Dclose);
    // Rank 0 writes everything; the others join the collective write with empty selections.
    const hsize_t mdims = std::max<hsize_t>(length, 1);
    Handle mspace(H5_CHECK(H5Screate_simple(1, &mdims, nullptr), m.path, object), H5Sclose);
    Handle fspace(H5_CHECK(H5Dget_space(ds), m.path, object), H5Sclose);
    if (m.rank != 0 || length == 0) {
        H5_CHECK(H5Sselect_none(mspace), m.path, object);
        H5_CHECK(H5Sselect_none(fspace), m.path, object);
    }
    // An empty dataset has no storage to write to (HDF5 1.10 fails even an empty selection);
    // every rank knows the length, so all skip the write together.
    static const double nothing = 0.0;
    const double* buf = m.rank == 0 && length > 0 ? values.data() : &nothing;
    if (length > 0)
        H5_CHECK(H5Dwrite(ds, H5T_NATIVE_DOUBLE, mspace, fspace, m.dxpl, buf), m.path, object);
    m.write_units(ds, object, units);
}

void RunFile::close() {
    if (!impl_ || impl_->file < 0) return;
    Impl& m = *impl_;
    // Buffered rows are written even if the caller forgot a final flush; a failure there still
    // closes the file (the error is symmetric: every rank made the same calls) and is rethrown.
    std::exception_ptr failure;
    try {
        m.write_pending(/*force_sync=*/true, /*exact=*/true);
    } catch (...) {
        failure = std::current_exception();
    }
    if (m.raw_fd >= 0) {
        ::close(m.raw_fd);
        m.raw_fd = -1;
    }
    m.series.clear();
    m.series_index.clear();
    for (Handle* h : {&m.dxpl, &m.lapl, &m.gapl, &m.dapl, &m.aapl, &m.aggregate_type})
        h->reset();
    const hid_t file = std::exchange(m.file, H5I_INVALID_HID);
    const herr_t closed = H5Fclose(file);
    if (m.comm != MPI_COMM_NULL) MPI_Comm_free(&m.comm);
    if (failure) std::rethrow_exception(failure);
    if (closed < 0) detail::throw_h5_error("H5Fclose", m.path, "");
}

bool RunFile::is_open() const {
    return impl_ && impl_->file >= 0;
}

const std::string& RunFile::path() const {
    static const std::string moved_from;
    return impl_ ? impl_->path : moved_from;
}

RunFile::Impl& RunFile::checked(const char* what) const {
    if (!impl_ || impl_->file < 0)
        throw core::InternalError(
            std::string("RunFile::") + what + " called on a " +
            (impl_ ? "closed run file '" + impl_->path + "'" : std::string("moved-from RunFile")));
    return *impl_;
}

} // namespace trainscope::io

namespace trainscope::io {} // namespace trainscope::io
