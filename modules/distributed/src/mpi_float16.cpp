// MPI sum operations for float16 and bfloat16 elements (see mpi_float16.hpp).
#include "mpi_float16.hpp"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <mutex>

#include "mpi_check.hpp"

namespace trainscope::dist::detail {
namespace {

MPI_Op half_sum = MPI_OP_NULL;
MPI_Op bfloat16_sum = MPI_OP_NULL;

// MPI_User_function: inout[i] = in[i] + inout[i], each element as T (2 bytes), added in float32.
template <class T> void sum16(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
    static_assert(sizeof(T) == 2, "a 16-bit floating-point type");
    const T* a = static_cast<const T*>(in);
    T* b = static_cast<T*>(inout);
    for (int i = 0; i < *len; ++i)
        b[i] = T(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

} // namespace

void create_float16_ops() {
    static std::once_flag once;
    std::call_once(once, [] {
        // Commutative: MPI may combine the ranks' contributions in any order (it may anyway,
        // floating-point addition being not associative).
        MPI_CHECK(MPI_Op_create(&sum16<c10::Half>, /*commute=*/1, &half_sum));
        MPI_CHECK(MPI_Op_create(&sum16<c10::BFloat16>, /*commute=*/1, &bfloat16_sum));
    });
}

MPI_Op float16_sum(c10::ScalarType t) noexcept {
    return t == c10::ScalarType::Half ? half_sum : bfloat16_sum;
}

} // namespace trainscope::dist::detail
