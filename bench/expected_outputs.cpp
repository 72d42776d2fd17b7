#include "expected_outputs.hpp"

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <utility>

#include "cuda_check.hpp"
#include "swiftqk/error.hpp"

namespace swiftqk::bench {

using testing::DeviceBuffer;

std::vector<OutputView> outputs_of(const std::vector<testing::RankData>& ranks) {
  std::vector<OutputView> out;
  for (const testing::RankData& d : ranks) {
    const QkNormParams& p = d.params;
    if (p.tokens == 0) continue;  // nothing written
    const int os = static_cast<int>(dtype_size(output_dtype_for(p.in_dtype)));
    for (const ShardView* v : {&p.q, &p.k}) {
      // In place, the output is the next call's input: it cannot be refilled with 0xFF.
      SWIFTQK_EXPECTS(v->out != v->in, "outputs_of: in-place outputs cannot be checked this way");
      out.push_back({v->out, p.tokens, v->width * os, v->out_stride * os, os});
    }
    if (p.rstd_out != nullptr) {
      const int64_t bytes = 2 * p.tokens * static_cast<int64_t>(sizeof(float));
      out.push_back({p.rstd_out, 1, bytes, bytes, static_cast<int>(sizeof(float))});
    }
  }
  return out;
}

CompareCounter::CompareCounter() : buf_(sizeof(CompareCounts)) {
  SWIFTQK_CUDA_TRY(cudaMemset(buf_.get(), 0, sizeof(CompareCounts)));
}

void CompareCounter::reset(cudaStream_t s) {
  SWIFTQK_CUDA_TRY(cudaMemsetAsync(buf_.get(), 0, sizeof(CompareCounts), s));
}

CompareCounts CompareCounter::read(cudaStream_t s) const {
  CompareCounts c{};
  SWIFTQK_CUDA_TRY(cudaMemcpyAsync(&c, buf_.get(), sizeof c, cudaMemcpyDeviceToHost, s));
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
  return c;
}

ExpectedOutputs::ExpectedOutputs(std::vector<OutputView> outputs, cudaStream_t s) {
  for (const OutputView& v : outputs) {
    SWIFTQK_EXPECTS(v.rows >= 0 && v.row_bytes >= 0 && v.stride_bytes >= v.row_bytes &&
                        (v.elem_bytes == 1 || v.elem_bytes == 2 || v.elem_bytes == 4) &&
                        v.row_bytes % v.elem_bytes == 0,
                    "ExpectedOutputs: an output's rows do not hold whole elements");
    if (v.rows == 0 || v.row_bytes == 0) continue;
    // Rows 16 bytes apart at least, so every expected row is 16-byte aligned (cudaMalloc: 256).
    const int64_t pitch = (v.row_bytes + 15) / 16 * 16;
    DeviceBuffer e(static_cast<std::size_t>(pitch * v.rows));
    SWIFTQK_CUDA_TRY(cudaMemcpy2DAsync(e.get(), pitch, v.data, v.stride_bytes, v.row_bytes, v.rows,
                                       cudaMemcpyDeviceToDevice, s));
    regions_.push_back({static_cast<uint8_t*>(v.data), e.get(), v.rows, v.row_bytes, v.stride_bytes,
                        pitch, v.elem_bytes});
    expected_.push_back(std::move(e));
    elements_ += v.rows * (v.row_bytes / v.elem_bytes);
    max_bytes_ = std::max(max_bytes_, v.rows * v.row_bytes);
  }
  upload_table(s);
}

void ExpectedOutputs::upload_table(cudaStream_t s) {
  table_ = DeviceBuffer(regions_.size() * sizeof(CompareRegion));
  if (!regions_.empty()) {
    // On s, and waited for: a copy from pageable memory on another stream would not be ordered
    // before the launches on s, and regions_ must outlive it.
    SWIFTQK_CUDA_TRY(
        cudaMemcpyAsync(table_.get(), regions_.data(), table_.bytes(), cudaMemcpyHostToDevice, s));
  }
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
}

void ExpectedOutputs::compare_and_poison(const CompareCounter& c, cudaStream_t s) const {
  launch_compare_and_poison(table_.get<CompareRegion>(), static_cast<int>(regions_.size()),
                            max_bytes_, c.get(), s);
}

namespace {
// Flips the low bit of one device byte (synchronises s).
void flip_byte(uint8_t* p, cudaStream_t s) {
  uint8_t b = 0;
  SWIFTQK_CUDA_TRY(cudaMemcpyAsync(&b, p, 1, cudaMemcpyDeviceToHost, s));
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
  b ^= 1;
  SWIFTQK_CUDA_TRY(cudaMemcpyAsync(p, &b, 1, cudaMemcpyHostToDevice, s));
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
}
}  // namespace

ExpectedOutputs ExpectedOutputs::corrupted(cudaStream_t s, int64_t& changed) const {
  ExpectedOutputs c;
  c.elements_ = elements_;
  c.max_bytes_ = max_bytes_;
  changed = 0;
  for (std::size_t i = 0; i < regions_.size(); ++i) {
    CompareRegion r = regions_[i];
    DeviceBuffer e(expected_[i].bytes());
    SWIFTQK_CUDA_TRY(
        cudaMemcpyAsync(e.get(), expected_[i].get(), e.bytes(), cudaMemcpyDeviceToDevice, s));
    // The last byte of the last element: in a whole word or among a row's loose elements.
    flip_byte(e.get() + (r.rows - 1) * r.expected_pitch + r.row_bytes - 1, s);
    ++changed;
    if (i == 0 && r.rows * r.row_bytes > r.elem_bytes) {
      flip_byte(e.get(), s);  // the first element, another one
      ++changed;
    }
    r.expected = e.get();
    c.regions_.push_back(r);
    c.expected_.push_back(std::move(e));
  }
  c.upload_table(s);
  return c;
}

void compare_kernel_self_test(cudaStream_t s) {
  struct Shape {
    int64_t offset, rows, row_bytes, stride_bytes;
    int elem_bytes;
  };
  const std::vector<Shape> shapes = {
      {0, 5, 512, 768, 2},          // aligned rows with 256-byte gaps: whole words only
      {4096, 7, 40, 48, 2},         // two words and 4 loose elements a row
      {8192 + 6, 9, 24, 30, 2},     // rows that are not 16-byte aligned: every element loose
      {12288, 1, 8, 8, 4},          // less than a word (one token's 1/rms pair)
      {16384, 3, 35, 64, 1},        // 1-byte elements, two words and 3 loose a row
      {20480 + 4, 3, 100, 100, 4},  // 4-byte elements from a start 4 bytes past alignment
  };
  const std::size_t bytes = 24576;
  std::mt19937 rng(20260);
  std::vector<uint8_t> original(bytes);
  for (auto& b : original) b = static_cast<uint8_t>(rng());
  DeviceBuffer buf(bytes);
  SWIFTQK_CUDA_TRY(cudaMemcpyAsync(buf.get(), original.data(), bytes, cudaMemcpyHostToDevice, s));
  std::vector<OutputView> views;
  for (const Shape& sh : shapes) {
    views.push_back({buf.get() + sh.offset, sh.rows, sh.row_bytes, sh.stride_bytes, sh.elem_bytes});
  }
  const ExpectedOutputs expected(views, s);

  // Bytes changed: the first two of the first row (one element at 2 and 4 bytes), the last of the
  // last row, the byte after each row's end (a gap, or the next row's first), and random ones.
  std::vector<uint8_t> changed = original;
  for (const Shape& sh : shapes) {
    const int64_t last = sh.offset + (sh.rows - 1) * sh.stride_bytes + sh.row_bytes - 1;
    for (int64_t at : {sh.offset, sh.offset + 1, last, last + 1}) changed[at] ^= 0x5a;
  }
  for (int i = 0; i < 48; ++i) changed[rng() % bytes] ^= static_cast<uint8_t>(1 + rng() % 255);
  SWIFTQK_CUDA_TRY(cudaMemcpyAsync(buf.get(), changed.data(), bytes, cudaMemcpyHostToDevice, s));

  // What the kernel must find: the elements that differ, and those not 0xFF in every byte.
  std::vector<char> in_rows(bytes, 0);
  int64_t differ = 0, not_poison = 0;
  for (const Shape& sh : shapes) {
    for (int64_t row = 0; row < sh.rows; ++row) {
      for (int64_t j = 0; j < sh.row_bytes; j += sh.elem_bytes) {
        const int64_t at = sh.offset + row * sh.stride_bytes + j;
        bool d = false, p = true;
        for (int b = 0; b < sh.elem_bytes; ++b) {
          d |= changed[at + b] != original[at + b];
          p &= original[at + b] == 0xff;
          in_rows[at + b] = 1;
        }
        differ += d;
        not_poison += !p;
      }
    }
  }
  CompareCounter counter;
  expected.compare_and_poison(counter, s);
  const CompareCounts first = counter.read(s);
  std::vector<uint8_t> after(bytes);
  SWIFTQK_CUDA_TRY(cudaMemcpyAsync(after.data(), buf.get(), bytes, cudaMemcpyDeviceToHost, s));
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
  int64_t misfilled = 0;
  for (std::size_t i = 0; i < bytes; ++i) misfilled += after[i] != (in_rows[i] ? 0xff : changed[i]);
  counter.reset(s);
  expected.compare_and_poison(counter, s);
  const CompareCounts second = counter.read(s);
  SWIFTQK_EXPECTS(
      first.compares == 1 && static_cast<int64_t>(first.mismatches) == differ && differ > 0,
      "compare kernel self-test: it counted " + std::to_string(first.mismatches) + " of the " +
          std::to_string(differ) + " elements changed");
  SWIFTQK_EXPECTS(misfilled == 0, "compare kernel self-test: " + std::to_string(misfilled) +
                                      " bytes are not what the refill must leave (0xFF in the "
                                      "rows, the gaps untouched)");
  SWIFTQK_EXPECTS(static_cast<int64_t>(second.mismatches) == not_poison,
                  "compare kernel self-test: with no write since the refill it counted " +
                      std::to_string(second.mismatches) + " of " + std::to_string(not_poison) +
                      " elements");
  std::printf(
      "compare kernel self-test: %lld of %lld elements changed counted, the refill exact, "
      "%lld of %lld counted with no write: ok\n",
      static_cast<long long>(first.mismatches), static_cast<long long>(expected.elements()),
      static_cast<long long>(second.mismatches), static_cast<long long>(not_poison));
}

}  // namespace swiftqk::bench
