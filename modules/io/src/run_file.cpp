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
    std::vector<Handle> datasets;             // one per column, [world_size, extent]
    Handle rank_rows;                         // <group>/rank_rows, int64 [world_size]
    Handle handle;                            // the group, open while the file is
    std::vector<std::vector<double>> pending; // per column: this rank's rows not yet written
    hsize_t written = 0;                      // this rank's rows already in the file
    hsize_t extent = 0;                       // n of every dataset (identical on all ranks)
    hsize_t chunk_rows = 1;                   // extents grow in steps of this many rows
    std::int64_t min_rows = 0;                // the fewest rows any rank has (as of the flush)
    std::int64_t max_rows = 0;                // the most rows any rank has (as of the flush)
    bool uneven = false;                      // ranks had different row counts at a flush
};
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
    SchemaCheck check = SchemaCheck::strict;
    // File syncs (H5Fflush: every rank's MPI_File_sync, i.e. an fsync) at most every
    // sync_every_s seconds of rank 0's clock; 0 = at every flush. Status changes always sync.
    double sync_every_s = 0;
    double last_sync = -std::numeric_limits<double>::infinity(); // MPI_Wtime on rank 0; the
                                                                 // first flush always syncs
    FlushStats stats;
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
        // Reached with the file open only when a rank unwinds an exception: HDF5 closes the file
        // at MPI_Finalize/exit, and no call here may wait for peers that are elsewhere.
        if (file >= 0) {
            for (auto& s : series) {
                for (auto& d : s.datasets)
                    d.release();
                s.rank_rows.release();
                s.handle.release();
            }
            for (Handle* h : {&dxpl, &lapl, &gapl, &dapl, &aapl})
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

    // Collective: writes every rank's buffered rows of every series; syncs the file (and then
    // writes the root attribute flushed_utc) when `force_sync` or when sync_every_s has passed.
    // `exact`: every extent is set to the longest rank's rows (status changes and close);
    // otherwise extents grow in steps of the series' chunk rows, so a flush changes metadata only
    // once in chunk_rows rows.
    //
    // Its global collectives (issue 39, counted by tests/mpi/pmpi_counter.cpp): one MPI_Allreduce
    // (every series' longest and shortest rank, rank 0's clock and its decision to sync), one
    // MPI_Gather of the row counts to rank 0 while ranks hold different counts, one MPI_Allreduce
    // agreeing on a write error (core::first_failure), and on a sync H5Fflush's own. Every rank
    // writes its own rows with one independent H5Dwrite per column (no MPI-IO collective, no file
    // view); rank 0 writes the rank_rows datasets. Dataset extents and attributes are metadata:
    // every rank makes the same calls, and makes them only when an extent grows or at a sync.
    // Returns true when the file was synced.
    bool write_pending(bool force_sync, bool exact = false) {
        const double entered = MPI_Wtime();
        const std::size_t groups = series.size();
        std::vector<double> reduced(2 * groups + 3);
        for (std::size_t g = 0; g < groups; ++g) {
            const double rows =
                static_cast<double>(series[g].written + series[g].pending[0].size());
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
        mpi_check(MPI_Allreduce(MPI_IN_PLACE, reduced.data(), static_cast<int>(reduced.size()),
                                MPI_DOUBLE, MPI_MAX, comm),
                  "MPI_Allreduce");
        arrived = MPI_Wtime();
        arrival_wait = arrived - entered;
        const bool sync = reduced[2 * groups + 1] > 0;
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
        std::vector<std::int64_t> all;
        if (gather) {
            std::vector<std::int64_t> mine(groups);
            for (std::size_t g = 0; g < groups; ++g)
                mine[g] =
                    static_cast<std::int64_t>(series[g].written + series[g].pending[0].size());
            if (rank == 0) all.resize(groups * static_cast<std::size_t>(size));
            mpi_check(MPI_Gather(mine.data(), static_cast<int>(groups), MPI_INT64_T, all.data(),
                                 static_cast<int>(groups), MPI_INT64_T, 0, comm),
                      "MPI_Gather");
        }

        // Extents: metadata, the same calls on every rank.
        std::vector<hsize_t> old_extent(groups);
        for (std::size_t g = 0; g < groups; ++g) {
            Series& s = series[g];
            old_extent[g] = s.extent;
            const auto longest = static_cast<hsize_t>(reduced[g]);
            hsize_t extent = s.extent;
            if (exact)
                extent = longest;
            else if (longest > s.extent)
                extent = (longest + s.chunk_rows - 1) / s.chunk_rows * s.chunk_rows;
            if (extent != s.extent) {
                for (std::size_t c = 0; c < s.columns.size(); ++c) {
                    const hsize_t dims[2] = {static_cast<hsize_t>(size), extent};
                    H5_CHECK(H5Dset_extent(s.datasets[c], dims), path,
                             s.group + "/" + s.columns[c].name);
                }
                write_attribute(s.handle, s.group,
                                Attribute{"rows", static_cast<std::int64_t>(extent)});
                s.extent = extent;
            }
        }
        // The writes are independent, so one rank may fail where the others succeed (a full
        // file system, a quota): every rank learns of it here and raises the same error, rather
        // than the others going on into a collective the failed rank never reaches.
        std::string local_error;
        try {
            write_rows(old_extent);
            for (std::size_t g = 0; g < groups; ++g) {
                Series& s = series[g];
                const auto longest = static_cast<std::int64_t>(reduced[g]);
                const auto shortest = static_cast<std::int64_t>(-reduced[groups + g]);
                const bool uneven = longest != shortest;
                const bool counts_changed =
                    longest != s.max_rows || shortest != s.min_rows || uneven || s.uneven;
                if (rank == 0 && counts_changed) {
                    std::vector<std::int64_t> rank_rows(static_cast<std::size_t>(size), longest);
                    if (gather)
                        for (int r = 0; r < size; ++r)
                            rank_rows[static_cast<std::size_t>(r)] =
                                all[static_cast<std::size_t>(r) * groups + g];
                    H5_CHECK(H5Dwrite(s.rank_rows, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                      rank_rows.data()),
                             path, s.group + "/rank_rows");
                }
                s.min_rows = shortest;
                s.max_rows = longest;
                s.uneven = uneven;
            }
        } catch (const core::OutputError& e) {
            local_error = e.what();
        }
        const std::string shared_error = agree_on_error(comm, local_error);
        if (!shared_error.empty()) throw_collective_output_error(shared_error);
        if (sync) {
            write_root_attribute(Attribute{
                "flushed_utc", utc_iso8601(static_cast<std::time_t>(reduced[2 * groups]))});
            // With collective metadata writes each rank writes its share of the metadata, so a
            // full file system may fail the sync on some ranks only: agree here too.
            std::string sync_error;
            try {
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

    // Local: this rank's new rows of every series into its row of each column, and NaN in its
    // slots that a grown extent added beyond them (the datasets have no fill values: the MPI-IO
    // driver would write them with collective writes whenever an extent grows). One independent
    // H5Dwrite per column of a series with something to write.
    void write_rows(const std::vector<hsize_t>& old_extent) {
        const double nan = std::numeric_limits<double>::quiet_NaN();
        for (std::size_t g = 0; g < series.size(); ++g) {
            Series& s = series[g];
            const hsize_t n = s.pending[0].size();
            hsize_t to = std::min(s.written + n, s.extent);
            if (s.extent > old_extent[g]) to = s.extent;
            if (to > s.written) {
                const hsize_t count = to - s.written;
                const hsize_t start[2] = {static_cast<hsize_t>(rank), s.written};
                const hsize_t block[2] = {1, count};
                Handle mspace(H5_CHECK(H5Screate_simple(1, &count, nullptr), path, s.group),
                              H5Sclose);
                std::vector<double> buffer(count, nan);
                for (std::size_t c = 0; c < s.columns.size(); ++c) {
                    const std::string object = s.group + "/" + s.columns[c].name;
                    std::copy(s.pending[c].begin(), s.pending[c].end(), buffer.begin());
                    Handle fspace(H5_CHECK(H5Dget_space(s.datasets[c]), path, object), H5Sclose);
                    H5_CHECK(
                        H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, block, nullptr),
                        path, object);
                    H5_CHECK(H5Dwrite(s.datasets[c], H5T_NATIVE_DOUBLE, mspace, fspace, H5P_DEFAULT,
                                      buffer.data()),
                             path, object);
                }
            }
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
                        const std::vector<Attribute>& root_attrs, SchemaCheck check) {
    detail::silence_hdf5_error_printing();
    auto impl = std::make_unique<Impl>();
    impl->check = check;
    impl->path = path;
    for (const Attribute& a : root_attrs) // before anything is created: the same on every rank
        impl->check_member(schema::Kind::attribute, "/", a.name, "");
    mpi_check(MPI_Comm_dup(comm, &impl->comm), "MPI_Comm_dup");
    MPI_Comm_rank(impl->comm, &impl->rank);
    MPI_Comm_size(impl->comm, &impl->size);

    // Rank 0 decides whether the path is usable; every rank raises the same error.
    std::string verdict = impl->rank == 0 ? check_output_path(path, overwrite) : std::string();
    bcast_string(impl->comm, verdict);
    if (!verdict.empty()) throw_collective_output_error(verdict);

    std::string local_error;
    try {
        Handle fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS), path, "file access list"), H5Pclose);
        H5_CHECK(H5Pset_fapl_mpio(fapl, impl->comm, MPI_INFO_NULL), path, "file access list");
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

void RunFile::declare_series(std::string_view group, const std::vector<Column>& columns,
                             std::size_t chunk_rows) {
    Impl& m = checked("declare_series");
    const std::string name = normalize(group);
    if (name == "/" || columns.empty() || chunk_rows == 0)
        throw core::InternalError(
            "RunFile::declare_series('" + name +
            "'): needs a group name, at least one column and chunk_rows >= 1");
    if (m.series_index.count(name))
        throw core::InternalError("RunFile::declare_series: series '" + name +
                                  "' is already declared in '" + m.path + "'");
    std::string signature = name + ":" + std::to_string(chunk_rows);
    for (std::size_t i = 0; i < columns.size(); ++i) {
        const auto& c = columns[i];
        if (c.name.empty() || c.name.find('/') != std::string::npos)
            throw core::InternalError("RunFile::declare_series('" + name + "'): bad column name '" +
                                      c.name + "'");
        for (std::size_t j = 0; j < i; ++j)
            if (columns[j].name == c.name)
                throw core::InternalError("RunFile::declare_series('" + name +
                                          "'): duplicate column '" + c.name + "'");
        signature += "," + c.name + "[" + c.units + "]";
    }
    m.check_object(name, {schema::Kind::series}, "");
    for (const Column& c : columns)
        m.check_member(schema::Kind::column, name, c.name, c.units);
    // Every rank must create the same datasets: compare a hash of the declaration.
    const std::uint64_t h = std::hash<std::string>{}(signature);
    std::uint64_t mine[2] = {h, ~h}, most[2] = {0, 0};
    mpi_check(MPI_Allreduce(mine, most, 2, MPI_UINT64_T, MPI_MAX, m.comm), "MPI_Allreduce");
    if (most[0] != h || most[1] != ~h)
        throw core::InternalError("RunFile::declare_series('" + name +
                                  "'): ranks declared different columns");

    Handle grp = m.ensure_group(name);
    // Chunks span every rank and chunk_rows rows (RunFile::declare_series in the header), so all
    // ranks' independent writes of a flush land in the same chunks and look up the same index
    // nodes (collective metadata reads need identical cache misses on every rank). The MPI-IO
    // driver allocates every chunk of an extent when the extent grows, so chunks stay small for
    // short runs; there are no fill values (the allocation would write them with
    // collective writes): each rank writes NaN into its slots that a grown extent adds
    // (write_rows).
    Handle dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE), m.path, name), H5Pclose);
    const hsize_t chunk[2] = {static_cast<hsize_t>(m.size), static_cast<hsize_t>(chunk_rows)};
    H5_CHECK(H5Pset_chunk(dcpl, 2, chunk), m.path, name);
    H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER), m.path, name);
    const hsize_t dims[2] = {static_cast<hsize_t>(m.size), 0};
    const hsize_t max_dims[2] = {static_cast<hsize_t>(m.size), H5S_UNLIMITED};
    Handle space(H5_CHECK(H5Screate_simple(2, dims, max_dims), m.path, name), H5Sclose);

    Series s;
    s.group = name;
    s.columns = columns;
    s.pending.resize(columns.size());
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
    // Rows per rank: a dataset (an attribute of world_size elements outgrows HDF5's 64 KiB
    // object-header message limit at 8,184 ranks), zeros until rank 0 rewrites it at a flush.
    const std::string rank_rows = name + "/rank_rows";
    const hsize_t ranks = static_cast<hsize_t>(m.size);
    Handle rr_space(H5_CHECK(H5Screate_simple(1, &ranks, nullptr), m.path, rank_rows), H5Sclose);
    Handle rr_dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE), m.path, rank_rows), H5Pclose);
    const std::int64_t zero = 0;
    H5_CHECK(H5Pset_fill_value(rr_dcpl, H5T_NATIVE_INT64, &zero), m.path, rank_rows);
    s.rank_rows = Handle(H5_CHECK(H5Dcreate2(m.file, rank_rows.c_str(), H5T_STD_I64LE, rr_space,
                                             H5P_DEFAULT, rr_dcpl, m.dapl),
                                  m.path, rank_rows),
                         H5Dclose);
    m.write_units(s.rank_rows, rank_rows, "1");
    m.write_attribute(grp, name, Attribute{"columns", column_list});
    m.write_attribute(grp, name, Attribute{"rows", std::int64_t{0}});
    m.series_index[name] = m.series.size();
    m.series.push_back(std::move(s));
}

void RunFile::append(std::string_view group, const std::vector<double>& row) {
    Series& s = checked("append").find_series(group, "append");
    if (row.size() != s.columns.size())
        throw core::InternalError("RunFile::append('" + s.group + "'): row has " +
                                  std::to_string(row.size()) + " values, the series has " +
                                  std::to_string(s.columns.size()) + " columns");
    for (std::size_t c = 0; c < row.size(); ++c)
        s.pending[c].push_back(row[c]);
}

std::size_t RunFile::rows(std::string_view group) const {
    const Series& s = checked("rows").find_series(group, "rows");
    return static_cast<std::size_t>(s.written + s.pending[0].size());
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
    m.series.clear();
    m.series_index.clear();
    for (Handle* h : {&m.dxpl, &m.lapl, &m.gapl, &m.dapl, &m.aapl})
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
