// Helpers for MPI test suites that link trainscope::dist.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "trainscope/distributed/communicator.hpp"

namespace trainscope::testing {

// An MPI-backend communicator over MPI_COMM_WORLD on the CPU (collective).
inline std::unique_ptr<dist::Communicator> mpi_communicator() {
    return dist::make_communicator("mpi", MPI_COMM_WORLD, torch::Device(torch::kCPU));
}

// One operation as a RecordingCommunicator saw it issued.
struct RecordedOp {
    std::string comm;       // the recorder's name ("pipe", "dp", ...)
    std::string op;         // "allreduce", "send", "recv", "broadcast", ...
    int peer = -1;          // send/recv: the peer's rank in that communicator
    std::int64_t numel = 0; // elements of the tensor (allgather: the input)
    int batch = -1;         // exchange(): the batch's number on this rank (send/recv: its own)
};

// The order in which a rank issued its operations over several communicators: one log shared by
// several recorders. Thread-safe (gradient hooks may issue from autograd's threads).
class OperationLog {
  public:
    void add(RecordedOp op) {
        std::lock_guard<std::mutex> lock(m_);
        ops_.push_back(std::move(op));
    }
    int next_batch() {
        std::lock_guard<std::mutex> lock(m_);
        return batches_++;
    }
    std::vector<RecordedOp> ops() const {
        std::lock_guard<std::mutex> lock(m_);
        return ops_;
    }
    // One line per operation: "comm op peer numel batch".
    std::string text() const {
        std::ostringstream o;
        for (const RecordedOp& r : ops())
            o << r.comm << ' ' << r.op << ' ' << r.peer << ' ' << r.numel << ' ' << r.batch << '\n';
        return o.str();
    }
    static std::vector<RecordedOp> parse(const std::string& text) {
        std::vector<RecordedOp> out;
        std::istringstream in(text);
        RecordedOp r;
        while (in >> r.comm >> r.op >> r.peer >> r.numel >> r.batch)
            out.push_back(r);
        return out;
    }

  private:
    mutable std::mutex m_;
    std::vector<RecordedOp> ops_;
    int batches_ = 0;
};

// A Communicator that forwards every call to `inner` and logs it (name, operation, peer,
// elements) to a shared OperationLog, so a test sees the order of a rank's operations across
// communicators without a GPU.
class RecordingCommunicator : public dist::Communicator {
  public:
    // with_lane: make_lane() returns a recorder named "<name>.lane" over the same inner
    // communicator (as NCCL offers one), else the inner communicator's lane (MPI: none).
    RecordingCommunicator(dist::Communicator& inner, std::string name, OperationLog& log,
                          bool with_lane = false)
        : inner_(inner), name_(std::move(name)), log_(log), with_lane_(with_lane) {}
    std::unique_ptr<dist::Communicator> make_lane() override {
        if (!with_lane_) return inner_.make_lane();
        return std::make_unique<RecordingCommunicator>(inner_, name_ + ".lane", log_);
    }

    int rank() const override { return inner_.rank(); }
    int size() const override { return inner_.size(); }
    std::string backend() const override { return inner_.backend(); }
    torch::Device device() const override { return inner_.device(); }

    std::shared_ptr<dist::Work> allreduce_async(torch::Tensor t, dist::ReduceOp op) override {
        record("allreduce", t);
        return inner_.allreduce_async(t, op);
    }
    void allreduce(const torch::Tensor& t, dist::ReduceOp op) override {
        record("allreduce", t);
        inner_.allreduce(t, op);
    }
    void broadcast(torch::Tensor t, int root) override {
        record("broadcast", t);
        inner_.broadcast(t, root);
    }
    void allgather(const torch::Tensor& in, torch::Tensor out) override {
        record("allgather", in);
        inner_.allgather(in, out);
    }
    void reduce_scatter(const torch::Tensor& in, torch::Tensor out, dist::ReduceOp op) override {
        record("reduce_scatter", in);
        inner_.reduce_scatter(in, out, op);
    }
    std::shared_ptr<dist::Work> allgather_async(const torch::Tensor& in,
                                                torch::Tensor out) override {
        record("allgather", in);
        return inner_.allgather_async(in, out);
    }
    std::shared_ptr<dist::Work> reduce_scatter_async(const torch::Tensor& in, torch::Tensor out,
                                                     dist::ReduceOp op) override {
        record("reduce_scatter", in);
        return inner_.reduce_scatter_async(in, out, op);
    }
    std::shared_ptr<dist::Work> reduce_scatter_timed(const torch::Tensor& in, torch::Tensor out,
                                                     dist::ReduceOp op) override {
        record("reduce_scatter", in);
        return inner_.reduce_scatter_timed(in, out, op);
    }
    void barrier() override {
        log_.add({name_, "barrier", -1, 0, -1});
        inner_.barrier();
    }
    void allreduce_host(std::vector<double>& values, dist::ReduceOp op) override {
        log_.add({name_, "allreduce_host", -1, static_cast<std::int64_t>(values.size()), -1});
        inner_.allreduce_host(values, op);
    }
    void send(const torch::Tensor& t, int peer) override {
        log_.add({name_, "send", peer, t.numel(), log_.next_batch()});
        inner_.send(t, peer);
    }
    void recv(torch::Tensor t, int peer) override {
        log_.add({name_, "recv", peer, t.numel(), log_.next_batch()});
        inner_.recv(t, peer);
    }
    void exchange(const std::vector<dist::P2POp>& ops) override {
        const int batch = log_.next_batch();
        for (const dist::P2POp& op : ops)
            log_.add({name_, op.kind == dist::P2POp::Kind::Send ? "send" : "recv", op.peer,
                      op.tensor.numel(), batch});
        inner_.exchange(ops);
    }
    std::map<std::string, dist::CommStats> stats() const override { return inner_.stats(); }
    std::string poll_async_error() override { return inner_.poll_async_error(); }
    void set_timeout(double seconds) override { inner_.set_timeout(seconds); }
    void synchronize(const char* what) override { inner_.synchronize(what); }
    double time_batch(const std::function<void()>& ops) override { return inner_.time_batch(ops); }

  private:
    void record(const char* op, const torch::Tensor& t) {
        log_.add({name_, op, -1, t.numel(), -1});
    }
    dist::Communicator& inner_;
    std::string name_;
    OperationLog& log_;
    bool with_lane_ = false;
};

} // namespace trainscope::testing
