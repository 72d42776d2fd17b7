// Hand-picked regressions of validate_params, found while fuzzing it or kept beside the fuzz
// test (test_validate_fuzz.cpp) as its documented edge cases: extents, byte strides across
// element sizes, the conservative rule, in place, and sizes that overflow.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "expect_error.hpp"
#include "swiftqk/qk_norm_params.hpp"
#include "swiftqk/types.hpp"
#include "validate_fuzz/arena.hpp"

namespace swiftqk {
namespace {

using testing::expect_error;
using validate_fuzz::Arena;
using validate_fuzz::At;

// A valid bf16 TP 2 call over the arena: Q 16 / K 16 local widths 8 / 8, dense, 4 tokens.
class ValidateRegression : public ::testing::Test {
 protected:
  void* at(int64_t off) { return arena_.At(At(off)); }
  QkNormParams Valid() {
    QkNormParams p;
    p.in_dtype = DType::kBF16;
    p.tokens = 4;
    p.q_full_width = p.k_full_width = 16;
    p.q = {at(0x1000), at(0x2000), at(0x3000), 8, 8, 8, 1.0f};
    p.k = {at(0x4000), at(0x5000), at(0x6000), 8, 8, 8, 1.0f};
    p.rstd_out = static_cast<float*>(at(0x7000));
    return p;
  }
  static ::testing::AssertionResult Rejects(const QkNormParams& p, const std::string& needle) {
    return testing::throws_error([&] { validate_params(p, 2); }, {needle});
  }

 private:
  Arena arena_;
};

// An extent ends after the last row's width, not after a whole last stride: a tensor may start
// in the padding that would follow its neighbour's last row, but not one element earlier.
TEST_F(ValidateRegression, NeighbourMayStartRightAfterTheLastRowsWidth) {
  QkNormParams p = Valid();
  p.q.out_stride = 24;                       // padded rows: q.out covers 3 * 48 + 16 bytes
  p.k.in = at(0x2000 + 3 * 24 * 2 + 8 * 2);  // right after q.out's last element
  EXPECT_NO_THROW(validate_params(p, 2));
  p.k.in = at(0x2000 + 3 * 24 * 2 + 8 * 2 - 2);  // on q.out's last element
  EXPECT_TRUE(Rejects(p, "q.out overlaps k.in"));
}

// Equal strides in BYTES are compared exactly even when the element sizes differ: fp8 Q and K
// columns of a fused buffer with the bf16 Q output written into the same buffer's V columns.
TEST_F(ValidateRegression, Fp8FusedInputWithBf16OutputInItsSpareColumns) {
  QkNormParams p = Valid();
  p.in_dtype = DType::kF8E4M3;
  p.q_full_width = p.k_full_width = 32;  // local widths 16 / 16
  const int64_t fused = 64;              // [Q 16 | K 16 | V 32] bytes per row
  p.q = {at(0x1000), at(0x1000 + 32), at(0x3000), 16, fused, fused / 2, 1.0f};
  p.k = {at(0x1000 + 16), at(0x5000), at(0x6000), 16, fused, 16, 1.0f};
  EXPECT_NO_THROW(validate_params(p, 2));  // q.out fills bytes [32, 64) of every row exactly
  p.q.out = at(0x1000 + 30);               // one bf16 element into K's columns
  EXPECT_TRUE(Rejects(p, "q.out overlaps k.in"));
  p.q.out = at(0x1000 + 32 + 2);  // one element later: its last spills into the next row's Q
  EXPECT_TRUE(Rejects(p, "q.out partly overlaps q.in"));
}

// The documented conservative rule: a weight lying wholly in the padding between two rows of
// an output shares no byte with it, but the strides differ and the address ranges meet, so the
// call is rejected. The fuzz oracle models this; if validate.cpp becomes exact, flip both.
TEST_F(ValidateRegression, WeightInAnOutputsRowPaddingIsRejectedConservatively) {
  QkNormParams p = Valid();
  p.q.out_stride = 32;           // rows of 16 bytes, 64 bytes apart
  p.k.weight = at(0x2000 + 16);  // bytes [16, 32) of q.out's first row gap
  EXPECT_TRUE(Rejects(p, "an output overlaps a weight"));
  p.k.weight = at(0x2000 + 3 * 64 + 16);  // just after q.out's last row: fine
  EXPECT_NO_THROW(validate_params(p, 2));
}

// In place needs the same stride even when there is one row (so the bytes are the same): the
// brief's rule and validate.cpp agree on rejecting it.
TEST_F(ValidateRegression, OneRowInPlaceWithAnotherStrideIsRejected) {
  QkNormParams p = Valid();
  p.tokens = 1;
  p.q.out = const_cast<void*>(p.q.in);
  p.q.out_stride = 16;
  EXPECT_TRUE(Rejects(p, "q.out partly overlaps q.in"));
  p.q.out_stride = p.q.in_stride;
  EXPECT_NO_THROW(validate_params(p, 2));
}

// Regression (found while fuzzing): extent_of computed a tensor's end in wrapping uintptr_t
// arithmetic, so a tensor whose rows wrap the address space passed the overlap checks: here
// q.out's second row is at q.out + (2^63 - 16) * 2 bytes == q.out - 32 (mod 2^64) == k.in.
TEST_F(ValidateRegression, ExtentsThatWrapTheAddressSpaceAreRejected) {
  QkNormParams p = Valid();
  p.tokens = 2;
  p.q.out = at(0x4000 + 32);
  p.q.out_stride = std::numeric_limits<int64_t>::max() - 15;
  expect_error([&] { validate_params(p, 2); }, "q.out spans more than 2^50 bytes");
  p = Valid();
  p.rstd_out = nullptr;
  p.tokens = int64_t{1} << 62;
  expect_error([&] { validate_params(p, 2); }, "spans more than 2^50 bytes");
}

// Regression: with rstd_out set and tokens > INT64_MAX / 2, `2 * p.tokens` was signed overflow
// (undefined behaviour, reported by UBSan).
TEST_F(ValidateRegression, HugeTokensWithRstdOutAreRejectedWithoutOverflow) {
  QkNormParams p = Valid();
  p.tokens = (int64_t{1} << 62) + 1;
  expect_error([&] { validate_params(p, 2); }, "spans more than 2^50 bytes");
}

}  // namespace
}  // namespace swiftqk
