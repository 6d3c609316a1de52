// RunFile: the one parallel HDF5 file a job writes (schema trainscope/1, docs/run_file_schema.md).
// Every rank opens it through the MPI-IO driver; metadata operations and writes are collective, so
// each method below says whether all ranks must call it. io knows nothing about training.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace trainscope::io {

inline constexpr const char* kSchema = "trainscope/1";

using AttrValue = std::variant<std::int64_t, double, std::string>;

struct Attribute {
    std::string name;
    AttrValue value;
};

// One column of a per-rank series, e.g. {"forward_s", "s"}, {"loss", "1"}, {"samples", "samples"}.
struct Column {
    std::string name;
    std::string units;
};

// How the file is opened on a parallel file system (output.mpi_hints, output.alignment_bytes):
// MPI-IO hints handed to the MPI-IO driver (e.g. striping_factor, striping_unit, cb_nodes,
// romio_cb_write on Lustre with ROMIO) and HDF5's object alignment (H5Pset_alignment: objects of
// at least `alignment_bytes` start on a multiple of it, e.g. the stripe size; 0 = HDF5's default).
struct AccessHints {
    std::vector<std::pair<std::string, std::string>> mpi_hints;
    std::int64_t alignment_bytes = 0;
};

// Whether a RunFile holds the application's run file, whose every group, dataset, column and
// attribute must be declared in the schema table (schema.hpp) with the same units, or any layout
// (io's own tests of the HDF5 mechanics). A write the table does not declare throws InternalError
// on every rank (the arguments of collective calls agree across ranks) before touching the file.
enum class SchemaCheck { strict, off };

// What a RunFile's flushes (and status changes) cost this rank: the tool's own overhead, written
// to /summary (flush_*) and /iterations (flush_s). A flush's time is split at the end of its first
// collective (the MPI_Allreduce every rank enters): before it, this rank waited for the others to
// arrive (skew from the work before the flush, which lock-step training would otherwise absorb in
// its next collective); after it, the flush's own work (the reduction's result, metadata, this
// rank's writes, a sync).
struct FlushStats {
    std::int64_t flushes = 0;      // flush() and set_status() calls
    std::int64_t syncs = 0;        // of them, those that synced the file
    std::int64_t rows_written = 0; // this rank's series rows written
    double total_s = 0;            // the flushes' own work (after the arrival wait)
    double max_s = 0;
    double last_s = 0;
    double wait_total_s = 0; // waiting for the other ranks to arrive
    double last_wait_s = 0;
    double sync_total_s = 0; // of total_s, the flushes that synced the file
    void record(double work_seconds, double wait_seconds, bool synced) {
        ++flushes;
        total_s += work_seconds;
        if (synced) sync_total_s += work_seconds;
        max_s = work_seconds > max_s ? work_seconds : max_s;
        last_s = work_seconds;
        wait_total_s += wait_seconds;
        last_wait_s = wait_seconds;
    }
};

// One row of an aggregate dataset (/<group>/aggregate/<column>): the column's values in one row of
// the series over every rank that has a finite value there (count); NaN and argmax -1 when none.
struct AggregateRow {
    double min;
    double mean;
    double max;
    std::int64_t argmax; // the rank holding max (the lowest such rank on a tie)
    std::int64_t count;  // ranks with a finite value
    double slowest;      // the value on the rank with the largest aggregate_by value in this row
};

class RunFile {
  public:
    // One row of /ranks, filled by each rank about itself.
    struct RankRow {
        int rank = 0;
        int local_rank = 0;
        int node = 0;
        std::string hostname;
        long pid = 0;
        std::string device;       // "cpu", "cuda:0", ...
        std::string device_name;  // e.g. "NVIDIA H100 80GB HBM3"
        std::string pci_bus_id;   // "" on CPU
        std::string cpu_affinity; // e.g. "0-15"
    };

    // Collective over comm. Rank 0 checks the path (directory exists and is writable, the file does
    // not exist unless overwrite) and broadcasts its verdict, so a refusal is the same OutputError
    // (marked collective) on every rank. Writes root attributes schema, status="running",
    // created_utc, world_size, then root_attrs (rank 0's values; they may override world_size).
    static RunFile create(MPI_Comm comm, const std::string& path, bool overwrite,
                          const std::vector<Attribute>& root_attrs = {},
                          SchemaCheck check = SchemaCheck::strict, const AccessHints& hints = {});

    RunFile(RunFile&&) noexcept;
    RunFile& operator=(RunFile&&) noexcept;
    RunFile(const RunFile&) = delete;
    RunFile& operator=(const RunFile&) = delete;
    // Closes collectively (flushing buffered rows) unless an exception is propagating: a rank that
    // unwinds alone must not enter a collective call its peers never reach. Never throws.
    ~RunFile();

    // Collective. Writes attributes on group_path ("/" for the root), creating the group and its
    // parents if needed and replacing attributes of the same name. Rank 0's values are used.
    void set_attributes(std::string_view group_path, const std::vector<Attribute>& attrs);

    // Collective. Scalar fixed-length UTF-8 string dataset (units "text") holding rank 0's text,
    // e.g. /config/ini. Replaces an existing dataset of that path.
    void write_string_dataset(std::string_view path, const std::string& text);

    // Collective. /ranks: compound table [world_size], row r written by rank r.
    void write_ranks(const RankRow& mine);

