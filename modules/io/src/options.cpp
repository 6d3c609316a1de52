// Declares the "output" options read by the app when it creates the run file.
#include "trainscope/io/options.hpp"

#include "trainscope/core/error.hpp"

#include <algorithm>
#include <exception>

namespace trainscope::io {

void declare_options(core::OptionRegistry& registry) {
    registry.add_string("output.file", "trainscope_run.h5",
                        "path of the parallel HDF5 run file (schema trainscope/1)");
    registry.add_bool("output.overwrite", false,
                      "replace output.file if it exists (otherwise the run refuses to start)");
    registry.add_int("output.flush_every", 50,
                     "iterations between collective flushes of buffered rows to the run file", 1);
    registry.add_float("output.sync_every_s", 60.0,
                       "seconds between syncs of the run file to disk (H5Fflush: an fsync on every "
                       "rank) at flushes; 0 = at every flush. A killed job's file holds the rows "
                       "of its last sync; status changes always sync",
                       0.0);
    registry.add_string(
        "output.per_rank", "auto",
        "which ranks write per-rank series rows (/iterations, /epochs, /comm/buckets, "
        "/telemetry); every rank always enters the per-row aggregates (min, mean, max, argmax, "
        "slowest). all | none | node (local rank 0 of each node) | every:K (ranks 0, K, 2K, ...) "
        "| auto (all up to 32 ranks, else every:ceil(N/32))");
    registry.add_string("output.mpi_hints", "",
                        "MPI-IO hints for the run file, key=value pairs separated by commas, e.g. "
                        "striping_factor=8,striping_unit=4194304,romio_cb_write=disable (Lustre "
                        "with ROMIO); empty = the MPI library's defaults");
    registry.add_int("output.alignment_bytes", 0,
                     "align HDF5 objects of at least this many bytes on multiples of it (e.g. "
                     "the file system's stripe size); 0 = HDF5's default",
                     0.0);
}

std::vector<std::pair<std::string, std::string>> parse_mpi_hints(const std::string& value) {
    std::vector<std::pair<std::string, std::string>> hints;
    std::size_t start = 0;
    while (start < value.size()) {
        const std::size_t end = std::min(value.find(',', start), value.size());
        const std::string item = value.substr(start, end - start);
        const std::size_t eq = item.find('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == item.size() ||
            item.find_first_of(" \t") != std::string::npos)
            throw core::ConfigError("output.mpi_hints=" + value + ": '" + item +
                                    "' is not key=value (pairs separated by commas, no spaces, "
                                    "e.g. striping_factor=8,cb_nodes=4)");
        hints.emplace_back(item.substr(0, eq), item.substr(eq + 1));
        start = end + 1;
    }
    return hints;
}

PerRank parse_per_rank(const std::string& value, int world_size) {
    const std::string key = "output.per_rank";
    PerRank p;
    if (value == "auto") {
        if (world_size <= kPerRankAutoRanks) {
            p.kind = PerRank::Kind::all;
        } else {
            p.kind = PerRank::Kind::every;
            p.every = (world_size + kPerRankAutoRanks - 1) / kPerRankAutoRanks;
        }
    } else if (value == "all") {
        p.kind = PerRank::Kind::all;
    } else if (value == "none") {
        p.kind = PerRank::Kind::none;
    } else if (value == "node") {
        p.kind = PerRank::Kind::node;
    } else if (value.rfind("every:", 0) == 0) {
        const std::string k = value.substr(6);
        std::size_t used = 0;
        long long every = 0;
        try {
            every = std::stoll(k, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (k.empty() || used != k.size() || every < 1)
            throw core::ConfigError(key + "=" + value +
                                    ": K in every:K must be a whole number >= 1, e.g. every:64");
        p.kind = PerRank::Kind::every;
        p.every = static_cast<int>(std::min<long long>(every, 1LL << 30));
    } else {
        throw core::ConfigError(key + "=" + value +
                                ": expected all, none, node, every:K (K >= 1) or auto");
    }
    return p;
}

bool PerRank::writes(int rank, int local_rank) const {
    switch (kind) {
    case Kind::all:
        return true;
    case Kind::none:
        return false;
    case Kind::node:
        return local_rank == 0;
    case Kind::every:
        return rank % every == 0;
    }
    return true;
}

std::string PerRank::str() const {
    switch (kind) {
    case Kind::all:
        return "all";
    case Kind::none:
        return "none";
    case Kind::node:
        return "node";
    case Kind::every:
        return "every:" + std::to_string(every);
    }
    return "all";
}

} // namespace trainscope::io
