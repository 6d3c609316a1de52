#include "trainscope/models/recompute.hpp"

#include <ATen/autocast_mode.h>

#include <mutex>
#include <optional>
#include <string>

namespace trainscope::models {

// Not anonymous: RecomputeScope::State holds AutocastScope members.
namespace recompute_detail {

// The RNG state of the default generator of `device` (CPU or a GPU).
torch::Tensor rng_state(const torch::Device& device) {
    auto gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.get_state();
}

void set_rng_state(const torch::Device& device, const torch::Tensor& state) {
    auto gen = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
}

// The autocast state of one device type, as torch.autocast keeps it (thread-local).
struct AutocastState {
    bool enabled = false;
    at::ScalarType dtype = at::kFloat;

    static AutocastState of(c10::DeviceType type) {
        return {at::autocast::is_autocast_enabled(type), at::autocast::get_autocast_dtype(type)};
    }
};

// Sets a device type's autocast state for a scope, as entering torch.autocast does (nesting and
// the cast cache included), and restores the previous one when the scope ends.
class AutocastScope {
  public:
    AutocastScope(c10::DeviceType type, AutocastState want)
        : type_(type), previous_(AutocastState::of(type)), nested_(want.enabled) {
        at::autocast::set_autocast_enabled(type_, want.enabled);
        at::autocast::set_autocast_dtype(type_, want.dtype);
        if (nested_) at::autocast::increment_nesting();
    }
    ~AutocastScope() {
        if (nested_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
        at::autocast::set_autocast_enabled(type_, previous_.enabled);
        at::autocast::set_autocast_dtype(type_, previous_.dtype);
    }
    AutocastScope(const AutocastScope&) = delete;
    AutocastScope& operator=(const AutocastScope&) = delete;

  private:
    c10::DeviceType type_;
    AutocastState previous_;
    bool nested_;
};

void save_autocast(torch::autograd::AutogradContext* ctx, const std::string& key,
                   c10::DeviceType type) {
    const auto a = AutocastState::of(type);
    ctx->saved_data[key + "_autocast"] = a.enabled;
    ctx->saved_data[key + "_autocast_dtype"] = a.dtype;
}

AutocastState saved_autocast(torch::autograd::AutogradContext* ctx, const std::string& key) {
    return {ctx->saved_data[key + "_autocast"].toBool(),
            ctx->saved_data[key + "_autocast_dtype"].toScalarType()};
}

} // namespace recompute_detail

void save_recompute_state(torch::autograd::AutogradContext* ctx, const torch::Device& device,
                          const std::string& tag) {
    const std::string key = "recompute_" + tag;
    recompute_detail::save_autocast(ctx, key + "device", device.type());
    recompute_detail::save_autocast(ctx, key + "cpu", c10::DeviceType::CPU);
    ctx->saved_data[key + "rng_cpu"] = recompute_detail::rng_state(torch::kCPU);
    if (device.is_cuda()) ctx->saved_data[key + "rng_device"] = recompute_detail::rng_state(device);
}

struct RecomputeScope::State {
    torch::Device device;
    torch::Tensor caller_cpu, caller_device; // the caller's RNG states, restored on exit
    torch::AutoGradMode grad;                // enabled, or left as it was (Part::Rng)
    std::optional<recompute_detail::AutocastScope> device_autocast, cpu_autocast;

    State(const torch::Device& d, bool enable_grad)
        : device(d), grad(enable_grad || torch::GradMode::is_enabled()) {}
};

RecomputeScope::RecomputeScope(torch::autograd::AutogradContext* ctx, const torch::Device& device,
                               const std::string& tag, Part part)
    : state_(std::make_unique<State>(device, part != Part::Rng)) {
    const std::string key = "recompute_" + tag;
    State& s = *state_;
    if (part != Part::Autocast) {
        s.caller_cpu = recompute_detail::rng_state(torch::kCPU);
        recompute_detail::set_rng_state(torch::kCPU, ctx->saved_data[key + "rng_cpu"].toTensor());
        if (ctx->saved_data.count(key + "rng_device")) {
            s.caller_device = recompute_detail::rng_state(device);
            recompute_detail::set_rng_state(device, ctx->saved_data[key + "rng_device"].toTensor());
        }
    }
    if (part == Part::Rng) return;
    if (device.type() != c10::DeviceType::CPU)
        s.device_autocast.emplace(device.type(),
                                  recompute_detail::saved_autocast(ctx, key + "device"));
    s.cpu_autocast.emplace(c10::DeviceType::CPU,
                           recompute_detail::saved_autocast(ctx, key + "cpu"));
}

RecomputeScope::~RecomputeScope() {
    State& s = *state_;
    s.cpu_autocast.reset();
    s.device_autocast.reset();
    if (s.caller_cpu.defined()) recompute_detail::set_rng_state(torch::kCPU, s.caller_cpu);
    if (s.caller_device.defined()) recompute_detail::set_rng_state(s.device, s.caller_device);
}

struct NoAutocast::State {
    std::optional<recompute_detail::AutocastScope> device_autocast, cpu_autocast;
};

NoAutocast::NoAutocast(const torch::Device& device) : state_(std::make_unique<State>()) {
    if (device.type() != c10::DeviceType::CPU)
        state_->device_autocast.emplace(device.type(), recompute_detail::AutocastState{});
    state_->cpu_autocast.emplace(c10::DeviceType::CPU, recompute_detail::AutocastState{});
}

NoAutocast::~NoAutocast() {
    state_->cpu_autocast.reset();
    state_->device_autocast.reset();
}

} // namespace trainscope::models
