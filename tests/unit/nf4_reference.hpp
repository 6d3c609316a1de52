// The NF4 dequantisation as trainscope did it before issue 36 (int64 indices, the fp32 byte table,
// an fp32 product, then the cast to the compute dtype): the oracle of the NF4 test and the
// baseline of scripts/bench nf4.
#pragma once

#include <torch/torch.h>

#include "trainscope/models/nf4.hpp"

namespace trainscope::testing {

inline torch::Tensor nf4_dequantize_fp32_path(const models::Nf4Tensor& q) {
    torch::NoGradGuard no_grad;
    const torch::Tensor scalers =
        (q.quantized_scalers.to(torch::kFloat32).reshape({-1, models::kNf4ScalerBlockSize}) /
             q.scaler_factors.unsqueeze(1) +
         q.scaler_mean)
            .reshape({-1, 1});
    return (models::nf4_byte_table(torch::kCPU)
                .index_select(0, q.codes.to(torch::kLong))
                .view({-1, models::kNf4BlockSize}) *
            scalers)
        .reshape(q.shape)
        .to(q.dtype);
}

} // namespace trainscope::testing
