// MobileNetV2 layers and initialisation (kaiming-normal fan-out convolutions, unit batch-norm,
// N(0, 0.01) classifier), following the paper's table 2 settings.
#include "trainscope/models/mobilenet_v2.hpp"

#include <algorithm>
#include <array>

#include "trainscope/core/config.hpp"

namespace trainscope::models {
namespace {

// Channels rounded to a multiple of 8, never more than 10% below the request (paper / torchvision).
std::int64_t make_divisible(double value, std::int64_t divisor = 8) {
    std::int64_t v = std::max<std::int64_t>(
        divisor, static_cast<std::int64_t>(value + divisor / 2.0) / divisor * divisor);
    if (v < 0.9 * value) v += divisor;
    return v;
}

struct BlockSetting {
    std::int64_t expand, channels, repeats, stride; // t, c, n, s in the paper's table 2
};
constexpr std::array<BlockSetting, 7> kSettings{{{1, 16, 1, 1},
                                                 {6, 24, 2, 2},
                                                 {6, 32, 3, 2},
                                                 {6, 64, 4, 2},
                                                 {6, 96, 3, 1},
                                                 {6, 160, 3, 2},
                                                 {6, 320, 1, 1}}};
constexpr std::int64_t kStemChannels = 32;
constexpr std::int64_t kLastChannels = 1280;

} // namespace

void declare_options(core::OptionRegistry& r) {
    r.add_choice("cv.model", "mobilenet_v2", {"mobilenet_v2"}, "image classification network");
    r.add_float("cv.width_mult", 1.0,
                "MobileNetV2 width multiplier (channels scaled, rounded to 8)", 0.05, 4.0);
    r.add_float("cv.dropout", 0.2, "dropout probability before the classifier", 0.0, 0.99);
    r.add_bool("cv.sync_bn", false,
               "batch-norm statistics over the joint batch of all ranks (SyncBatchNorm; one "
               "allreduce per layer in forward and in backward)");
}

MobileNetV2Options mobilenet_options_from_config(const core::Config& cfg, std::int64_t num_classes,
                                                 std::int64_t in_channels) {
    MobileNetV2Options o;
    o.num_classes = num_classes;
    o.in_channels = in_channels;
    o.width_mult = cfg.get_float("cv.width_mult");
    o.dropout = cfg.get_float("cv.dropout");
    return o;
}

ConvBNReLU6Impl::ConvBNReLU6Impl(std::int64_t in, std::int64_t out, std::int64_t kernel,
                                 std::int64_t stride, std::int64_t groups,
                                 const AllreduceSum& sync_bn_allreduce) {
    conv_ = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, kernel)
                                                          .stride(stride)
                                                          .padding((kernel - 1) / 2)
                                                          .groups(groups)
                                                          .bias(false)));
    if (sync_bn_allreduce)
        sync_bn_ = register_module("bn", SyncBatchNorm2d(out, sync_bn_allreduce));
    else
        bn_ = register_module("bn", torch::nn::BatchNorm2d(out));
}

torch::Tensor ConvBNReLU6Impl::forward(const torch::Tensor& x) {
    torch::Tensor h = conv_->forward(x);
    torch::Tensor y = bn_ ? bn_->forward(h) : sync_bn_->forward(h);
    return torch::hardtanh_(y, 0.0, 6.0); // in-place ReLU6
}

InvertedResidualImpl::InvertedResidualImpl(std::int64_t in, std::int64_t out, std::int64_t stride,
                                           std::int64_t expand_ratio,
                                           const AllreduceSum& sync_bn_allreduce)
    : use_residual_(stride == 1 && in == out) {
    const std::int64_t hidden = in * expand_ratio;
    torch::nn::Sequential body;
    if (expand_ratio != 1) body->push_back(ConvBNReLU6(in, hidden, 1, 1, 1, sync_bn_allreduce));
    body->push_back(ConvBNReLU6(hidden, hidden, 3, stride, /*groups=*/hidden,
                                sync_bn_allreduce)); // depthwise
    body->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(hidden, out, 1).bias(false)));
    if (sync_bn_allreduce)
        body->push_back(SyncBatchNorm2d(out, sync_bn_allreduce));
    else
        body->push_back(torch::nn::BatchNorm2d(out));
    body_ = register_module("conv", body);
}

torch::Tensor InvertedResidualImpl::forward(const torch::Tensor& x) {
    return use_residual_ ? x + body_->forward(x) : body_->forward(x);
}

