// The one per-iteration communication record of data parallelism: what DDP's bucketed
// synchronizer, ZeRO and FSDP report for an iteration, and what the trainers turn into the
// /iterations comm_* columns. Bytes are known at once; the collectives' durations are resolved
// late (on NCCL reading them blocks until the collectives finished on the device).
#pragma once

#include <functional>
#include <limits>
#include <vector>

namespace trainscope::dist {

// One iteration's communication, as this rank saw it. NaN: not known yet (durations before
// resolution) or not a quantity of this kind (all-gathers under DDP, buckets under ZeRO).
// Bus bandwidth = bytes / collective time x 2(n-1)/n (distributed/bandwidth.hpp).
struct ParallelComm {
    static constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
    double bytes = 0; // sent (compressed, under dist.compress); 0 at world size 1
    // What the same collectives would send without compression (= bytes under none).
    double uncompressed_bytes = 0;
    // dist.compress=powersgd: L2 norm of this rank's error feedback (0 before start_iter); NaN
    // otherwise. Read when resolved (it is on the device).
    double error_norm = kNaN;
    double collective_s =
        kNaN; // time inside the collectives, where they ran (DDP: sum of bucket_s)
    // DDP: what finish() waited for the buckets (communication backward did not hide).
    double exposed_s = kNaN;
    std::vector<double> bucket_bytes; // DDP: per bucket payload, launch order (0 where none ran)
    std::vector<double> bucket_s;     // DDP: per bucket allreduce's own duration (Work::seconds)
    double allgather_bytes = kNaN, allgather_s = kNaN, allgather_exposed_s = kNaN;
    double reduce_scatter_bytes = kNaN, reduce_scatter_s = kNaN, reduce_scatter_exposed_s = kNaN;
};

// `known` at once (bytes; durations NaN); resolve() reads the collectives' durations, which
// blocks until they finished on the device (NCCL): call it late. Holding it keeps the handles
// (on NCCL their CUDA events) alive. Null resolve: nothing to wait for (known is final).
struct PendingParallelComm {
    ParallelComm known;
    std::function<ParallelComm()> resolve;
    ParallelComm resolved() const { return resolve ? resolve() : known; }
};

} // namespace trainscope::dist
