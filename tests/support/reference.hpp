// Host-only float64 reference for layerwise RMSNorm, bit-exact dtype conversions and error
// metrics. Tests compare kernel output against rms_norm_fp64 within relative_tolerance.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "swiftqk/types.hpp"

namespace swiftqk {
namespace ref {

// Conversions match CUDA's round-to-nearest-even intrinsics bit for bit (__float2bfloat16_rn,
// __float2half_rn, __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)). NaN maps to a NaN.
uint16_t float_to_bf16_bits(float v);
float bf16_bits_to_float(uint16_t bits);
/// @brief IEEE binary16: RNE, subnormals, overflow to +-inf.
uint16_t float_to_f16_bits(float v);
float f16_bits_to_float(uint16_t bits);
/// @brief OCP E4M3 "fn": max 448, no inf, NaN = 0x7f/0xff. Saturating: |v| > 448 and +-inf
/// give +-448.
uint8_t float_to_e4m3_bits(float v);
float e4m3_bits_to_float(uint8_t bits);

/// @brief v rounded to t and back to float (identity for f32).
float round_to(DType t, float v);

/// @brief Element `index` of a buffer of type t, widened to double.
double load_element(const void* base, DType t, std::size_t index);
/// @brief Stores value as double -> float -> t (RNE; saturating for fp8).
void store_element(void* base, DType t, std::size_t index, double value);

/// @brief The per-tensor dequantisation scale of n values stored as t: amax / 448 for fp8 (the
/// largest magnitude then stores as 448, the top of the e4m3 grid), 1 for the other types.
float input_scale(DType t, const float* v, std::size_t n);

/// @brief Elements [begin, end) of v stored as t: v[i] / scale rounded to t (RNE, saturating for
/// fp8) into the raw buffer, and the value stored times the scale (the dequantised input, exact in
/// double) into stored[i]. Callers may split the range across threads and get the same bits.
void quantise(const float* v, DType t, float scale, std::size_t begin, std::size_t end, void* raw,
              double* stored);

/// @brief Gold reference in double: y = w * x / sqrt(mean(x^2) + eps) per row of x
/// [tokens, width] (row-major); w has `width` entries.
std::vector<double> rms_norm_fp64(const std::vector<double>& x, const std::vector<double>& w,
                                  int64_t tokens, int64_t width, double eps);

/// @brief rms_norm_fp64 of rows [row_begin, row_end) of x into the same rows of y (x and y
/// [rows, width] row-major, w [width]). Each row is computed exactly as rms_norm_fp64 computes
/// it (which is this over every row), so callers may split the rows across threads and get the
/// same bits.
void rms_norm_fp64_rows(const double* x, const double* w, int64_t width, double eps,
                        int64_t row_begin, int64_t row_end, double* y);

/// @brief What a correct fp32 kernel writes, rounded to `out` (f32, f16 or bf16).
std::vector<double> rms_norm_emulated(const std::vector<double>& x, const std::vector<double>& w,
                                      int64_t tokens, int64_t width, double eps, NormOrder order,
                                      DType out);

/// @brief Sum of squares the way `world` ranks compute it: fp32 partials over equal contiguous
/// shards, combined in fp32 in rank order. Throws if width % world != 0.
double sum_of_squares_sharded(const double* row, int64_t width, int world);

/// @brief The deterministic mode's fp32 sum of squares of one full row (plan.hpp,
/// kCanonicalSegments): `width` input values as floats (before any dequantisation scale), in
/// vectors of vec_elems, each segment's sum multiplied by `scale` twice. Bit for bit what the
/// kernel computes at every TP degree. Throws unless width is a multiple of 16 vectors.
float canonical_sum_of_squares(const float* row, int64_t width, int vec_elems, float scale);

/// @brief The same sum taken the way `world` ranks take it: each rank's segments in a pairwise
/// tree, then the ranks' partials in a butterfly over the ranks (the kernel's two steps). Equal
/// to canonical_sum_of_squares for every world in {1, 2, 4, 8, 16}; a check of the tree's split.
float canonical_sum_of_squares_ranks(const float* row, int64_t width, int vec_elems, float scale,
                                     int world);

struct ErrorMetrics {
  double max_abs = 0, mean_abs = 0, rmse = 0;
  int64_t count = 0;      // elements compared
  int64_t nonfinite = 0;  // got is NaN/inf where ref is finite, or they disagree on NaN/inf
  int64_t worst_index = -1;
};

/// @brief Error of got against ref. Any nonfinite mismatch sets max_abs = +inf; mean_abs and rmse
/// average the finite pairs only so they stay informative.
ErrorMetrics compare(const std::vector<double>& got, const std::vector<double>& ref);

/// @brief The metrics of disjoint sets pooled into those of their union: the largest max_abs, the
/// count-weighted mean_abs and mean square (rmse), the counts summed. worst_index is -1: the
/// parts index different arrays.
ErrorMetrics pool(const std::vector<ErrorMetrics>& parts);

/// @brief Bound `rel` for |got - gold| <= rel * max(|gold|, absolute_floor(out)).
double relative_tolerance(DType out, NormOrder order);
/// @brief Magnitude below which the bound stops shrinking (subnormal outputs).
double absolute_floor(DType out);
/// @brief Number of elements with |got - gold| > relative_tolerance * max(|gold|, floor), or
/// non-finite where gold is finite.
int64_t count_out_of_tolerance(const std::vector<double>& got, const std::vector<double>& gold,
                               DType out, NormOrder order);

}  // namespace ref
}  // namespace swiftqk
