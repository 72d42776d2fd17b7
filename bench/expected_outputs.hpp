// The expected bits of a call's outputs, kept on the device, and the comparison of each later
// call's outputs with them (bench/bitwise_compare.cu): the soak checks every call this way.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "bitwise_compare.hpp"
#include "problem.hpp"

namespace swiftqk::bench {

/// One output tensor as a call writes it: `rows` rows of `row_bytes` bytes, `stride_bytes` apart.
struct OutputView {
  void* data;
  int64_t rows, row_bytes, stride_bytes;
  int elem_bytes;
};

/// Everything one call on these ranks writes: each rank's Q and K shards (their rows, at their
/// strides) and its [tokens, 2] 1/rms pairs.
std::vector<OutputView> outputs_of(const std::vector<testing::RankData>& ranks);

/// The comparison kernel's device counters.
class CompareCounter {
 public:
  CompareCounter();  // zeroed
  CompareCounts* get() const { return buf_.get<CompareCounts>(); }
  /// Zeroes the counters on s.
  void reset(cudaStream_t s);
  /// The counters once s's work so far has run (synchronises s).
  CompareCounts read(cudaStream_t s) const;

 private:
  testing::DeviceBuffer buf_;
};

class ExpectedOutputs {
 public:
  /// Copies the bytes `outputs` hold once s's work so far has run: their expected bits.
  ExpectedOutputs(std::vector<OutputView> outputs, cudaStream_t s);
  /// Enqueues one comparison of every output with its expected bits on s (it can be captured):
  /// the differing elements are added to c, and the outputs are filled with 0xFF.
  void compare_and_poison(const CompareCounter& c, cudaStream_t s) const;
  /// Elements one comparison compares.
  int64_t elements() const { return elements_; }
  /// A copy whose expected bits differ in the last element of every output and in the first
  /// element of the first output: outputs that match these bits differ from the copy in exactly
  /// `changed` elements (the negative control of the comparison).
  ExpectedOutputs corrupted(cudaStream_t s, int64_t& changed) const;

 private:
  ExpectedOutputs() = default;
  void upload_table(cudaStream_t s);
  std::vector<testing::DeviceBuffer> expected_;
  std::vector<CompareRegion> regions_;
  testing::DeviceBuffer table_;  // regions_ on the device, which the kernel reads
  int64_t elements_ = 0, max_bytes_ = 0;
};

/// Runs the comparison on synthetic outputs of awkward shapes (rows that are not 16-byte aligned,
/// strides with gaps, partial words, 1-, 2- and 4-byte elements) after changing bytes at known
/// places, in the rows and between them. Throws unless it counts exactly the elements changed,
/// fills exactly the row bytes with 0xFF (the gaps keep their bytes), and a second comparison with
/// no write in between counts every element.
void compare_kernel_self_test(cudaStream_t s);

}  // namespace swiftqk::bench
