// The fused QK epilogue kernels for __nv_bfloat16 models (see epilogue_table.hpp).
#include "kernels/epilogue_table_impl.cuh"

namespace swiftqk::detail {

EpilogueFn pick_epilogue_kernel_bf16(const EpilogueKey& k) {
  return pick_epilogue_for<__nv_bfloat16>(k);
}

}  // namespace swiftqk::detail
