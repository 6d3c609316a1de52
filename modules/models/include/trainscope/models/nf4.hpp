// NF4 quantisation (Dettmers et al. 2023, QLoRA) as torchao's NF4Tensor that torchtune uses: blocks
// of 64 values scaled by their absmax, each value the nearest of the 16 NF4 levels, two 4-bit codes
// per byte (first element in the high nibble); the per-block scales double-quantised: their mean
// subtracted, then int8 in groups of 256 with a per-group factor 256 / (2 * absmax). About 4.13
// bits per weight. Dequantised to the compute dtype in forward and backward.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "trainscope/models/projection.hpp"

namespace trainscope::models {

// The 16 NF4 levels, ascending, from -1 to 1.
const std::array<float, 16>& nf4_levels();
// [256, 2] in `dtype` on `device`: byte -> (level of its high nibble, level of its low nibble),
// the dequantisation table. Built once per device and dtype and kept (thread-safe), so a forward
// or backward never copies it from the host again.
const torch::Tensor& nf4_byte_table(torch::Device device,
                                    torch::ScalarType dtype = torch::kFloat32);

// Codes gathered per dequantisation call: their int32 indices (4 bytes per code, 2 per weight)
// are the only transient besides the dense result.
constexpr std::int64_t kNf4DequantSliceCodes = std::int64_t{1} << 24;

constexpr std::int64_t kNf4BlockSize = 64;
constexpr std::int64_t kNf4ScalerBlockSize = 256;

// A quantised weight. numel must be a multiple of 64 and the number of blocks a multiple of 256
// (torchao's rule; otherwise core::ConfigError naming the shape).
struct Nf4Tensor {
    std::vector<std::int64_t> shape;
    torch::Tensor codes;                        // uint8 [numel / 2]
    torch::Tensor quantized_scalers;            // int8 [numel / 64]
    torch::Tensor scaler_factors;               // fp32 [numel / 64 / 256]
    float scaler_mean = 0;                      // mean of the absmax scales
    torch::ScalarType dtype = torch::kBFloat16; // dequantisation target

    static Nf4Tensor quantize(const torch::Tensor& weight, torch::ScalarType compute_dtype);
    // shape, compute dtype, on the codes' device: computed in the compute dtype as torchao's
    // NF4Tensor does (levels and block scales cast to it, one multiply per weight, in place),
    // through int32 indices in slices of kNf4DequantSliceCodes codes; no int64 index copy, no fp32
    // temporary of the weight's size. Transient beyond the result: dequant_transient_bytes().
    torch::Tensor dequantize() const;
    std::int64_t dequant_transient_bytes() const;
    std::int64_t numel() const;
    std::int64_t storage_bytes() const; // codes + scalers + factors + mean
};

// Frozen NF4 base weight; forward dequantises and multiplies (the gradient flows to x only).
class Nf4ProjectionImpl : public ProjectionImpl {
  public:
    Nf4ProjectionImpl(const torch::Tensor& weight, torch::ScalarType compute_dtype);
    torch::Tensor forward(const torch::Tensor& x) override;
    torch::Tensor dense_weight() const override { return weight.dequantize(); }
    std::string kind() const override { return "nf4"; }
    Nf4Tensor weight; // its tensors are registered as buffers "codes", "quantized_scalers", ...
};

// Replaces every plain LinearProjection inside the decoder layers (attention and MLP; not the
// embeddings, norms or head) by an Nf4Projection in compute_dtype. Returns the bytes saved.
// With a scope (projection.hpp), only the projections in it.
std::int64_t quantize_nf4(torch::nn::Module& model, torch::ScalarType compute_dtype,
                          const NameScope& scope = {});

} // namespace trainscope::models
