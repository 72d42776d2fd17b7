// What one rank passes to a QK-norm launch, and the checks run on it before anything is written.
#pragma once

#include <cstdint>

#include "swiftqk/launch_tuning.hpp"
#include "swiftqk/types.hpp"

namespace swiftqk {

/// @brief One rank's local rows of Q or K: `tokens` rows of `width` elements.
/// Strides are in elements, so a shard can be a column slice of a fused QKV output.
struct ShardView {
  const void* in = nullptr;      ///< [tokens, width] with row stride in_stride, dtype in_dtype
  void* out = nullptr;           ///< [tokens, width] with row stride out_stride; may alias in
  const void* weight = nullptr;  ///< [width] local slice of the norm weight, dtype = output dtype
  int64_t width = 0;             ///< local width = full width / world size
  int64_t in_stride = 0;         ///< elements between consecutive input rows (>= width)
  int64_t out_stride = 0;        ///< elements between consecutive output rows (>= width)
  float in_scale = 1.0f;         ///< per-tensor dequantisation scale (fp8 inputs; 1 otherwise)
};

/// @brief Everything one rank's launch needs besides the communicator and the stream.
struct QkNormParams {
  ShardView q;
  ShardView k;
  int64_t tokens = 0;             ///< rows T; 0 is a valid no-op
  int64_t q_full_width = 0;       ///< Hq over all ranks (the norm's mean divides by this)
  int64_t k_full_width = 0;       ///< Hk over all ranks
  DType in_dtype = DType::kBF16;  ///< Q and K input type; output and weight are output_dtype_for
  float eps = 1e-6f;              ///< added to mean(x^2) over the FULL width
  NormOrder order = NormOrder::kOlmo2;
  float* rstd_out = nullptr;         ///< optional [tokens, 2] fp32: the 1/rms used for (q, k)
  Method method = Method::kSwiftQK;  ///< how partial sums travel (baselines for comparison)
  /// Programmatic dependent launch (ignored by the NCCL methods, and unless both the device and
  /// the code built for it are sm_90 or later):
  /// the fused kernel may be scheduled while the previous kernel on the stream is finishing,
  /// and waits for it (griddepcontrol.wait) before it reads anything; it lets the next kernel
  /// launched this way be scheduled early in turn. What it saves is launch latency between
  /// kernels. All ranks of a group launch must agree on it.
  bool pdl = false;
  /// Overrides of the tuned launch shape (stages, deferral, vectors and threads, block order);
  /// the default leaves every choice to the tuned policy. Ignored by the NCCL methods and the
  /// NCCL fallback, whose kernels have one shape. All ranks of a group launch must agree on it.
  LaunchTuning tuning;
  /// Deterministic (TP-invariant) mode: every sum of squares is taken in one canonical order
  /// (16 equal segments of each full row, each reduced in a fixed order, combined in a fixed
  /// binary tree; docs/design.md, "Deterministic mode"), so a token's output bits are the same
  /// at every TP degree in {1, 2, 4, 8, 16} that divides the widths, for any token count, batch
  /// and launch shape. Method::kSwiftQK only; the full widths must be multiples of 16 vectors of
  /// 16 bytes (128 elements for 2-byte inputs). All ranks of a group must agree on it.
  bool deterministic = false;
};

/// @brief Throws swiftqk::Error naming the first problem with p for a group of world_size ranks.
/// Checks shapes, strides, dtypes, null and misaligned pointers, eps, in/out overlap and the
/// tuning (LaunchTuning::validate).
void validate_params(const QkNormParams& p, int world_size);

/// @brief Bytes of vector each row can be moved in: 16 when every pointer, stride and width
/// allows it, else 8 when those allow that, else (1- and 2-byte types) 4 when those allow that,
/// else the element size (the scalar path). Used by planning and tests.
int vector_bytes_for(const QkNormParams& p);

}  // namespace swiftqk
