// run.strategy=dp: single-process data parallelism over the devices one process can see, as
// PyTorch's nn.DataParallel does it: every step the batch is scattered in chunks along dimension 0,
// each chunk runs forward on its own replica of the model, the outputs are gathered on the first
// device where the loss is computed, and backward flows back through the gather into every
// replica. The replicas' gradients are then summed into the master model (on the first device),
// which alone is optimised; the replicas are refreshed from it before the next forward.
//
// Batch-norm statistics are per chunk (each replica normalises its own chunk), and the running
// statistics that survive are the master's (replica 0's), as in nn.DataParallel.
//
// The devices may all be the CPU (several replicas in one process): no speed-up, but the same
// code path, which is how it is tested on machines without GPUs.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

#include "trainscope/models/mobilenet_v2.hpp"

namespace trainscope::train {

class DataParallel {
  public:
    // `master` is already on devices[0] in its final dtype/layout. `make_replica` builds a model
    // of the same architecture (its initial values do not matter: refresh() overwrites them).
    // channels_last: replicas keep 4-D weights NHWC like the master.
    DataParallel(models::MobileNetV2 master, std::function<models::MobileNetV2()> make_replica,
                 std::vector<torch::Device> devices, torch::Dtype dtype, bool channels_last);

    std::size_t size() const { return devices_.size(); }
    const std::vector<torch::Device>& devices() const { return devices_; }

    // Copies the master's parameters and buffers into the other replicas (no autograd).
    void refresh();
    // Scatters `x` (on devices[0]) into size() chunks (torch::chunk: the last may be smaller;
    // fewer chunks when the batch has fewer rows than devices), runs each replica on its chunk,
    // and gathers the outputs on devices[0] (differentiable). Train or eval mode follows the
    // master's, set with train().
    torch::Tensor forward(const torch::Tensor& x);
    // Adds every replica's gradients into the master's (.grad created when missing) and zeroes
    // the replicas' gradients. Call after backward, before the optimizer step.
    void reduce_gradients();
    void train(bool on);

  private:
    models::MobileNetV2 master_;
    std::vector<models::MobileNetV2> replicas_; // replicas_[0] is master_
    std::vector<torch::Device> devices_;
    bool channels_last_;
};

} // namespace trainscope::train
