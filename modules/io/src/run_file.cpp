// RunFile implementation: one HDF5 file opened by all ranks through the MPI-IO driver with
// collective metadata reads and writes (HDF5 1.10.5-1.10.8 need per-call access lists for the
// reads, bug HDFFV-11260). Values that must
// identical on every rank (attributes, strings) are broadcast from rank 0 before they reach HDF5;
// every rank writes its own series rows with independent I/O (write_rows); tables written once
// (/ranks, ragged, per-rank) use collective writes.
#include "trainscope/io/run_file.hpp"

#include "run_file_impl.hpp"

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

namespace fs = std::filesystem;

// ------------------------------------------------------------------------------------------------

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
        // HDF5's metadata cache runs a sync point (a barrier, a broadcast of the entries to
        // write, collective writes) whenever 256 KiB of metadata has been dirtied since the last
        // one. Growing the extents of a run's ~170 datasets dirties ~0.3-0.5 MiB (their headers
        // and chunk indexes), so with that default an extent growth after a sync cost a flush 4
        // more collectives. With 4 MiB, metadata reaches the file at the timed syncs
        // (output.sync_every_s) and status changes, like the rows: every rank holds at most that
        // much dirty metadata (docs/scaling.md's memory model counts it).
        H5AC_cache_config_t cache{};
        cache.version = H5AC__CURR_CACHE_CONFIG_VERSION;
        H5_CHECK(H5Pget_mdc_config(fapl, &cache), path, "file access list");
        cache.dirty_bytes_threshold = kDirtyMetadataBytes;
        H5_CHECK(H5Pset_mdc_config(fapl, &cache), path, "file access list");
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
    // No raw-data chunk cache: rows and aggregates bypass HDF5 (write_raw), and HDF5's default
    // cache (1 MiB per open dataset) kept a chunk of every dataset whose extent the status change
    // shrank: 39 MB at 2 ranks x 20,000 iterations, 80 MiB with R = 32 and 1 MiB chunks (measured
    // by tests/mpi/test_recorder_memory.cpp). Without it HDF5 reads one chunk at a time.
    H5_CHECK(H5Pset_chunk_cache(impl->dapl, 0, 0, H5D_CHUNK_CACHE_W0_DEFAULT), path,
             "dataset access list");

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
    m.write_attribute(s.handle, name, Attribute{"rows", static_cast<std::int64_t>(s.extent)});
    s.rows_attribute = s.extent;
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
    const bool synced = m.write_pending(/*force_sync=*/false);
    m.stats.record(MPI_Wtime() - m.arrived, m.arrival_wait, synced);
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
    m.stats.record(MPI_Wtime() - m.arrived + (before - start), m.arrival_wait, /*synced=*/true);
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
