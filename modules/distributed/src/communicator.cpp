// The communicator's backend-independent parts and the backend factory (MPI:
// mpi_communicator.cpp with its progress thread in mpi_progress.cpp; NCCL:
// nccl_communicator.cpp; device binding: device.cpp).
#include "trainscope/distributed/communicator.hpp"

#include <torch/torch.h>

#include "mpi_progress.hpp"
#include "nccl_communicator.hpp"
#include "trainscope/core/build_config.hpp"
#include "trainscope/core/error.hpp"

namespace trainscope::dist {

const char* to_string(ReduceOp op) {
    switch (op) {
    case ReduceOp::Sum:
        return "sum";
    case ReduceOp::Average:
        return "average";
    case ReduceOp::Max:
        return "max";
    case ReduceOp::Min:
        return "min";
    }
    return "?";
}

namespace {

using detail::Clock;
using detail::seconds_since;

// The handle of a collective that completed on the caller's thread before it was returned: its
// duration is known, and the caller waited for all of it.
class CompletedWork final : public Work {
  public:
    explicit CompletedWork(double seconds) : seconds_(seconds) {}
    void wait() override {}
    bool completed() override { return true; }
    double seconds() override { return seconds_; }
    double exposed_seconds() override { return seconds_; }

  private:
    double seconds_;
};

} // namespace

void Communicator::allreduce(const torch::Tensor& tensor, ReduceOp op) {
    allreduce_async(tensor, op)->wait();
}

std::shared_ptr<Work> Communicator::reduce_scatter_timed(const torch::Tensor& in, torch::Tensor out,
                                                         ReduceOp op) {
    const auto t0 = Clock::now();
    reduce_scatter(in, std::move(out), op);
    return std::make_shared<CompletedWork>(seconds_since(t0));
}

double Communicator::time_batch(const std::function<void()>& ops) {
    const auto t0 = Clock::now();
    ops();
    return seconds_since(t0);
}

std::unique_ptr<Communicator> make_communicator(const std::string& backend, MPI_Comm comm,
                                                torch::Device device, double timeout_s,
                                                const AllreduceOptions& allreduce) {
    if (backend == "mpi") return detail::make_mpi_communicator(comm, device, timeout_s, allreduce);
    if (backend == "nccl") {
        if (allreduce.algorithm == AllreduceAlgorithm::Hierarchical)
            throw core::ConfigError(kNcclHierarchical);
#if TRAINSCOPE_HAVE_NCCL
        if (!device.is_cuda())
            throw core::ConfigError("dist.backend=nccl needs a CUDA device but this rank computes "
                                    "on " +
                                    device.str() + ": use dist.backend=mpi for CPU runs");
        return detail::make_nccl_communicator(comm, device, timeout_s);
#else
        throw core::ConfigError("dist.backend=nccl but this trainscope was built without NCCL: "
                                "use dist.backend=mpi, or rebuild with CUDA and NCCL available");
#endif
    }
    throw core::ConfigError("dist.backend = '" + backend +
                            "' is not a communicator backend; use "
                            "mpi or nccl");
}

} // namespace trainscope::dist
