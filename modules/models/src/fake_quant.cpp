// Fake quantisation for QAT (torchao's 8da4w scheme), straight-through gradients.
#include "trainscope/models/fake_quant.hpp"

#include <limits>
#include <sstream>

#include "trainscope/core/error.hpp"

namespace trainscope::models {

namespace {
constexpr double kEps = std::numeric_limits<float>::epsilon();

// x + (q - x).detach(): the value of q, the gradient of x.
torch::Tensor straight_through(const torch::Tensor& x, const torch::Tensor& q) {
    return x + (q - x).detach();
}
} // namespace

torch::Tensor fake_quantize_activations_int8(const torch::Tensor& x) {
    torch::Tensor q;
    {
        torch::NoGradGuard no_grad;
        const double qmin = -128, qmax = 127;
        const torch::Tensor xf = x.to(torch::kFloat32);
        // Per token (last dimension), the range always contains 0 (as torchao).
        const torch::Tensor lo = xf.amin(-1, true).clamp_max(0);
        const torch::Tensor hi = xf.amax(-1, true).clamp_min(0);
        const torch::Tensor scale = ((hi - lo) / (qmax - qmin)).clamp_min(kEps);
        // The zero point from whichever end has the smaller rounding error (torchao's choice).
        const torch::Tensor dmin = lo / scale, dmax = hi / scale;
        const torch::Tensor zp =
            torch::where((qmin + dmin) + (qmax + dmax) > 0, qmin - dmin, qmax - dmax)
                .clamp(qmin, qmax)
                .round();
        q = ((torch::round(xf / scale + zp).clamp(qmin, qmax) - zp) * scale).to(x.scalar_type());
    }
    return straight_through(x, q);
}

torch::Tensor fake_quantize_weights_int4(const torch::Tensor& w, std::int64_t group_size) {
    if (w.dim() != 2 || group_size <= 0 || w.size(1) % group_size != 0) {
        std::ostringstream s;
        s << "QAT groups of " << group_size << " do not divide the input dimension of weight "
          << w.sizes() << ": set llm.qat.group_size to a divisor of it (e.g. 32, 64, 256)";
        throw core::ConfigError(s.str());
    }
    torch::Tensor q;
    {
        torch::NoGradGuard no_grad;
        const torch::Tensor g = w.to(torch::kFloat32).reshape({w.size(0), -1, group_size});
        const torch::Tensor absmax =
            torch::maximum(-g.amin(-1, true).clamp_max(0), g.amax(-1, true).clamp_min(0));
        const torch::Tensor scale = (absmax / 7.5).clamp_min(kEps); // (qmax - qmin) / 2
        q = (torch::round(g / scale).clamp(-8, 7) * scale).reshape(w.sizes()).to(w.scalar_type());
    }
    return straight_through(w, q);
}

QatProjectionImpl::QatProjectionImpl(std::shared_ptr<LinearProjectionImpl> base,
                                     std::int64_t group_size)
    : ProjectionImpl(base->in_features, base->out_features), group_size_(group_size) {
    if (group_size <= 0 || in_features % group_size != 0) {
        std::ostringstream s;
        s << "llm.qat.group_size = " << group_size << " does not divide the input dimension "
          << in_features << " of a projection: use a divisor of it (e.g. 32, 64, 256)";
        throw core::ConfigError(s.str());
    }
    weight = register_parameter("weight", base->weight, base->weight.requires_grad());
}

torch::Tensor QatProjectionImpl::forward(const torch::Tensor& x) {
    if (!enabled_) return torch::nn::functional::linear(x, weight);
    return torch::nn::functional::linear(fake_quantize_activations_int8(x),
                                         fake_quantize_weights_int4(weight, group_size_));
}

std::int64_t apply_qat(torch::nn::Module& model, std::int64_t group_size, const NameScope& scope) {
    std::int64_t n = 0;
    for_each_projection(model, [&](torch::nn::Module& parent, const std::string& child,
                                   const std::string& full, std::shared_ptr<ProjectionImpl> p) {
        if (full.rfind("layers.", 0) != 0 || !in_scope(scope, full)) return;
        auto lin = std::dynamic_pointer_cast<LinearProjectionImpl>(p);
        if (!lin) return;
        parent.replace_module(child, std::make_shared<QatProjectionImpl>(lin, group_size));
        ++n;
    });
    return n;
}

void set_qat_enabled(torch::nn::Module& model, bool on) {
    for (const auto& m : model.modules(/*include_self=*/true))
        if (auto* q = dynamic_cast<QatProjectionImpl*>(m.get())) q->set_enabled(on);
}

} // namespace trainscope::models
