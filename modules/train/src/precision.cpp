// Precision policy, TF32 math mode, autocast regions and dynamic loss scaling (see precision.hpp).
// The autocast and GradScaler logic follows the semantics of torch.autocast and
// torch.amp.GradScaler, written against the ATen primitives they use.
#include "trainscope/train/precision.hpp"

#include <ATen/autocast_mode.h>

#include <array>
#include <map>
#include <utility>

#include "trainscope/core/build_config.hpp"
#include "trainscope/core/error.hpp"
#include "trainscope/train/host_sync.hpp"
#if TRAINSCOPE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace trainscope::train {

namespace {

struct ModeName {
    Precision mode;
    const char* name;
};
constexpr std::array<ModeName, 6> kModes{{{Precision::FP64, "fp64"},
                                          {Precision::FP32, "fp32"},
                                          {Precision::TF32, "tf32"},
                                          {Precision::FP16Mixed, "fp16-mixed"},
                                          {Precision::BF16Mixed, "bf16-mixed"},
                                          {Precision::BF16, "bf16"}}};

std::string valid_names() {
    std::string s;
    for (const auto& m : kModes)
        s += (s.empty() ? "" : ", ") + std::string(m.name);
    return s;
}

std::string cc_string(const DeviceCaps& caps) {
    return std::to_string(caps.cc_major) + "." + std::to_string(caps.cc_minor);
}

[[noreturn]] void impossible(Precision mode, const DeviceCaps& caps, const std::string& why,
                             const std::string& instead) {
    throw core::ConfigError(std::string("run.precision=") + to_string(mode) +
                            " is not possible on " + caps.name + ": " + why + "; " + instead);
}

} // namespace

Precision parse_precision(const std::string& name) {
    for (const auto& m : kModes)
        if (name == m.name) return m.mode;
    std::string hint;
    if (name == "fp16" || name == "half")
        hint = " (pure fp16 training is not offered: fp16-mixed keeps fp32 weights and scales the "
               "loss)";
    else if (name == "bf16mixed" || name == "bf16_mixed" || name == "fp16mixed" ||
             name == "fp16_mixed")
        hint = " (spelled with a hyphen, e.g. bf16-mixed)";
    throw core::ConfigError("run.precision='" + name +
                            "' is not a precision; valid: " + valid_names() + hint);
}

const char* to_string(Precision p) {
    for (const auto& m : kModes)
        if (p == m.mode) return m.name;
    throw core::InternalError("to_string: unknown Precision value " +
                              std::to_string(static_cast<int>(p)));
}

DeviceCaps device_caps(torch::Device device) {
    DeviceCaps caps;
    caps.type = device.type();
    if (!device.is_cuda()) {
        caps.name = device.str();
        return caps;
    }
#if TRAINSCOPE_HAVE_CUDA
    int index = device.has_index() ? device.index() : -1;
    if (index < 0 && cudaGetDevice(&index) != cudaSuccess) index = 0;
    cudaDeviceProp prop{};
    const cudaError_t err = cudaGetDeviceProperties(&prop, index);
    if (err != cudaSuccess) {
        (void)cudaGetLastError(); // leave no sticky error behind
        throw core::ConfigError("run.device=" + device.str() + ": CUDA device " +
                                std::to_string(index) + " cannot be queried (" +
                                cudaGetErrorString(err) +
                                "); check the job's GPU request or use run.device=cpu");
    }
    caps.cc_major = prop.major;
    caps.cc_minor = prop.minor;
    caps.name = "cuda:" + std::to_string(index) + " (" + prop.name + ", compute capability " +
                cc_string(caps) + ")";
    return caps;
#else
    throw core::ConfigError("run.device=" + device.str() +
                            ": this trainscope was built without CUDA; use run.device=cpu or "
                            "rebuild with TRAINSCOPE_USE_CUDA=ON");
#endif
}

