// Hooks a model calls around its units (a unit: the embedding, one decoder layer, the head), so
// that sharded data parallelism (distributed/fsdp.hpp) can gather a unit's weights before it runs
// and release and reduce them after. In core so that the model (models) and the sharding
// (distributed) share it without depending on each other.
#pragma once

namespace trainscope::core {

// Units in forward order. The model calls before_forward(u) / after_forward(u) around each unit's
// forward (also without grad), and, when grad mode is on, inserts identity autograd nodes so that
// before_backward(u) runs when the gradient of the unit's output is ready (before any of the unit's
// backward work, activation-checkpointing recomputation included) and after_backward(u) when the
// gradient of its input is (after the unit's parameter gradients were accumulated: autograd runs
// the unit's nodes first, as they were recorded later). A unit whose input needs no gradient (the
// embedding; a layer under a frozen embedding) has no after_backward node: the caller finishes it
// after backward(). The embedding's backward needs no weights, so unit 0 has no before_backward.
class UnitHooks {
  public:
    virtual ~UnitHooks() = default;
    virtual void before_forward(int unit) = 0;
    virtual void after_forward(int unit) = 0;
    virtual void before_backward(int unit) = 0;
    virtual void after_backward(int unit) = 0;
};

} // namespace trainscope::core
