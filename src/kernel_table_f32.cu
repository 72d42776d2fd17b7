// The fused kernels for float inputs (see kernel_table.hpp).
#include "kernels/kernel_table_impl.cuh"

namespace swiftqk::detail {

KernelFn pick_kernel_f32(const KernelKey& k) { return pick_vec<float>(k); }

}  // namespace swiftqk::detail