PrecisionPolicy resolve_precision(Precision mode, const DeviceCaps& caps) {
    const bool cuda = caps.type == torch::kCUDA;
    const bool ampere = cuda && caps.cc_major >= 8;
    PrecisionPolicy p;
    p.mode = mode;
    switch (mode) {
    case Precision::FP64:
        p.param_dtype = torch::kFloat64;
        break;
    case Precision::FP32:
        break;
    case Precision::TF32:
        if (!cuda)
            impossible(mode, caps,
                       "TF32 is a tensor-core format of NVIDIA GPUs (compute capability >= 8.0)",
                       "use run.precision=fp32 on this device, or run.device=cuda on an Ampere or "
                       "newer GPU");
        if (!ampere)
            impossible(mode, caps, "TF32 tensor cores need compute capability >= 8.0 (Ampere)",
                       "use run.precision=fp32 or fp16-mixed on this GPU");
        p.tf32 = true;
        break;
    case Precision::FP16Mixed:
    case Precision::BF16Mixed:
        p.autocast_dtype = mode == Precision::FP16Mixed ? torch::kHalf : torch::kBFloat16;
        p.loss_scaling = mode == Precision::FP16Mixed;
        if (!at::autocast::is_autocast_available(caps.type))
            impossible(mode, caps, "LibTorch has no autocast for this device type",
                       "use run.precision=fp32");
        if (mode == Precision::BF16Mixed && cuda && !ampere)
            impossible(mode, caps, "bfloat16 tensor cores need compute capability >= 8.0 (Ampere)",
                       "use run.precision=fp16-mixed on this GPU");
        break;
    case Precision::BF16:
        p.param_dtype = torch::kBFloat16;
        if (cuda && !ampere)
            impossible(mode, caps, "bfloat16 needs compute capability >= 8.0 (Ampere)",
                       "use run.precision=fp16-mixed or fp32 on this GPU");
        break;
    }
    return p;
}

PrecisionPolicy resolve_precision(const std::string& name, torch::Device device) {
    const Precision mode = parse_precision(name);
    return resolve_precision(mode, device_caps(device));
}

void apply_math_mode(const PrecisionPolicy& policy) {
    auto& ctx = at::globalContext();
    ctx.setAllowTF32CuBLAS(policy.tf32);
    ctx.setAllowTF32CuDNN(policy.tf32);
}

// ---- AutocastScope ---------------------------------------------------------------------------

AutocastScope::AutocastScope(const PrecisionPolicy& policy, torch::Device device)
    : active_(policy.autocast_dtype.has_value()), device_type_(device.type()) {
    if (!active_) return;
    prev_enabled_ = at::autocast::is_autocast_enabled(device_type_);
    prev_dtype_ = at::autocast::get_autocast_dtype(device_type_);
    prev_cache_enabled_ = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_enabled(device_type_, true);
    at::autocast::set_autocast_dtype(device_type_, *policy.autocast_dtype);
    at::autocast::increment_nesting();
    at::autocast::set_autocast_cache_enabled(true);
}

AutocastScope::~AutocastScope() {
    if (!active_) return;
    // The cache holds low-precision copies of parameters made inside the region; drop them when
    // the outermost region closes (the parameters change at the next optimizer step).
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(device_type_, prev_enabled_);
    at::autocast::set_autocast_dtype(device_type_, prev_dtype_);
    at::autocast::set_autocast_cache_enabled(prev_cache_enabled_);
}

// ---- GradScaler ------------------------------------------------------------------------------

GradScaler::GradScaler(Options options, torch::Device device) : options_(options) {
    if (!options_.enabled) return;
    if (!(options_.init_scale > 0) || !(options_.growth_factor > 1.0) ||
        !(options_.backoff_factor > 0 && options_.backoff_factor < 1.0) ||
        options_.growth_interval < 1)
        throw core::InternalError("GradScaler: need init_scale > 0, growth_factor > 1, "
                                  "0 < backoff_factor < 1 and growth_interval >= 1");
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
    scale_ = torch::scalar_tensor(options_.init_scale, f32);
    growth_tracker_ = torch::scalar_tensor(0, f32.dtype(torch::kInt32));
    found_inf_ = torch::scalar_tensor(0.0, f32);
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
    if (!options_.enabled) return loss;
    return loss * scale_.to(loss.device(), /*non_blocking=*/true);
}

