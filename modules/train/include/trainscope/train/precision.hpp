// Precision policy for run.precision (fp64 | fp32 | tf32 | fp16-mixed | bf16-mixed | bf16): which
// dtype the parameters live in, whether forward runs under autocast, TF32 math mode, and dynamic
// loss scaling for fp16-mixed. LibTorch has no C++ torch.autocast or GradScaler: both are here,
// built on the same ATen primitives PyTorch's Python classes use.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace trainscope::train {

enum class Precision { FP64, FP32, TF32, FP16Mixed, BF16Mixed, BF16 };

// "fp64" → Precision::FP64, ..., "bf16" → Precision::BF16. Throws core::ConfigError naming
// run.precision, the value and the valid names.
Precision parse_precision(const std::string& name);

// The run.precision spelling of `p` ("fp16-mixed", ...).
const char* to_string(Precision p);

// What one precision mode means for the trainer.
struct PrecisionPolicy {
    Precision mode = Precision::FP32;
    torch::Dtype param_dtype = torch::kFloat32; // fp64 → kFloat64, bf16 → kBFloat16, else kFloat32
    std::optional<torch::Dtype> autocast_dtype; // fp16-mixed → kHalf, bf16-mixed → kBFloat16
    bool loss_scaling = false;                  // fp16-mixed only (bf16 has fp32's exponent range)
    bool tf32 = false;                          // tf32 only: TF32 tensor cores for fp32 matmul/conv
};

// What resolve_precision needs to know about a device; device_caps() fills it from the runtime.
struct DeviceCaps {
    torch::DeviceType type = torch::kCPU;
    int cc_major = 0, cc_minor = 0; // CUDA compute capability (0.0 on other devices)
    std::string name;               // for messages: "cpu", "cuda:0 (NVIDIA H100 80GB HBM3)"
};

// Queries the device: its type and, for CUDA, its compute capability and name.
DeviceCaps device_caps(torch::Device device);

// The policy for `mode` on a device with `caps`. Throws core::ConfigError naming run.precision,
// the device and what to use instead when the mode is impossible there:
//   tf32 needs CUDA compute capability >= 8.0 (TF32 is a tensor-core format; CPUs have none);
//   bf16 and bf16-mixed on CUDA need compute capability >= 8.0;
//   fp16-mixed and bf16-mixed need autocast for the device type (LibTorch 2.13's CPU autocast
//   supports both kHalf and kBFloat16; verified by tests/unit/test_precision.cpp).
PrecisionPolicy resolve_precision(Precision mode, const DeviceCaps& caps);

// parse_precision(name) then resolve_precision(mode, device_caps(device)).
PrecisionPolicy resolve_precision(const std::string& name, torch::Device device);

// Process-wide math mode (at::globalContext()): TF32 on for cuBLAS matmul and cuDNN convolution
// when policy.tf32, else off. Off is set explicitly because PyTorch enables TF32 for cuDNN
// convolutions by default, which would make "fp32" runs silently TF32 on Ampere and later.
// Uses the legacy allowTF32 setters: they update both the legacy and the new fp32_precision
// state, whereas after the new setters the legacy getters (still called by libtorch_cuda) throw.
void apply_math_mode(const PrecisionPolicy& policy);

// RAII region of autocast for the device's type with the policy's dtype; a no-op when
// policy.autocast_dtype is empty. Mirrors Python's torch.autocast: saves the enabled state, dtype
// and cast-cache flag, enables, increments the nesting counter; on exit clears the cast cache
// when leaving the outermost region and restores the saved state. Autocast state is
// thread-local: the scope covers the constructing thread only. Put forward + loss inside and
// backward outside (backward ops run in the dtype autocast chose for their forward). As in
// PyTorch, the cast cache is keyed by parameter, not dtype: nested regions of different dtypes
// must not share parameters.
class AutocastScope {
  public:
    AutocastScope(const PrecisionPolicy& policy, torch::Device device);
    ~AutocastScope();
    AutocastScope(const AutocastScope&) = delete;
    AutocastScope& operator=(const AutocastScope&) = delete;

    bool active() const { return active_; } // false when the policy has no autocast dtype

  private:
    bool active_ = false;
    torch::DeviceType device_type_ = torch::kCPU;
    bool prev_enabled_ = false, prev_cache_enabled_ = true;
    torch::ScalarType prev_dtype_ = torch::kFloat32;
};

