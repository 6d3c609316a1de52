// NF4 quantisation with double-quantised block scales (torchao's NF4Tensor layout).
#include "trainscope/models/nf4.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>
#include <string>

#include "trainscope/core/error.hpp"

namespace trainscope::models {

const std::array<float, 16>& nf4_levels() {
    static const std::array<float, 16> levels{-1.0f,
                                              -0.6961928009986877f,
                                              -0.5250730514526367f,
                                              -0.39491748809814453f,
                                              -0.28444138169288635f,
                                              -0.18477343022823334f,
                                              -0.09105003625154495f,
                                              0.0f,
                                              0.07958029955625534f,
                                              0.16093020141124725f,
                                              0.24611230194568634f,
                                              0.33791524171829224f,
                                              0.44070982933044434f,
                                              0.5626170039176941f,
                                              0.7229568362236023f,
                                              1.0f};
    return levels;
}

namespace {

torch::Tensor levels_tensor(torch::Device device) {
    const auto& l = nf4_levels();
    return torch::tensor(std::vector<float>(l.begin(), l.end()),
                         torch::TensorOptions().dtype(torch::kFloat32))
        .to(device);
}

} // namespace

const torch::Tensor& nf4_byte_table(torch::Device device, torch::ScalarType dtype) {
    // Built from host memory once per device: on a GPU each build is a pageable host-to-device
    // copy that synchronises the host, which every projection's dequantisation used to pay. The
    // map is never destroyed (its CUDA tensors must not be freed after the driver shut down).
    static std::mutex mutex;
    static auto* tables = new std::map<std::string, torch::Tensor>();
    std::lock_guard<std::mutex> lock(mutex);
    torch::Tensor& table = (*tables)[device.str() + "/" + c10::toString(dtype)];
    if (!table.defined()) {
        torch::NoGradGuard no_grad;
        const torch::Tensor levels = levels_tensor(device); // [16]
        const torch::Tensor byte =
            torch::arange(256, torch::TensorOptions().dtype(torch::kLong).device(device));
        table = torch::stack({levels.index({byte.bitwise_right_shift(4)}),
                              levels.index({byte.bitwise_and(15)})},
                             1)
                    .to(dtype); // [256, 2]
    }
    return table;
}

std::int64_t Nf4Tensor::numel() const {
    std::int64_t n = 1;
    for (auto d : shape)
        n *= d;
    return n;
}

std::int64_t Nf4Tensor::storage_bytes() const {
    return codes.nbytes() + quantized_scalers.nbytes() + scaler_factors.nbytes() + 4;
}

Nf4Tensor Nf4Tensor::quantize(const torch::Tensor& weight, torch::ScalarType compute_dtype) {
    const std::int64_t n = weight.numel();
    if (n % kNf4BlockSize != 0 || (n / kNf4BlockSize) % kNf4ScalerBlockSize != 0) {
        std::ostringstream s;
        s << "NF4 needs a weight whose element count is a multiple of " << kNf4BlockSize << " x "
          << kNf4ScalerBlockSize << " = " << kNf4BlockSize * kNf4ScalerBlockSize
          << " (blocks of 64 values, scales double-quantised in groups of 256); shape "
          << weight.sizes() << " has " << n
          << " elements: use llm.method=lora for this model, or a larger model";
        throw core::ConfigError(s.str());
    }
    torch::NoGradGuard no_grad;
    Nf4Tensor t;
    t.shape = weight.sizes().vec();
    t.dtype = compute_dtype;
    const torch::Tensor x = weight.detach().to(torch::kFloat32).reshape({-1, kNf4BlockSize});
    // Block absmax, the value -> nearest level (on the original, not double-quantised, scale).
    const torch::Tensor absmax = x.abs().amax(1); // [blocks]
    const torch::Tensor scaled = x / absmax.clamp_min(1e-30).unsqueeze(1);
    // Nearest level through the 15 midpoints between adjacent levels (bucketize), without a
    // [numel, 16] distance tensor; a value exactly on a midpoint goes to the lower level, as the
    // first minimum of |x - level| would.
    const torch::Tensor levels = levels_tensor(x.device());
    const torch::Tensor mid = (levels.narrow(0, 0, 15) + levels.narrow(0, 1, 15)) / 2;
    const torch::Tensor idx =
        torch::bucketize(scaled.contiguous(), mid).to(torch::kUInt8).reshape({-1, 2});
    // Two codes per byte, the first element in the high nibble.
    t.codes = idx.select(1, 0).bitwise_left_shift(4).bitwise_or(idx.select(1, 1)).contiguous();
    // Double quantisation of the block scales: minus their mean, int8 per group of 256 with the
    // factor 256 / (2 absmax of the group).
    const torch::Tensor mean = absmax.mean();
    t.scaler_mean = mean.item<float>();
    const torch::Tensor centered = (absmax - mean).reshape({-1, kNf4ScalerBlockSize});
    const torch::Tensor group_absmax =
        centered.abs().amax(1).clamp_min(std::numeric_limits<float>::epsilon());
    t.scaler_factors = (256.0 / (2.0 * group_absmax)).contiguous();
    t.quantized_scalers = (centered * t.scaler_factors.unsqueeze(1))
                              .round()
                              .clamp(-128, 127)
                              .to(torch::kInt8)
                              .reshape({-1})
                              .contiguous();
    return t;
}

torch::Tensor Nf4Tensor::dequantize() const {
    torch::NoGradGuard no_grad;
    // The block scales ([blocks, 1], numel / 64 of them) in fp32, then in the compute dtype.
    const torch::Tensor scalers =
        (quantized_scalers.to(torch::kFloat32).reshape({-1, kNf4ScalerBlockSize}) /
             scaler_factors.unsqueeze(1) +
         scaler_mean)
            .reshape({-1, 1})
            .to(dtype);
    // A 256-entry table byte -> (level of the high nibble, level of the low nibble) in the compute
    // dtype: one gather per byte, written straight into the result.
    const torch::Tensor& table = nf4_byte_table(codes.device(), dtype); // [256, 2]
    const std::int64_t n = codes.numel();
    torch::Tensor values = torch::empty({n, 2}, table.options());
    for (std::int64_t b = 0; b < n; b += kNf4DequantSliceCodes) {
        const std::int64_t len = std::min(kNf4DequantSliceCodes, n - b);
        torch::Tensor out = values.narrow(0, b, len);
        torch::index_select_out(out, table, 0, codes.narrow(0, b, len).to(torch::kInt32));
    }
    values = values.view({-1, kNf4BlockSize});
    values.mul_(scalers);
    return values.view(shape);
}

std::int64_t Nf4Tensor::dequant_transient_bytes() const {
    return std::min(kNf4DequantSliceCodes, codes.numel()) * 4 + quantized_scalers.numel() * 8;
}

namespace {

// linear(x, dequantize(W)) whose backward dequantises again (the dense weight is not kept).
struct LinearNf4 : torch::autograd::Function<LinearNf4> {
    static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                                 const Nf4Tensor* w) {
        ctx->saved_data["w"] = reinterpret_cast<std::int64_t>(w);
        return torch::nn::functional::linear(x, w->dequantize());
    }
    static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::tensor_list grads) {
        const auto* w = reinterpret_cast<const Nf4Tensor*>(ctx->saved_data["w"].toInt());
        // Autocast is off in backward: under fp16/bf16-mixed the forward's linear ran in the
        // autocast dtype, so the incoming gradient has it and the weight must match it (autograd
        // casts the result to x's dtype).
        const torch::Tensor& g = grads[0];
        return {torch::matmul(g, w->dequantize().to(g.scalar_type())), torch::Tensor()};
    }
};

} // namespace

