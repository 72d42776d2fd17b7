// The fused kernels for __nv_fp8_e4m3 inputs (see kernel_table.hpp).
#include "kernels/kernel_table_impl.cuh"

namespace swiftqk::detail {

KernelFn pick_kernel_fp8(const KernelKey& k) { return pick_vec<__nv_fp8_e4m3>(k); }

}  // namespace swiftqk::detail
