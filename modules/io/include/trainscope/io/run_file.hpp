// RunFile: the one parallel HDF5 file a job writes (schema trainscope/1, docs/run_file_schema.md).
// Every rank opens it through the MPI-IO driver; metadata operations and writes are collective, so
// each method below says whether all ranks must call it. io knows nothing about training.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
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

// Whether a RunFile holds the application's run file, whose every group, dataset, column and
// attribute must be declared in the schema table (schema.hpp) with the same units, or any layout
// (io's own tests of the HDF5 mechanics). A write the table does not declare throws InternalError
// on every rank (the arguments of collective calls agree across ranks) before touching the file.
enum class SchemaCheck { strict, off };

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
                          SchemaCheck check = SchemaCheck::strict);

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

    // Collective, once per group. Each column becomes dataset /<group>/<column> of shape
    // [world_size, n] (float64, chunked [1, chunk_rows], extendable along n, fill NaN, attribute
    // units). Every rank must declare the same columns in the same order.
    void declare_series(std::string_view group, const std::vector<Column>& columns,
                        std::size_t chunk_rows = 1024);

    // Local. Buffers one row (values in column order) until the next flush().
    void append(std::string_view group, const std::vector<double>& row);
    // Local. Rows of `group` appended by this rank so far (flushed + buffered).
    std::size_t rows(std::string_view group) const;
    // Local. Columns `group` was declared with.
    std::size_t columns(std::string_view group) const;
    // Local. The communicator the file was created on: the ranks that must agree on every
    // collective call (e.g. on a series' columns).
    MPI_Comm comm() const;

    // Collective. Writes every rank's buffered rows: the extent of each series becomes the longest
    // rank's row count (shorter rows stay NaN), root attribute flushed_utc and the group attributes
    // rows / rank_rows are updated, then the file is flushed so a killed job leaves a readable
    // file.
    void flush();

    // Collective. status is running|completed|failed|interrupted; flushes; a final status also
    // writes finished_utc.
    void set_status(const std::string& status);

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

// Local, one process: opens a closed run file (no job writes it any more) serially and sets root
// attributes, e.g. continued_in on the file of a run that --resume continued in a new file.
void annotate_closed_run_file(const std::string& path, const std::vector<Attribute>& attrs);

// "2025-01-31T12:34:56Z": the format of created_utc, flushed_utc and finished_utc.
std::string utc_now_iso8601();

} // namespace trainscope::io