// Dynamic loss scaling as PyTorch's torch.amp.GradScaler (defaults: init_scale 2^16, growth
// factor 2, backoff factor 0.5, growth interval 2000), for one optimizer. The scale (float32)
// and the growth tracker (int32) are 0-dim tensors on the device, updated by
// at::_amp_update_scale_; gradients are checked and unscaled by
// at::_amp_foreach_non_finite_check_and_unscale_. Per iteration:
//   scaler.scale(loss).backward();  [gradient allreduce]  scaler.unscale(params) (optional, e.g.
//   before clipping);  scaler.step(optimizer);  scaler.update();
// A step whose gradients hold inf/NaN is skipped and the scale backs off; after growth_interval
// consecutive finite steps the scale grows. With data parallelism, gradients are allreduced
// before unscale(): an inf/NaN on one rank propagates through the sum to every rank, so all ranks
// see found-inf and skip the step together, and their scales stay identical without extra
// communication. Parameters (and so gradients) must not be fp16: keep fp32 master weights.
class GradScaler {
  public:
    struct Options {
        double init_scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5;
        std::int64_t growth_interval = 2000;
        bool enabled = true; // false: every call is a pass-through (fp32/bf16 runs)
    };

    GradScaler(Options options, torch::Device device);

    // loss * scale (the loss unchanged when disabled).
    torch::Tensor scale(const torch::Tensor& loss) const;

    // Divides the .grad of `params` by the scale in place (grouped by device and dtype, as the
    // ATen op requires; parameters without a gradient are skipped) and sets this step's found-inf
    // flag on the device: no host read. Call at most once per step, after the gradients are
    // final (after the DDP allreduce). Throws core::InternalError when called twice before
    // update().
    void unscale_on_device(const std::vector<torch::Tensor>& params);
    // This step's verdict after unscale_on_device: whether a gradient held inf/NaN, and the scale
    // the backward used (before update()). One host read for both (a host sync on GPU: call it
    // where the loop already waits, after Communicator::synchronize), cached for step().
    struct StepCheck {
        bool found_inf = false;
        double scale = 1.0;
    };
    StepCheck check_step();
    // unscale_on_device + check_step: whether any gradient held inf/NaN.
    bool unscale(const std::vector<torch::Tensor>& params);

    // optimizer.step() unless this step found inf/NaN; unscales the optimizer's parameters first
    // when no unscale happened this step and reads the verdict when check_step() was not called
    // (as PyTorch's GradScaler.step does). Returns whether the optimizer stepped. Throws
    // core::InternalError when called twice before update().
    bool step(torch::optim::Optimizer& optimizer);

    // at::_amp_update_scale_ with this step's found-inf: backs off on inf/NaN (and resets the
    // growth tracker), grows after growth_interval finite steps; then resets the per-step state.
    void update();

    bool enabled() const { return options_.enabled; }
    double scale_value() const;          // current scale (host read); 1.0 when disabled
    std::int64_t growth_tracker() const; // consecutive finite steps since the last change
    std::int64_t skipped_steps() const { return skipped_steps_; } // steps skipped so far
    const Options& options() const { return options_; }
    // Checkpoints: the scale, growth tracker and skip count (a resumed run continues the same
    // dynamic loss-scale sequence).
    void save(torch::serialize::OutputArchive& out) const;
    void load(torch::serialize::InputArchive& in);

  private:
    enum class Stage { Ready, Unscaled, Stepped };

    Options options_;
    torch::Tensor scale_;          // () float32 on the device
    torch::Tensor growth_tracker_; // () int32 on the device
    torch::Tensor found_inf_;      // () float32 on the device: > 0 when this step had inf/NaN
    Stage stage_ = Stage::Ready;
    bool checked_ = false; // check_step() ran this step; check_ holds its verdict
    StepCheck check_;
    std::int64_t skipped_steps_ = 0;
};

// The optimizer step of a training step through the loss scaler, as DataParallelism::step's
// `via` (both trainers): a plain step without loss scaling, else the scaler's step (skipped on
// inf/NaN) and its update. Returns whether the optimizer stepped.
std::function<bool(torch::optim::Optimizer&)> scaled_step(GradScaler& scaler);

// The parameters of `optimizer` (all its groups), e.g. for GradScaler::unscale.
std::vector<torch::Tensor> optimizer_parameters(const torch::optim::Optimizer& optimizer);

} // namespace trainscope::train