    // Collective, before the first declare_series (default: every rank): whether this rank
    // writes per-rank rows into the series (output.per_rank). The R ranks that do are the series'
    // rows, in rank order; the others only contribute to the aggregates. Three collectives
    // (MPI_Exscan, MPI_Allreduce, MPI_Gather to rank 0), once.
    void select_per_rank(bool mine);
    // Local. R, the ranks writing per-rank rows (world_size unless select_per_rank chose fewer).
    int per_rank_count() const;

    // Collective, once per group. Each column becomes dataset /<group>/<column> of shape [R, n]
    // (float64, chunked [R, chunk_rows], extendable along n, NaN where a rank has no row,
    // attribute units): row j holds rank /<group>/ranks[j] (int64 [R]), and /<group>/rank_rows
    // (int64 [R]) the rows each of them has written. The MPI-IO driver allocates every chunk of
    // the extent at once, so chunk_rows should be about the rows a run writes (series_chunk_rows:
    // at most 1 MiB a chunk). Every rank must declare the same columns in the same order.
    //
    // aggregate_by (a column name, or empty): the series also gets, over ALL ranks, one compound
    // dataset /<group>/aggregate/<column> [n] per column (AggregateRow: min, mean, max, argmax,
    // count, slowest), reduced to rank 0 at each flush (row i once every rank has row i, the
    // rest at a status change); `slowest` is the column's value on the rank with the largest
    // aggregate_by value in that row.
    void declare_series(std::string_view group, const std::vector<Column>& columns,
                        std::size_t chunk_rows = 64, const std::string& aggregate_by = "");

    // Local. Buffers one row (values in column order) until the next flush().
    void append(std::string_view group, const std::vector<double>& row);
    // Local. Rows of `group` appended by this rank so far (written or not).
    std::size_t rows(std::string_view group) const;
    // Local. Columns `group` was declared with.
    std::size_t columns(std::string_view group) const;
    // Local. The communicator the file was created on: the ranks that must agree on every
    // collective call (e.g. on a series' columns).
    MPI_Comm comm() const;

    // Collective. Writes every rank's buffered rows (each rank its own, independent I/O); extents
    // grow in steps of the series' chunk rows (the slots beyond a rank's rows are NaN;
    // /<group>/rank_rows says how many rows each rank wrote) and become exact at set_status and
    // close. The file is synced (H5Fflush, an fsync on every rank; root attribute flushed_utc)
    // when set_sync_interval's seconds have passed since the last sync (0: every flush), so a
    // killed job leaves a readable file with the rows of its last sync. Only the R ranks of
    // select_per_rank write rows; rank 0 writes the aggregates. Global collectives: one
    // MPI_Allreduce (extents, the sync decision, a write error of the previous flush: every rank
    // then raises the same OutputError), one MPI_Ireduce to rank 0 of the aggregates and, while
    // ranks hold different row counts, of those counts (none when there is neither), completed
    // at the next flush (rank 0 writes a flush's aggregates then) or at once at a sync or status
    // change;
    // a sync adds
    // an agreement on write errors and HDF5's own (issue 39; tests/mpi/pmpi_counter.cpp).
    void flush();

    // Collective. status is running|completed|failed|interrupted; flushes and always syncs; a
    // final status also writes finished_utc.
    void set_status(const std::string& status);

    // Local (every rank the same value): seconds between file syncs at flushes
    // (output.sync_every_s; 0 = sync at every flush, the default of a new RunFile).
    void set_sync_interval(double seconds);
    // Local. What the flushes and status changes of this file cost this rank so far.
    const FlushStats& flush_stats() const;

    // Collective. Variable-length per-rank data: one global 1-D float64 dataset `path` holding
    // every rank's values in rank order, plus `<path>_offset` / `<path>_count` int64 [world_size].
    void write_ragged(std::string_view path, const std::vector<double>& mine,
                      const std::string& units);
    // Collective. The same layout for text (e.g. operator names): `path` is a 1-D fixed-length
    // UTF-8 string dataset (NUL-padded to the longest string on any rank, units "text").
    void write_ragged_strings(std::string_view path, const std::vector<std::string>& mine);
    // Collective. One value per rank: float64 dataset `path` of shape [world_size], element r
    // written by rank r, attribute units.
    void write_per_rank(std::string_view path, double mine, const std::string& units);

    // Collective. A plain 1-D float64 dataset `path` [values.size()] holding rank 0's values
    // (e.g. the /comm benchmark tables), attribute units. Replaces an existing dataset.
    void write_vector(std::string_view path, const std::vector<double>& values,
                      const std::string& units);

    // Collective and idempotent: flushes buffered rows and closes the file.
    void close();
    bool is_open() const;
    const std::string& path() const;

  private:
    struct Impl;
    explicit RunFile(std::unique_ptr<Impl> impl);
    Impl& checked(const char* what) const; // throws InternalError when closed or moved from
    std::unique_ptr<Impl> impl_;
};

// Chunk rows for a series expected to hold about `rows` rows on `world_size` ranks: the rows
// rounded up to a power of two from 8, at most 1 MiB / (8 x world_size) (and at least 1), so a
// short run allocates little and a long or wide one gets chunks of 1 MiB.
std::size_t series_chunk_rows(std::int64_t rows, int world_size);

// Local, one process: opens a closed run file (no job writes it any more) serially and sets root
// attributes, e.g. continued_in on the file of a run that --resume continued in a new file.
void annotate_closed_run_file(const std::string& path, const std::vector<Attribute>& attrs);

// "2025-01-31T12:34:56Z": the format of created_utc, flushed_utc and finished_utc.
std::string utc_now_iso8601();
// The same format for a given time (seconds since the epoch).
std::string utc_iso8601(std::time_t when);

} // namespace trainscope::io
