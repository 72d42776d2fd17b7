// The fused kernels for __half inputs (see kernel_table.hpp).
#include "kernels/kernel_table_impl.cuh"

namespace swiftqk::detail {

KernelFn pick_kernel_f16(const KernelKey& k) { return pick_vec<__half>(k); }

}  // namespace swiftqk::detail