Nf4ProjectionImpl::Nf4ProjectionImpl(const torch::Tensor& w, torch::ScalarType compute_dtype)
    : ProjectionImpl(w.size(1), w.size(0)), weight(Nf4Tensor::quantize(w, compute_dtype)) {
    weight.codes = register_buffer("codes", weight.codes);
    weight.quantized_scalers = register_buffer("quantized_scalers", weight.quantized_scalers);
    weight.scaler_factors = register_buffer("scaler_factors", weight.scaler_factors);
}

torch::Tensor Nf4ProjectionImpl::forward(const torch::Tensor& x) {
    return LinearNf4::apply(x, &weight);
}

std::int64_t quantize_nf4(torch::nn::Module& model, torch::ScalarType compute_dtype,
                          const NameScope& scope) {
    std::int64_t saved = 0;
    for_each_projection(model, [&](torch::nn::Module& parent, const std::string& child,
                                   const std::string& full, std::shared_ptr<ProjectionImpl> p) {
        if (full.rfind("layers.", 0) != 0) return; // embeddings, norms and head stay dense
        if (!in_scope(scope, full)) return;
        auto lin = std::dynamic_pointer_cast<LinearProjectionImpl>(p);
        if (!lin) return;
        auto q = std::make_shared<Nf4ProjectionImpl>(lin->weight, compute_dtype);
        saved += static_cast<std::int64_t>(lin->weight.nbytes()) - q->weight.storage_bytes();
        parent.replace_module(child, q);
    });
    return saved;
}

} // namespace trainscope::models
