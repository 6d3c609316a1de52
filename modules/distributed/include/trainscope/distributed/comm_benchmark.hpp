// CommBenchmark: what nccl-tests measure, over trainscope's own Communicator (run.workload=comm):
// allreduce, allgather, reduce_scatter and broadcast over a size sweep, warm-up then timed
// iterations, time per operation and algbw/busbw (distributed/bandwidth.hpp), handed over as
// CommResults that train/run_file_tables.hpp writes to /comm, so a scaling study characterises its
// interconnect in the same file as its training runs.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "trainscope/core/config.hpp"
#include "trainscope/distributed/bandwidth.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/gradient_synchronizer.hpp"

namespace trainscope::dist {

struct CommBenchmarkOptions {
    std::int64_t min_bytes = 8;         // comm.min_bytes
    std::int64_t max_bytes = 256 << 20; // comm.max_bytes (inclusive)
    double factor = 2;                  // comm.factor: next size = round(size x factor)
    int warmup = 5;                     // comm.warmup: untimed iterations per size
    int iters = 20;                     // comm.iters: timed iterations per size
    std::vector<Collective> ops = {Collective::AllReduce, Collective::AllGather,
                                   Collective::ReduceScatter, Collective::Broadcast};
    torch::ScalarType dtype = torch::kFloat32; // comm.dtype

    // Reads and checks the comm.* options (declared by dist::declare_options); ConfigError with
    // the key, the value and the fix.
    static CommBenchmarkOptions from_config(const core::Config& config);
    // The requested sweep: min_bytes, round(min_bytes x factor), ... up to max_bytes.
    std::vector<std::int64_t> sizes() const;
};

// The comm.dtype spelling of `dtype` (float32, float64, bfloat16, float16; LibTorch's name for any
// other type).
std::string comm_dtype_name(torch::ScalarType dtype);

// One (operation, size) measurement; identical on every rank after run().
struct CommResult {
    Collective op = Collective::AllReduce;
    std::int64_t bytes = 0; // whole array as nccl-tests count it (bandwidth.hpp), after rounding
    std::int64_t count = 0; // elements of that array (allgather: output, reduce_scatter: input)
    double time_s = 0;      // seconds per operation: each rank's mean over the timed iterations,
                            // averaged over ranks (nccl-tests' default, -a 1)
    double time_max_s = 0;  // the slowest rank's mean
    double algbw_GBps = 0;  // bytes / time_s / 1e9
    double busbw_GBps = 0;  // algbw_GBps x busbw_factor(op, ranks)
};

// Elements of the whole array for a requested size: bytes / element size, rounded down to a
// multiple of `ranks` for allgather and reduce_scatter (each rank owns count / ranks elements, as
// nccl-tests do). 0 means the size is too small for this operation and is skipped.
std::int64_t comm_benchmark_count(Collective op, std::int64_t bytes, std::int64_t element_size,
                                  int ranks);

class CommBenchmark {
  public:
    explicit CommBenchmark(CommBenchmarkOptions options);
    const CommBenchmarkOptions& options() const { return options_; }

    // Collective over comm. For each operation a warm-up at the largest size (`warmup` times) and
    // at the smallest (max(warmup, 100) times), as nccl-tests do; then for each size: `warmup`
    // untimed operations, a
    // barrier, then `iters` operations issued back to back and waited for (NCCL's blocking calls
    // only order the streams, so its loop stays asynchronous for the host, like nccl-tests'
    // launch loop); a rank's time is the batch's time / iters, the batch timed by
    // Communicator::time_batch (MPI: host clock; NCCL: CUDA events around the whole batch on the
    // communicator's stream). Times are combined over ranks with two allreduces at the end, so no
    // rank waits on a reduction while others are still timing. Buffers are zeros on comm.device(),
    // reductions Sum. Throws ConfigError for a dtype the backend cannot reduce.
    std::vector<CommResult> run(Communicator& comm) const;

  private:
    CommBenchmarkOptions options_;
};

} // namespace trainscope::dist
