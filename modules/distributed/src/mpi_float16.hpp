// Sums of 16-bit floating-point tensors (float16, bfloat16) on the MPI backend, which has no
// element type for them: user-defined operations over MPI_UINT16_T elements that widen each pair
// to float32, add and round back to 16 bits (to nearest even), as LibTorch adds two 16-bit tensors
// on the CPU and as NCCL's 16-bit reductions round at every step. dist.compress=fp16/bf16 needs
// them so that its gradients really travel in 16 bits on the MPI backend. Internal to dist
// (mpi_communicator.cpp).
#pragma once

#include <mpi.h>

#include <c10/core/ScalarType.h>

namespace trainscope::dist::detail {

// Creates the operations once per process (MPI_Op_create). Call where no other thread can be
// inside MPI: the MPI communicator's constructor, like its MPI_Comm_dup.
void create_float16_ops();
// Whether MPI reduces `t` through these operations.
inline bool is_float16(c10::ScalarType t) noexcept {
    return t == c10::ScalarType::Half || t == c10::ScalarType::BFloat16;
}
// The sum operation for `t` (is_float16(t)); MPI_OP_NULL before create_float16_ops().
MPI_Op float16_sum(c10::ScalarType t) noexcept;

} // namespace trainscope::dist::detail
