// run.workload=comm: the communication benchmark over the run's communicator (/comm, nothing
// else), as nccl-tests measures collectives.
#include <iomanip>
#include <sstream>

#include "trainscope/core/log.hpp"
#include "trainscope/distributed/comm_benchmark.hpp"
#include "trainscope/distributed/communicator.hpp"
#include "trainscope/distributed/mpi_runtime.hpp"
#include "trainscope/train/run_file_tables.hpp"
#include "workloads_internal.hpp"

namespace trainscope::train {
namespace {

class CommWorkload final : public Workload {
  public:
    explicit CommWorkload(const RunEnvironment& env)
        : Workload(env), options_(dist::CommBenchmarkOptions::from_config(env.cfg)) {}

    WorkloadKind kind() const override { return WorkloadKind::Comm; }

    void build() override {
        dist::agree_on_errors(env_.world, [&] {
            // MPI: the benchmark runs at MPI_THREAD_SINGLE and times MPI's blocking calls on this
            // thread, so dist.timeout bounds only NCCL here (see Communicator::set_timeout).
            comm_ = dist::make_communicator(env_.dist.backend, env_.world, env_.device.device,
                                            env_.dist.timeout_s, {env_.dist.allreduce});
        });
    }

    std::string plan_text() const override {
        const auto sizes = options_.sizes();
        std::ostringstream o;
        o << "trainscope plan (dry run: nothing is measured or written)\n"
          << "  workload      comm: collectives over the " << env_.dist.backend << " communicator\n"
          << "  ranks         " << env_.topo.world_size << " on " << env_.topo.num_nodes
          << " node(s)\n"
          << "  allreduce     " << comm_->allreduce_algorithm()
          << " (dist.allreduce=" << to_string(env_.dist.allreduce) << ")\n"
          << "  sizes         " << sizes.size() << " from " << sizes.front() << " B to "
          << sizes.back() << " B\n";
        return o.str();
    }

    std::vector<io::Attribute> plan_attributes() const override {
        return {{"workload", std::string(to_string(kind()))},
                {"device", env_.device.device.str()},
                {"backend", env_.dist.backend},
                {"allreduce", comm_->allreduce_algorithm()},
                {"dataset", std::string("none (communication benchmark)")}};
    }

    void run(io::RunFile& file, Checkpointer*) override {
        dist::CommBenchmark bench(options_);
        core::log::info() << "communication benchmark (" << comm_->backend() << ", "
                          << comm_->size() << " ranks, " << comm_->allreduce_algorithm()
                          << " allreduce), writing " << file.path();
        const auto results = bench.run(*comm_);
        write_comm_benchmark(file, bench.options(), results, comm_->backend(), comm_->size(),
                             comm_->allreduce_algorithm());
        std::ostringstream table;
        table << "op              bytes      time [us]   algbw [GB/s]   busbw [GB/s]\n";
        for (const auto& r : results)
            table << std::left << std::setw(14) << dist::to_string(r.op) << std::right
                  << std::setw(12) << r.bytes << std::setw(14) << std::fixed << std::setprecision(2)
                  << r.time_s * 1e6 << std::setw(15) << std::setprecision(3) << r.algbw_GBps
                  << std::setw(15) << r.busbw_GBps << "\n";
        core::log::info() << "communication benchmark\n" << table.str();
    }

  protected:
    dist::Communicator* communicator() override { return comm_.get(); }
    std::string start_message(const std::string&) const override { return ""; }

  private:
    dist::CommBenchmarkOptions options_;
    std::unique_ptr<dist::Communicator> comm_;
};

} // namespace

std::unique_ptr<Workload> make_comm_workload(const RunEnvironment& env) {
    return std::make_unique<CommWorkload>(env);
}

} // namespace trainscope::train
