// GradientSynchronizer: data-parallel gradient averaging as DDP does it. Parameters are packed into
// buckets (reverse registration order, one dtype per bucket, capped in bytes); a post-accumulate-
// grad hook per parameter launches a bucket's asynchronous allreduce as soon as all its gradients
// exist, so communication overlaps the rest of backward; finish() waits and writes the averages
// back into .grad.
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "trainscope/dist/communicator.hpp"

namespace trainscope::dist {

// Usage per iteration:   sync.begin_iteration(); loss.backward(); sync.finish(); optimizer.step();
// Gradient accumulation: run the first micro-batches' backward passes without begin_iteration()
// (hooks are idle then, gradients just accumulate locally), and call begin_iteration() before the
// last micro-batch's backward: the hooks then reduce the accumulated .grad.
// Running backward twice inside one iteration (between begin_iteration() and finish()) is an
// error: the second gradient of a parameter whose bucket is already in flight would be lost, so
// the hook throws core::InternalError, which surfaces from backward().
// Communication of one iteration, as this rank saw it. Bytes are payload bytes allreduced (the
// bucket buffers); bus bandwidth = bytes / collective time x 2(n-1)/n (dist/bandwidth.hpp).
struct IterationComm {
    double bytes = 0;        // sum of bucket_bytes; 0 at world size 1 (nothing is communicated)
    double collective_s = 0; // sum of bucket_s: time inside the collectives, where they ran
    double exposed_s = 0;    // what finish() waited for them: communication backward did not hide
    std::vector<double> bucket_bytes; // per bucket, launch order (all 0 at world size 1)
    std::vector<double> bucket_s;     // per bucket: the allreduce's own duration (Work::seconds)
};

class GradientSynchronizer {
  public:
    // parameters: leaves that require grad, all on comm.device()'s device type. Keeps references
    // (the tensors share storage with the model's parameters).
    GradientSynchronizer(Communicator& comm, std::vector<torch::Tensor> parameters,
                         std::size_t bucket_cap_bytes);
    ~GradientSynchronizer(); // removes its hooks
    GradientSynchronizer(const GradientSynchronizer&) = delete;
    GradientSynchronizer& operator=(const GradientSynchronizer&) = delete;

    // Copies root's parameters (and buffers, e.g. batch-norm statistics) to every rank, so that all
    // ranks start equal. Collective.
    void broadcast_parameters(int root = 0, const std::vector<torch::Tensor>& buffers = {});

    void begin_iteration(); // before backward: arms the hooks
    // After backward: launches the buckets not yet launched (a parameter without .grad contributes
    // zeros; afterwards every parameter has a .grad), waits for all, writes the averaged gradients
    // into .grad. Returns the seconds spent waiting (exposed communication; with NCCL the wait is
    // stream-ordered, so this is only host overhead and the GPU wait shows in the CUDA timeline).
    double finish();

    std::size_t num_buckets() const;
    std::vector<std::size_t> bucket_bytes() const; // payload per bucket, launch order
    std::vector<std::vector<std::size_t>> bucket_parameters() const; // parameter indices per bucket
    // Bytes allreduced per iteration (sum of bucket_bytes(); 0 when world size is 1: no traffic).
    std::uint64_t bytes_per_iteration() const;
    // Of the last finished iteration: buckets launched from hooks during backward vs in finish().
    std::size_t buckets_launched_in_backward() const;
    std::size_t buckets_launched_in_finish() const;
    // Of the last finished iteration (all zeros before the first finish()). bucket_s is measured
    // where the collective ran: on the MPI backend's progress thread from start to end (so it
    // excludes time queued behind earlier buckets); on NCCL between CUDA events on the
    // communicator's stream, resolved here, which blocks until the GPU finished the last bucket:
    // read it late (after optimizer.step(), or at the start of the next iteration). Results are
    // cached; a later finish() replaces them.
    IterationComm last_iteration() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

} // namespace trainscope::dist
