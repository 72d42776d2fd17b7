// The soak's check of every call: one kernel that compares a call's outputs with their expected
// bytes, counts the elements that differ into a device counter, and fills the outputs with 0xFF
// again, so that the next call on them must rewrite every byte (a call that wrote nothing would
// otherwise pass on the bytes the call before it left).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace swiftqk::bench {

/// One output a call writes: `rows` rows of `row_bytes` bytes, `stride_bytes` apart from `out`,
/// and its expected bytes, rows `expected_pitch` bytes apart from `expected` (16-byte aligned, the
/// pitch a multiple of 16). Only the row bytes are compared and refilled: the bytes between rows
/// may belong to another tensor. `row_bytes` is a multiple of `elem_bytes` (1, 2 or 4).
struct CompareRegion {
  uint8_t* out;
  const uint8_t* expected;
  int64_t rows, row_bytes, stride_bytes, expected_pitch;
  int elem_bytes;
};

/// What the kernel adds to, on the device.
struct CompareCounts {
  unsigned long long mismatches;  // elements whose bytes differ from the expected ones
  unsigned long long compares;    // launches that ran
};

/// One launch over the `count` regions of the device table `regions` (it can be captured in a
/// graph): counts->mismatches += the elements of the regions that differ from their expected
/// bytes in any bit, counts->compares += 1, and every compared byte becomes 0xFF (NaN in every
/// float type). Rows whose start is 16-byte aligned are compared in 16-byte words, the rest of a
/// row (and every row that is not aligned) an element at a time. `max_region_bytes`, the row
/// bytes of the largest region, sizes the grid.
void launch_compare_and_poison(const CompareRegion* regions, int count, int64_t max_region_bytes,
                               CompareCounts* counts, cudaStream_t stream);

}  // namespace swiftqk::bench
