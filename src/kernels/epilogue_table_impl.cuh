// The instantiations of qk_epilogue_kernel for one model dtype T (epilogue_table.hpp).
#pragma once

#include "epilogue_table.hpp"
#include "kernels/qk_epilogue.cuh"

namespace swiftqk::detail {

template <typename T, typename QOut, typename CacheT, int VEC, bool kOlmo2, bool kAlone>
EpilogueFn pick_epilogue_det(const EpilogueKey& k) {
  if (k.det) {
    return k.weights_global
               ? nullptr
               : &qk_epilogue_kernel<T, QOut, CacheT, VEC, kOlmo2, kAlone, true, false>;
  }
  if constexpr (kAlone && VEC > 1) {  // the only kernels that split a token
    if (k.split) return &qk_epilogue_kernel<T, QOut, CacheT, VEC, kOlmo2, true, false, true>;
  }
  if constexpr (!kAlone) {  // the only kernels that read the weights from global memory
    if (k.weights_global) {
      return &qk_epilogue_kernel<T, QOut, CacheT, VEC, kOlmo2, false, false, false, true>;
    }
  }
  return k.split || k.weights_global
             ? nullptr
             : &qk_epilogue_kernel<T, QOut, CacheT, VEC, kOlmo2, kAlone, false, false>;
}

template <typename T, typename QOut, typename CacheT, int VEC, bool kOlmo2>
EpilogueFn pick_epilogue_alone(const EpilogueKey& k) {
  return k.alone ? pick_epilogue_det<T, QOut, CacheT, VEC, kOlmo2, true>(k)
                 : pick_epilogue_det<T, QOut, CacheT, VEC, kOlmo2, false>(k);
}

template <typename T, typename QOut, typename CacheT, int VEC>
EpilogueFn pick_epilogue_order(const EpilogueKey& k) {
  return k.olmo2 ? pick_epilogue_alone<T, QOut, CacheT, VEC, true>(k)
                 : pick_epilogue_alone<T, QOut, CacheT, VEC, false>(k);
}

template <typename T, typename QOut, typename CacheT>
EpilogueFn pick_epilogue_vec(const EpilogueKey& k) {
  return k.vector ? pick_epilogue_order<T, QOut, CacheT, 16 / sizeof(T)>(k)
                  : pick_epilogue_order<T, QOut, CacheT, 1>(k);
}

template <typename T>
EpilogueFn pick_epilogue_for(const EpilogueKey& k) {
  using F8 = __nv_fp8_e4m3;
  if (k.q_fp8) {
    return k.cache_fp8 ? pick_epilogue_vec<T, F8, F8>(k) : pick_epilogue_vec<T, F8, T>(k);
  }
  return k.cache_fp8 ? pick_epilogue_vec<T, T, F8>(k) : pick_epilogue_vec<T, T, T>(k);
}

}  // namespace swiftqk::detail