MobileNetV2Impl::MobileNetV2Impl(const MobileNetV2Options& o) {
    std::int64_t in = make_divisible(kStemChannels * o.width_mult);
    const std::int64_t last = make_divisible(kLastChannels * std::max(1.0, o.width_mult));
    torch::nn::Sequential f;
    const AllreduceSum& sync = o.sync_bn_allreduce;
    f->push_back(ConvBNReLU6(o.in_channels, in, 3, 2, 1, sync));
    for (const auto& s : kSettings) {
        const std::int64_t out = make_divisible(s.channels * o.width_mult);
        for (std::int64_t i = 0; i < s.repeats; ++i) {
            f->push_back(InvertedResidual(in, out, i == 0 ? s.stride : 1, s.expand, sync));
            in = out;
        }
    }
    f->push_back(ConvBNReLU6(in, last, 1, 1, 1, sync));
    features = register_module("features", f);
    classifier = register_module("classifier",
                                 torch::nn::Sequential(torch::nn::Dropout(o.dropout),
                                                       torch::nn::Linear(last, o.num_classes)));

    torch::NoGradGuard no_grad;
    for (auto& m : modules(/*include_self=*/false)) {
        if (auto* conv = m->as<torch::nn::Conv2d>()) {
            torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut);
            if (conv->bias.defined()) torch::nn::init::zeros_(conv->bias);
        } else if (auto* bn = m->as<torch::nn::BatchNorm2d>()) {
            torch::nn::init::ones_(bn->weight);
            torch::nn::init::zeros_(bn->bias);
        } else if (auto* sbn = m->as<SyncBatchNorm2d>()) {
            torch::nn::init::ones_(sbn->weight);
            torch::nn::init::zeros_(sbn->bias);
        } else if (auto* lin = m->as<torch::nn::Linear>()) {
            torch::nn::init::normal_(lin->weight, 0.0, 0.01);
            torch::nn::init::zeros_(lin->bias);
        }
    }
}

torch::Tensor MobileNetV2Impl::forward(const torch::Tensor& x) {
    auto h = features->forward(x);                        // [B, 1280, S/32, S/32]
    h = torch::adaptive_avg_pool2d(h, {1, 1}).flatten(1); // [B, 1280]
    return classifier->forward(h);                        // [B, classes]
}

std::int64_t count_parameters(const torch::nn::Module& module) {
    std::int64_t n = 0;
    for (const auto& p : module.parameters())
        if (p.requires_grad()) n += p.numel();
    return n;
}

ForwardCost mobilenet_v2_cost(const MobileNetV2Options& o, std::int64_t image_size) {
    // Spatial side after a stride-s conv with "same" padding: ceil(side / s).
    auto down = [](std::int64_t side, std::int64_t s) { return (side + s - 1) / s; };
    ForwardCost c;
    // Tensors of a layer's output size that autograd keeps for backward (measured against the
    // host tensor counter in tests/e2e/test_memory_plan.py). Conv + batch-norm + ReLU6: three:
    // the conv output (batch norm's input), the batch-norm output (the in-place ReLU6 saves its
    // input, so autograd clones it before overwriting) and the activation (the next conv's
    // input). The linear projection (conv + batch-norm, no ReLU6): two, the conv output and the
    // block's output (the next conv's input; with a residual the sum, the batch-norm output then
    // being transient).
    auto conv = [&](std::int64_t side, std::int64_t in, std::int64_t out, std::int64_t k2,
                    std::int64_t groups, std::int64_t kept) {
        c.macs += side * side * out * (in / groups) * k2;
        c.activation_elements += kept * side * side * out;
    };
    std::int64_t side = down(image_size, 2);
    std::int64_t in = make_divisible(kStemChannels * o.width_mult);
    conv(side, o.in_channels, in, 9, 1, 3); // stem
    for (const auto& s : kSettings) {
        const std::int64_t out = make_divisible(s.channels * o.width_mult);
        for (std::int64_t i = 0; i < s.repeats; ++i) {
            const std::int64_t hidden = in * s.expand;
            if (s.expand != 1) conv(side, in, hidden, 1, 1, 3); // expansion 1x1
            side = down(side, i == 0 ? s.stride : 1);
            conv(side, hidden, hidden, 9, hidden, 3); // depthwise 3x3
            conv(side, hidden, out, 1, 1, 2);         // linear projection 1x1
            in = out;
        }
    }
    const std::int64_t last = make_divisible(kLastChannels * std::max(1.0, o.width_mult));
    conv(side, in, last, 1, 1, 3);
    c.macs += last * o.num_classes; // classifier
    return c;
}

} // namespace trainscope::models
