// Bandwidth accounting with nccl-tests' conventions (doc/PERFORMANCE.md there), so trainscope's
// figures compare directly with theirs: algbw = bytes / time; busbw = algbw x a per-collective
// factor that makes the figure comparable with the link's hardware peak whatever the rank count.
#pragma once

#include <string>

#include "trainscope/core/error.hpp"

namespace trainscope::dist {

enum class Collective { AllReduce, AllGather, ReduceScatter, Broadcast };

// "allreduce", "allgather", "reduce_scatter", "broadcast".
inline const char* to_string(Collective c) {
    switch (c) {
    case Collective::AllReduce:
        return "allreduce";
    case Collective::AllGather:
        return "allgather";
    case Collective::ReduceScatter:
        return "reduce_scatter";
    case Collective::Broadcast:
        return "broadcast";
    }
    return "?";
}

// Inverse of to_string; throws core::ConfigError naming `option` and the accepted names.
inline Collective parse_collective(const std::string& name,
                                   const std::string& option = "comm.ops") {
    for (Collective c : {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter,
                         Collective::Broadcast})
        if (name == to_string(c)) return c;
    throw core::ConfigError("option " + option + ": '" + name +
                            "' is not a collective; use allreduce, allgather, reduce_scatter or "
                            "broadcast (comma-separated)");
}

// GB/s with 1 GB = 1e9 bytes. `bytes` is the size of the whole array as nccl-tests count it:
// allreduce and broadcast the buffer, allgather the gathered output, reduce_scatter the input
// (all ranks' blocks). 0 when seconds <= 0.
inline double algbw_GBps(double bytes, double seconds) {
    return seconds > 0 ? bytes / seconds / 1e9 : 0.0;
}

// busbw / algbw: allreduce 2(n-1)/n (a ring sends and receives every byte twice, less the own
// share); allgather and reduce_scatter (n-1)/n; broadcast 1. 0 for allreduce/allgather/
// reduce_scatter at n = 1 (no traffic), as nccl-tests report.
inline double busbw_factor(Collective c, int ranks) {
    const double n = ranks;
    switch (c) {
    case Collective::AllReduce:
        return 2.0 * (n - 1) / n;
    case Collective::AllGather:
    case Collective::ReduceScatter:
        return (n - 1) / n;
    case Collective::Broadcast:
        return 1.0;
    }
    return 0.0;
}

inline double busbw_GBps(Collective c, double bytes, double seconds, int ranks) {
    return algbw_GBps(bytes, seconds) * busbw_factor(c, ranks);
}

} // namespace trainscope::dist
