// Options of the io module (section "output"): where the run file goes, whether an existing file
// may be replaced, and how often buffered rows are written collectively.
#pragma once

#include "trainscope/core/config.hpp"

#include <string>
#include <utility>
#include <vector>

namespace trainscope::io {

// output.file (string), output.overwrite (bool), output.flush_every (int >= 1, iterations),
// output.sync_every_s (float >= 0, seconds between file syncs at flushes; 0 = every flush),
// output.per_rank (which ranks write per-rank series rows; PerRank), output.mpi_hints and
// output.alignment_bytes (RunFile's AccessHints).
void declare_options(core::OptionRegistry& registry);

// output.per_rank=auto keeps every rank's rows up to this many ranks (the jobs one or a few nodes
// run, as before issue 39), and about this many beyond.
inline constexpr int kPerRankAutoRanks = 32;

// Which ranks write per-rank series rows (RunFile::select_per_rank).
struct PerRank {
    enum class Kind { all, none, node, every };
    Kind kind = Kind::all;
    int every = 1; // Kind::every: ranks 0, every, 2 every, ...
    bool writes(int rank, int local_rank) const;
    std::string str() const; // "all", "every:512", ... (the root attribute per_rank)
};
// output.per_rank's value for a job of world_size ranks (auto resolved); ConfigError naming the
// option, the value and what is allowed.
PerRank parse_per_rank(const std::string& value, int world_size);

// output.mpi_hints ("k=v,k=v") as pairs; ConfigError naming the option and the malformed item.
std::vector<std::pair<std::string, std::string>> parse_mpi_hints(const std::string& value);

} // namespace trainscope::io
