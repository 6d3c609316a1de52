// A trainer's data-parallel communication into its /iterations columns, the same for both
// workloads: the bytes when the iteration is accounted, the collectives' durations when the
// TrainingLoop resolves it (on NCCL reading them waits for the device, so that comes late).
#pragma once

#include <cstdint>
#include <map>
#include <optional>

#include "trainscope/distributed/parallel_comm.hpp"
#include "trainscope/distributed/parallelism.hpp"
#include "trainscope/train/recorder.hpp"

namespace trainscope::train {

// comm_bytes, comm_uncompressed_bytes, comm_collective_s, comm_error_norm and the per-bucket
// durations (/comm/buckets) of `c` into v; NaN what is not known yet.
void put_comm(const dist::ParallelComm& c, IterationValues& v);

class DeferredComm {
  public:
    // The iteration's communication (after the step; the kind starts counting anew), with its
    // durations still unknown; kept until resolve(iteration) when they need resolving.
    dist::ParallelComm take(dist::DataParallelism& parallel, std::int64_t iteration);
    // The iteration's resolved communication (nullopt: nothing was kept for it). Drops it and
    // older entries (iterations the recorder no longer holds: their handles go too).
    std::optional<dist::ParallelComm> resolve(std::int64_t iteration);

  private:
    std::map<std::int64_t, dist::PendingParallelComm> pending_;
};

} // namespace trainscope::train
