// What sharded data parallelism (fsdp.hpp) needs from a model, so that distributed does not depend
// on any model: its units in forward order, each unit's modules, whether a unit still has to be
// materialised (models built on the meta device), where to install the unit hooks, and whether the
// first and the last unit share a weight (tied embeddings). train adapts the Llama model to it
// (train/llama_units.hpp).
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "trainscope/core/unit_hooks.hpp"

namespace trainscope::dist {

class UnitModel {
  public:
    virtual ~UnitModel() = default;
    virtual int num_units() const = 0;
    // The unit's modules with their names' prefixes in the model (e.g. "layers.3."), in
    // registration order.
    virtual std::vector<std::pair<std::string, torch::nn::Module*>> unit_modules(int unit) = 0;
    // False while a unit's tensors are still on the meta device.
    virtual bool unit_materialized(int unit) = 0;
    // Null removes them. Not owned.
    virtual void set_unit_hooks(core::UnitHooks* hooks) = 0;
    // The first unit's weight is also the last unit's (tied embeddings): the first unit stays
    // gathered while the last one needs it.
    virtual bool first_and_last_tied() const = 0;
    // The whole model (its named parameters name the trainable tensors).
    virtual torch::nn::Module& module() = 0;
};

} // namespace trainscope::dist