void GradScaler::unscale_on_device(const std::vector<torch::Tensor>& params) {
    if (!options_.enabled) return;
    if (stage_ == Stage::Unscaled)
        throw core::InternalError("GradScaler::unscale called twice in one step (call update())");
    if (stage_ == Stage::Stepped)
        throw core::InternalError("GradScaler::unscale called after step() (call update() first)");
    // PyTorch computes the inverse in double: exact for the power-of-two scales used here.
    const torch::Tensor inv_scale = scale_.to(torch::kFloat64).reciprocal().to(torch::kFloat32);
    // The ATen op wants one device (and, for its fast path, one dtype) per call.
    std::map<std::pair<std::string, int>, std::vector<torch::Tensor>> groups;
    for (const auto& p : params) {
        const torch::Tensor& g = p.grad();
        if (!g.defined()) continue;
        if (g.scalar_type() == torch::kHalf)
            throw core::InternalError("GradScaler: fp16 gradients cannot be unscaled safely; keep "
                                      "parameters in fp32 under fp16-mixed");
        if (g.is_sparse())
            throw core::InternalError("GradScaler: sparse gradients are not supported");
        groups[{g.device().str(), static_cast<int>(g.scalar_type())}].push_back(g);
    }
    found_inf_.zero_();
    for (auto& [key, grads] : groups) {
        const torch::Device dev = grads.front().device();
        torch::Tensor found = dev == found_inf_.device()
                                  ? found_inf_
                                  : torch::zeros_like(found_inf_, found_inf_.options().device(dev));
        at::_amp_foreach_non_finite_check_and_unscale_(grads, found, inv_scale.to(dev));
        if (dev != found_inf_.device()) found_inf_.add_(found.to(found_inf_.device()));
    }
    stage_ = Stage::Unscaled;
    checked_ = false;
}

GradScaler::StepCheck GradScaler::check_step() {
    if (!options_.enabled) return {};
    if (stage_ != Stage::Unscaled)
        throw core::InternalError("GradScaler::check_step before unscale_on_device in this step");
    if (!checked_) {
        const torch::Tensor both = read_to_host(torch::stack({found_inf_, scale_})); // [2]
        check_.found_inf = both[0].item<float>() > 0.0f;
        check_.scale = static_cast<double>(both[1].item<float>());
        checked_ = true;
    }
    return check_;
}

bool GradScaler::unscale(const std::vector<torch::Tensor>& params) {
    if (!options_.enabled) return false;
    unscale_on_device(params);
    return check_step().found_inf;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
    if (!options_.enabled) {
        optimizer.step();
        return true;
    }
    if (stage_ == Stage::Stepped)
        throw core::InternalError("GradScaler::step called twice in one step (call update())");
    if (stage_ == Stage::Ready) unscale_on_device(optimizer_parameters(optimizer));
    const bool found_inf = check_step().found_inf;
    stage_ = Stage::Stepped;
    if (found_inf) {
        ++skipped_steps_;
        return false;
    }
    optimizer.step();
    return true;
}

void GradScaler::update() {
    if (!options_.enabled) return;
    if (stage_ == Stage::Ready)
        throw core::InternalError(
            "GradScaler::update without unscale() or step() in this step: no inf check recorded");
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor,
                           options_.backoff_factor, options_.growth_interval);
    stage_ = Stage::Ready;
    checked_ = false;
}

std::function<bool(torch::optim::Optimizer&)> scaled_step(GradScaler& scaler) {
    return [&scaler](torch::optim::Optimizer& optimizer) {
        if (!scaler.enabled()) {
            optimizer.step();
            return true;
        }
        const bool taken = scaler.step(optimizer);
        scaler.update();
        return taken;
    };
}

double GradScaler::scale_value() const {
    return options_.enabled ? read_scalar(scale_) : 1.0;
}

std::int64_t GradScaler::growth_tracker() const {
    return options_.enabled ? static_cast<std::int64_t>(read_scalar(growth_tracker_)) : 0;
}

void GradScaler::save(torch::serialize::OutputArchive& out) const {
    if (!options_.enabled) return;
    out.write("scale", scale_, /*is_buffer=*/true);
    out.write("growth_tracker", growth_tracker_, /*is_buffer=*/true);
    out.write("skipped_steps", c10::IValue(skipped_steps_));
}

void GradScaler::load(torch::serialize::InputArchive& in) {
    if (!options_.enabled) return;
    torch::Tensor scale, tracker;
    in.read("scale", scale, /*is_buffer=*/true);
    in.read("growth_tracker", tracker, /*is_buffer=*/true);
    scale_.copy_(scale);
    growth_tracker_.copy_(tracker);
    c10::IValue skipped;
    in.read("skipped_steps", skipped);
    skipped_steps_ = skipped.toInt();
}

std::vector<torch::Tensor> optimizer_parameters(const torch::optim::Optimizer& optimizer) {
    std::vector<torch::Tensor> params;
    for (const auto& group : optimizer.param_groups())
        params.insert(params.end(), group.params().begin(), group.params().end());
    return params;
}

} // namespace trainscope::train
