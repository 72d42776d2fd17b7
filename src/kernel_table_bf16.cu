// The fused kernels for __nv_bfloat16 inputs (see kernel_table.hpp).
#include "kernels/kernel_table_impl.cuh"

namespace swiftqk::detail {

KernelFn pick_kernel_bf16(const KernelKey& k) { return pick_vec<__nv_bfloat16>(k); }

}  // namespace swiftqk::detail
