// Byte extents of strided tensors and whether two of them share a byte: the overlap checks of
// validate_params and validate_epilogue_params. Host arithmetic only; nothing is dereferenced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "swiftqk/error.hpp"

namespace swiftqk {

/// Byte extent of a strided [rows, width] tensor: [lo, hi).
struct Extent {
  uintptr_t lo, hi, stride_bytes, row_bytes;
  int64_t rows;
};

/// No tensor can span more than this (2^50 bytes, far beyond any device memory); larger extents
/// are rejected before any arithmetic on them could wrap.
constexpr uint64_t kMaxExtentBytes = uint64_t{1} << 50;

/// The extent of rows >= 1 rows of `width` elements of `elem` bytes, `stride` elements apart.
/// Throws naming `name` (and `too_large`, what makes it so) when it spans more than
/// kMaxExtentBytes or wraps the address space.
inline Extent extent_of(const char* name, const void* p, int64_t rows, int64_t width,
                        int64_t stride, std::size_t elem,
                        const char* too_large = "tokens x stride too large") {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p);
  uint64_t span = 0, bytes = 0, end = 0;
  const bool ok = !__builtin_mul_overflow(static_cast<uint64_t>(rows - 1),
                                          static_cast<uint64_t>(stride), &span) &&
                  !__builtin_add_overflow(span, static_cast<uint64_t>(width), &span) &&
                  !__builtin_mul_overflow(span, static_cast<uint64_t>(elem), &bytes) &&
                  bytes <= kMaxExtentBytes && !__builtin_add_overflow(lo, bytes, &end);
  SWIFTQK_EXPECTS(ok, std::string(name) + " spans more than 2^50 bytes (" + too_large +
                          ") or wraps the address space");
  return {lo, static_cast<uintptr_t>(end), static_cast<uintptr_t>(stride) * elem,
          static_cast<uintptr_t>(width) * elem, rows};
}

/// True if two strided tensors share a byte. Equal strides (views of one fused buffer) are
/// compared column-wise modulo the stride; otherwise the byte ranges must not meet.
inline bool overlaps(const Extent& a, const Extent& b) {
  if (a.hi <= b.lo || b.hi <= a.lo) return false;
  if (a.stride_bytes != b.stride_bytes || a.rows < 2) return true;
  const uintptr_t s = a.stride_bytes;
  const uintptr_t d = (b.lo >= a.lo ? b.lo - a.lo : s - (a.lo - b.lo) % s) % s;
  // b's columns occupy [d, d + row_b) modulo s; a's occupy [0, row_a).
  const bool disjoint = d >= a.row_bytes && d + b.row_bytes <= s;
  return !disjoint;
}

/// True if p is a multiple of `alignment` bytes.
inline bool is_aligned(const void* p, std::size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

}  // namespace swiftqk
