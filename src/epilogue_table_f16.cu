// The fused QK epilogue kernels for __half models (see epilogue_table.hpp).
#include "kernels/epilogue_table_impl.cuh"

namespace swiftqk::detail {

EpilogueFn pick_epilogue_kernel_f16(const EpilogueKey& k) { return pick_epilogue_for<__half>(k); }

}  // namespace swiftqk::detail
