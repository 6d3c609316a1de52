// RunFile's flush (run_file_impl.hpp): the agreement and extent growth of write_pending, the
// aggregates' MPI_Ireduce (posted at one flush, completed at a later one), and the rows and
// aggregates written with pwrite at chunk addresses every rank looked up together.
#include "run_file_impl.hpp"

#include "trainscope/core/error.hpp"
#include "trainscope/core/log.hpp"
#include "trainscope/core/mpi_util.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <numeric>

namespace trainscope::io {

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

bool RunFile::Impl::write_pending(bool force_sync, bool exact) {
    const double entered = MPI_Wtime();
    ++flush_serial;
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
    // Earlier flushes' reductions that have completed meanwhile (while training went on) are
    // collected without waiting (MPI_Test), the oldest waited for only beyond kMaxInFlight;
    // this flush's is posted; a status change or a sync completes every one at once (what a
    // sync makes durable is every row up to it: a killed run's file holds them). So an
    // ordinary flush never waits for another rank after its MPI_Allreduce.
    std::vector<Reduced> done = complete_reductions(/*all=*/false);
    post_reduce(aggregate_to, gather);
    if (exact || sync)
        for (Reduced& r : complete_reductions(/*all=*/true))
            done.push_back(std::move(r));

    // Extents: metadata, the same calls on every rank. An extent grows before the writes;
    // one that shrinks (to the exact rows at a status change) shrinks after them: HDF5 then
    // rewrites the partial last chunk from the file, rows included, where a shrink before
    // the writes had it rewrite that chunk over them later.
    std::vector<hsize_t> extent(groups), agg_extent(groups);
    for (std::size_t g = 0; g < groups; ++g) {
        Series& s = series[g];
        extent[g] = grown_extent(s.extent, static_cast<hsize_t>(reduced[g]), s.chunk_rows, exact);
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
        write_rows(/*all=*/exact || sync);
        for (Series& s : series)
            if (rank == 0 && s.aggregating() && s.agg_padded < s.agg_extent) {
                write_empty_aggregates(s, s.agg_padded, s.agg_extent);
                s.agg_padded = s.agg_extent;
            }
        for (const Reduced& r : done)
            write_reduced(r);
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
                s.rank_rows_flush = flush_serial; // older counts still in flight are stale
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
        write_root_attribute(
            Attribute{"flushed_utc", utc_iso8601(static_cast<std::time_t>(reduced[2 * groups]))});
        // `rows` (the extent) changes with the metadata that a sync makes durable: an attribute
        // written at each growth would be one more object-header update between syncs.
        for (Series& s : series)
            if (s.rows_attribute != s.extent) {
                write_attribute(s.handle, s.group,
                                Attribute{"rows", static_cast<std::int64_t>(s.extent)});
                s.rows_attribute = s.extent;
            }
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

void RunFile::Impl::set_extents(const std::vector<hsize_t>& extent,
                                const std::vector<hsize_t>& agg_extent, bool grow) {
    for (std::size_t g = 0; g < series.size(); ++g) {
        Series& s = series[g];
        if (extent[g] != s.extent && (extent[g] > s.extent) == grow) resize_rows(s, extent[g]);
        if (s.aggregating() && agg_extent[g] != s.agg_extent &&
            (agg_extent[g] > s.agg_extent) == grow)
            resize_aggregates(s, agg_extent[g]);
    }
}

void RunFile::Impl::resize_rows(Series& s, hsize_t extent) {
    for (std::size_t c = 0; c < s.columns.size(); ++c) {
        const std::string object = s.group + "/" + s.columns[c].name;
        const hsize_t dims[2] = {per_rank_count, extent};
        H5_CHECK(H5Dset_extent(s.datasets[c], dims), path, object);
        if (per_rank_count > 0)
            refresh_chunks(s.datasets[c], 2, extent, s.chunk_rows, s.chunk_addr[c], object);
    }
    s.extent = extent; // the group's `rows` follows at the next sync (write_pending)
}

void RunFile::Impl::resize_aggregates(Series& s, hsize_t extent) {
    for (std::size_t c = 0; c < s.columns.size(); ++c) {
        const std::string object = s.group + "/aggregate/" + s.columns[c].name;
        H5_CHECK(H5Dset_extent(s.aggregates[c], &extent), path, object);
        refresh_chunks(s.aggregates[c], 1, extent, s.chunk_rows, s.agg_chunk_addr[c], object);
    }
    s.agg_extent = extent;
}

hsize_t RunFile::Impl::written_rows(std::size_t g) const {
    return inflight.empty() ? series[g].aggregated : inflight.front().from[g];
}

hsize_t RunFile::Impl::grown_extent(hsize_t extent, hsize_t rows, hsize_t chunk_rows, bool exact) {
    if (exact) return rows;
    if (rows > extent) return (rows + chunk_rows - 1) / chunk_rows * chunk_rows;
    return extent;
}

void RunFile::Impl::post_reduce(const std::vector<hsize_t>& to, bool counts) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const std::size_t groups = series.size();
    const std::size_t count_slots = counts ? static_cast<std::size_t>(per_rank_count) * groups : 0;
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
    InFlight& f = inflight.emplace_back();
    f.header = 2 + 2 * groups;
    f.count_slots = count_slots;
    f.send.assign(f.header + payload, 0.0);
    f.flush = flush_serial;
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
            f.send[f.header + per_rank_row * groups + g] = static_cast<double>(series[g].appended);
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
    mpi_check(MPI_Ireduce(f.send.data(), rank == 0 ? f.result.data() : nullptr, 1, f.element, op, 0,
                          comm, &f.request),
              "MPI_Ireduce");
}

std::vector<RunFile::Impl::Reduced> RunFile::Impl::complete_reductions(bool all) {
    std::vector<Reduced> out;
    while (!inflight.empty()) {
        InFlight& f = inflight.front();
        int rc = MPI_SUCCESS;
        if (all || inflight.size() >= kMaxInFlight) {
            rc = MPI_Wait(&f.request, MPI_STATUS_IGNORE);
        } else {
            int complete = 0;
            rc = MPI_Test(&f.request, &complete, MPI_STATUS_IGNORE);
            if (rc == MPI_SUCCESS && !complete) break; // the later ones are no further along
        }
        MPI_Type_free(&f.element);
        mpi_check(rc, "completing the aggregates' MPI_Ireduce");
        out.push_back(reduced_rows(f));
        inflight.pop_front();
    }
    return out;
}

RunFile::Impl::Reduced RunFile::Impl::reduced_rows(const InFlight& f) const {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    Reduced out;
    out.from = f.from;
    out.to = f.to;
    out.rows.resize(series.size());
    out.has_counts = f.count_slots > 0;
    out.flush = f.flush;
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
    return out;
}

void RunFile::Impl::write_reduced(const Reduced& red) {
    if (rank != 0 || red.from.empty()) return;
    for (std::size_t g = 0; g < series.size(); ++g) {
        Series& s = series[g];
        if (s.aggregating() && red.to[g] > red.from[g]) {
            write_aggregates(s, red.rows[g], red.from[g], red.to[g]);
        }
        if (red.has_counts && per_rank_count > 0 && red.flush > s.rank_rows_flush) {
            s.rank_rows_flush = red.flush;
            std::vector<std::int64_t> rank_rows(per_rank_count);
            for (hsize_t j = 0; j < per_rank_count; ++j)
                rank_rows[j] = static_cast<std::int64_t>(red.counts[j * series.size() + g]);
            pwrite_all(reinterpret_cast<const char*>(rank_rows.data()),
                       rank_rows.size() * sizeof(std::int64_t), s.rank_rows_addr,
                       s.group + "/rank_rows");
        }
    }
}

void RunFile::Impl::write_aggregates(Series& s, const std::vector<AggregateRow>& rows, hsize_t from,
                                     hsize_t to) {
    const hsize_t count = to - from;
    for (std::size_t c = 0; c < s.columns.size(); ++c)
        write_raw(s.agg_chunk_addr[c], s.chunk_rows, 0, from, count,
                  rows.data() + static_cast<std::ptrdiff_t>(c * count), sizeof(AggregateRow),
                  s.group + "/aggregate/" + s.columns[c].name);
}

void RunFile::Impl::write_empty_aggregates(Series& s, hsize_t from, hsize_t to) {
    if (to <= from) return;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const std::vector<AggregateRow> empty(to - from, AggregateRow{nan, nan, nan, -1, 0, nan});
    for (std::size_t c = 0; c < s.columns.size(); ++c)
        write_raw(s.agg_chunk_addr[c], s.chunk_rows, 0, from, to - from, empty.data(),
                  sizeof(AggregateRow), s.group + "/aggregate/" + s.columns[c].name);
}

void RunFile::Impl::refresh_chunks(hid_t ds, int ndims, hsize_t extent, hsize_t chunk_rows,
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

void RunFile::Impl::write_raw(const std::vector<haddr_t>& addr, hsize_t chunk_rows, hsize_t row,
                              hsize_t start, hsize_t count, const void* data, std::size_t element,
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

void RunFile::Impl::pwrite_all(const char* p, std::size_t size, haddr_t at,
                               const std::string& object) {
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

hid_t RunFile::Impl::aggregate_memory_type() {
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

void RunFile::Impl::write_rows(bool all) {
    if (!per_rank) return;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (std::size_t g = 0; g < series.size(); ++g) {
        Series& s = series[g];
        const hsize_t n = s.pending[0].size();
        if (!all && n < kRowBatch) continue; // kept for a larger write, or the next sync
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

} // namespace trainscope::io
