// The communication benchmark (run.workload=comm): nccl-tests' measurement loop over trainscope's
// Communicator, so the figures characterise the path training really uses (for the MPI backend
// including its progress thread). The timed loop is measured by Communicator::time_batch: a host
// clock on MPI, a pair of CUDA events around the whole batch on NCCL's stream (mean per
// operation; the NCCL backend takes its per-operation events from a pool, so no event is created
// inside the loop). The results are plain structs; train writes them to /comm.
#include "trainscope/distributed/comm_benchmark.hpp"

#include <mpi.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "trainscope/core/error.hpp"

namespace trainscope::dist {

namespace {

torch::ScalarType parse_dtype(const std::string& name) {
    if (name == "float32") return torch::kFloat32;
    if (name == "float64") return torch::kFloat64;
    if (name == "bfloat16") return torch::kBFloat16;
    if (name == "float16") return torch::kFloat16;
    throw core::ConfigError("option comm.dtype = '" + name +
                            "': use float32, float64, bfloat16 or float16");
}

std::string trim(const std::string& s) {
    const auto b = s.find_first_not_of(" \t");
    if (b == std::string::npos) return "";
    return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

bool reduces(Collective op) {
    return op == Collective::AllReduce || op == Collective::ReduceScatter;
}

} // namespace

std::string comm_dtype_name(torch::ScalarType dtype) {
    switch (dtype) {
    case torch::kFloat32:
        return "float32";
    case torch::kFloat64:
        return "float64";
    case torch::kBFloat16:
        return "bfloat16";
    case torch::kFloat16:
        return "float16";
    default:
        return c10::toString(dtype);
    }
}

CommBenchmarkOptions CommBenchmarkOptions::from_config(const core::Config& config) {
    CommBenchmarkOptions o;
    o.min_bytes = config.get_int("comm.min_bytes");
    o.max_bytes = config.get_int("comm.max_bytes");
    o.factor = config.get_float("comm.factor");
    o.warmup = static_cast<int>(config.get_int("comm.warmup"));
    o.iters = static_cast<int>(config.get_int("comm.iters"));
    o.dtype = parse_dtype(config.get_string("comm.dtype"));
    if (o.min_bytes < 1 || o.max_bytes < o.min_bytes)
        throw core::ConfigError("comm.min_bytes (" + std::to_string(o.min_bytes) +
                                ") must be >= 1 and <= comm.max_bytes (" +
                                std::to_string(o.max_bytes) + ")");
    if (!(o.factor > 1)) {
        std::ostringstream v;
        v << o.factor;
        throw core::ConfigError("option comm.factor = '" + v.str() +
                                "' is invalid: the size step must be > 1 (e.g. 2)");
    }
    o.ops.clear();
    std::stringstream list(config.get_string("comm.ops"));
    for (std::string item; std::getline(list, item, ',');)
        if (!trim(item).empty()) o.ops.push_back(parse_collective(trim(item), "comm.ops"));
    if (o.ops.empty())
        throw core::ConfigError("option comm.ops is empty: name at least one of allreduce, "
                                "allgather, reduce_scatter, broadcast");
    return o;
}

std::vector<std::int64_t> CommBenchmarkOptions::sizes() const {
    std::vector<std::int64_t> out;
    for (std::int64_t s = min_bytes; s <= max_bytes;) {
        out.push_back(s);
        const auto next = static_cast<std::int64_t>(std::llround(static_cast<double>(s) * factor));
        s = std::max(next, s + 1); // a factor close to 1 still advances
    }
    return out;
}

std::int64_t comm_benchmark_count(Collective op, std::int64_t bytes, std::int64_t element_size,
                                  int ranks) {
    const std::int64_t count = bytes / element_size;
    if (op == Collective::AllGather || op == Collective::ReduceScatter)
        return count / ranks * ranks;
    return count;
}

CommBenchmark::CommBenchmark(CommBenchmarkOptions options) : options_(std::move(options)) {}

std::vector<CommResult> CommBenchmark::run(Communicator& comm) const {
    const CommBenchmarkOptions& o = options_;
    const int n = comm.size();
    const torch::Device device = comm.device();
    const auto element_size = static_cast<std::int64_t>(c10::elementSize(o.dtype));
    if (comm.backend() == "mpi" && o.dtype != torch::kFloat32 && o.dtype != torch::kFloat64)
        for (Collective op : o.ops)
            if (reduces(op))
                throw core::ConfigError("comm.dtype=" + comm_dtype_name(o.dtype) + " but the MPI " +
                                        "backend cannot reduce it (" + to_string(op) +
                                        "): use comm.dtype=float32 or float64, or drop " +
                                        to_string(op) + " from comm.ops");
    const auto options = torch::TensorOptions().dtype(o.dtype).device(device);

    torch::NoGradGuard no_grad;
    // One size of one operation: `warmup` untimed operations, a barrier, `iters` timed ones;
    // returns this rank's seconds per operation (0 when iters == 0).
    auto measure = [&](Collective op, std::int64_t count, int warmup, int iters) {
        // Buffers: `a` is the array nccl-tests size (in place for allreduce/broadcast), `b` the
        // per-rank share (allgather input, reduce_scatter output).
        const bool split = op == Collective::AllGather || op == Collective::ReduceScatter;
        torch::Tensor a = torch::zeros({count}, options);
        torch::Tensor b = split ? torch::zeros({count / n}, options) : torch::Tensor();
        // `k` operations back to back. The switch is outside the loop, so the timed loop holds
        // nothing but the Communicator call (as a plain MPI loop holds nothing but MPI's).
        auto repeat = [&](int k) {
            switch (op) {
            case Collective::AllReduce:
                // Blocking, like a plain MPI_Allreduce loop; NCCL's blocking call only orders
                // the streams, so it stays asynchronous for the host.
                for (int i = 0; i < k; ++i)
                    comm.allreduce(a, ReduceOp::Sum);
                break;
            case Collective::AllGather:
                for (int i = 0; i < k; ++i)
                    comm.allgather(b, a);
                break;
            case Collective::ReduceScatter:
                for (int i = 0; i < k; ++i)
                    comm.reduce_scatter(a, b, ReduceOp::Sum);
                break;
            case Collective::Broadcast:
                for (int i = 0; i < k; ++i)
                    comm.broadcast(a, 0);
                break;
            }
        };
        repeat(warmup);
        // The warm-up finished on the device, bounded by dist.timeout (NCCL: a stalled peer is
        // named, not waited for in the driver); no device synchronize inside the timed batch,
        // whose end event time_batch waits for under the same bound.
        comm.synchronize("the comm benchmark's warm-up");
        if (iters == 0) return 0.0;
        comm.barrier();
        // Timed where the operations run: MPI a steady clock around the loop; NCCL one pair of
        // CUDA events around the whole batch on its stream (Communicator::time_batch).
        return comm.time_batch([&] { repeat(iters); }) / iters;
    };

    std::vector<CommResult> results;
    std::vector<double> mine; // this rank's seconds per operation, one per result
    for (Collective op : o.ops) {
        std::vector<std::int64_t> counts;
        for (std::int64_t requested : o.sizes()) {
            const std::int64_t count = comm_benchmark_count(op, requested, element_size, n);
            if (count > 0) counts.push_back(count); // else: less than one element per rank
        }
        if (counts.empty()) continue;
        // As nccl-tests: warm up at the largest and the smallest size before the sweep (the
        // first few hundred small operations of a run are several times slower otherwise).
        measure(op, counts.back(), o.warmup, 0);
        measure(op, counts.front(), std::max(o.warmup, 100), 0);
        for (std::int64_t count : counts) {
            mine.push_back(measure(op, count, o.warmup, o.iters));
            CommResult r;
            r.op = op;
            r.count = count;
            r.bytes = count * element_size;
            results.push_back(r);
        }
    }

    // Combine over ranks once, after all timing: mean (nccl-tests' default) and max.
    if (!mine.empty()) {
        const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
        torch::Tensor mean = torch::tensor(mine, f64).to(device);
        torch::Tensor max = mean.clone();
        comm.allreduce(mean, ReduceOp::Average);
        comm.allreduce(max, ReduceOp::Max);
        comm.synchronize("the comm benchmark's result allreduces");
        mean = mean.cpu();
        max = max.cpu();
        for (std::size_t k = 0; k < results.size(); ++k) {
            CommResult& r = results[k];
            r.time_s = mean[k].item<double>();
            r.time_max_s = max[k].item<double>();
            r.algbw_GBps = algbw_GBps(static_cast<double>(r.bytes), r.time_s);
            r.busbw_GBps = busbw_GBps(r.op, static_cast<double>(r.bytes), r.time_s, n);
        }
    }
    return results;
}

} // namespace trainscope::dist
