// Recomputation in backward as torch.utils.checkpoint does it (reentrant, preserve_rng_state):
// the forward records the autocast state (of the input's device type and of the CPU) and the RNG
// states (CPU, and the input's GPU); the backward re-enters both for the recomputation, so dropout
// draws the forward's masks and low-precision activations are the forward's bit for bit, then
// gives the caller its own states back. Used by the checkpointed decoder layer and the chunked
// LM loss.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

namespace trainscope::models {

// Stores the current autocast and RNG states in ctx->saved_data (keys "recompute_<tag>*"; a
// function that recomputes several pieces one after another saves one state per piece).
void save_recompute_state(torch::autograd::AutogradContext* ctx, const torch::Device& device,
                          const std::string& tag = "");

// For its lifetime: grad enabled, the autocast and RNG states saved by save_recompute_state.
// On exit: the caller's autocast and RNG states. `part` restricts it to the RNG states (a loop
// that recomputes pieces in their forward order from one saved state, back-propagating each
// between them) or to grad mode and autocast (each piece's recomputation inside that loop).
class RecomputeScope {
  public:
    enum class Part { All, Rng, Autocast };
    RecomputeScope(torch::autograd::AutogradContext* ctx, const torch::Device& device,
                   const std::string& tag = "", Part part = Part::All);
    ~RecomputeScope();
    RecomputeScope(const RecomputeScope&) = delete;
    RecomputeScope& operator=(const RecomputeScope&) = delete;

  private:
    struct State;
    std::unique_ptr<State> state_;
};

// Autocast off (the device type's and the CPU's) for its lifetime, as in a backward pass run
// outside torch.autocast; the previous state is restored on exit.
class NoAutocast {
  public:
    explicit NoAutocast(const torch::Device& device);
    ~NoAutocast();
    NoAutocast(const NoAutocast&) = delete;
    NoAutocast& operator=(const NoAutocast&) = delete;

  private:
    struct State;
    std::unique_ptr<State> state_;
};

} // namespace trainscope::models
