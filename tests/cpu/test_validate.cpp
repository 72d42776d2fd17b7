// Tests for validate_params and vector_bytes_for. The pointers point into a host arena but are
// never dereferenced: validation only looks at addresses, strides and sizes.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "swiftqk/comm_config.hpp"
#include "swiftqk/error.hpp"
#include "swiftqk/qk_norm_params.hpp"
#include "swiftqk/types.hpp"

namespace swiftqk {
namespace {

using testing::expect_error;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// TP 2 of Q 4096 / K 1024: local widths 2048 / 512; a fused QKV row holds Hq/N + 2 Hk/N.
constexpr int kTp = 2;
constexpr int64_t kTokens = 64;
constexpr int64_t kQFull = 4096, kKFull = 1024;
constexpr int64_t kQw = kQFull / kTp, kKw = kKFull / kTp;
constexpr int64_t kFusedStride = kQw + 2 * kKw;  // 3072 elements

// Byte offsets of the tensors inside the arena; all 4 KiB aligned.
constexpr std::size_t kQIn = 0x000000;  // 64 x 2048 x 4 B at most (f32)
constexpr std::size_t kKIn = 0x080000;
constexpr std::size_t kQOut = 0x100000;
constexpr std::size_t kKOut = 0x180000;
constexpr std::size_t kQW = 0x200000;
constexpr std::size_t kKW = 0x204000;
constexpr std::size_t kRstd = 0x208000;
constexpr std::size_t kFused1 = 0x300000;  // 64 x 3072 x 2 B = 0x60000
constexpr std::size_t kFused2 = 0x380000;
constexpr std::size_t kArenaBytes = 0x400000;

class ValidateTest : public ::testing::Test {
 protected:
  ValidateTest() : arena_(kArenaBytes + 256) {
    const uintptr_t raw = reinterpret_cast<uintptr_t>(arena_.data());
    base_ = arena_.data() + ((256 - raw % 256) % 256);  // 256-byte aligned, still in the arena
  }

  uint8_t* at(std::size_t offset) { return base_ + offset; }

  // A valid bf16, TP 2, out-of-place call; each test breaks one thing.
  QkNormParams Valid(DType in = DType::kBF16) {
    QkNormParams p;
    p.in_dtype = in;
    p.tokens = kTokens;
    p.q_full_width = kQFull;
    p.k_full_width = kKFull;
    p.eps = 1e-6f;
    p.order = NormOrder::kOlmo2;
    p.q = {at(kQIn), at(kQOut), at(kQW), kQw, kQw, kQw, 1.0f};
    p.k = {at(kKIn), at(kKOut), at(kKW), kKw, kKw, kKw, 1.0f};
    p.rstd_out = reinterpret_cast<float*>(at(kRstd));
    return p;
  }

  // Q and K as column views of one fused [T, Hq/N + 2 Hk/N] buffer, normalised in place.
  QkNormParams FusedInPlace() {
    QkNormParams p = Valid();
    const std::size_t es = 2;  // bf16
    p.q = {at(kFused1), at(kFused1), at(kQW), kQw, kFusedStride, kFusedStride, 1.0f};
    p.k = {at(kFused1 + kQw * es), at(kFused1 + kQw * es), at(kKW), kKw,
           kFusedStride,           kFusedStride,           1.0f};
    return p;
  }

  ::testing::AssertionResult Rejects(const QkNormParams& p, const std::string& needle,
                                     int world = kTp) {
    return testing::throws_error([&] { validate_params(p, world); }, {needle});
  }

 private:
  std::vector<uint8_t> arena_;
  uint8_t* base_ = nullptr;
};

// ---------------------------------------------------------------- valid calls

TEST_F(ValidateTest, ValidBaseline) {
  EXPECT_NO_THROW(validate_params(Valid(), kTp));
  QkNormParams p = Valid();
  p.rstd_out = nullptr;
  EXPECT_NO_THROW(validate_params(p, kTp));
  p.order = NormOrder::kLlama;
  EXPECT_NO_THROW(validate_params(p, kTp));
  EXPECT_NO_THROW(validate_params(Valid(DType::kF32), kTp));
  EXPECT_NO_THROW(validate_params(Valid(DType::kF16), kTp));
}

TEST_F(ValidateTest, ZeroTokensWithNullPointersIsFine) {
  QkNormParams p = Valid();
  p.tokens = 0;
  p.q.in = p.k.in = nullptr;
  p.q.out = p.k.out = nullptr;
  p.q.weight = p.k.weight = nullptr;
  p.rstd_out = nullptr;
  EXPECT_NO_THROW(validate_params(p, kTp));
}

TEST_F(ValidateTest, InPlaceIsFine) {
  QkNormParams p = Valid();
  p.q.out = const_cast<void*>(p.q.in);
  p.k.out = const_cast<void*>(p.k.in);
  EXPECT_NO_THROW(validate_params(p, kTp));
  p.q.in_stride = p.q.out_stride = kQw + 64;  // padded rows, still the same view
  EXPECT_NO_THROW(validate_params(p, kTp));
}

TEST_F(ValidateTest, FusedQkvColumnViewsInPlaceAreFine) {
  EXPECT_NO_THROW(validate_params(FusedInPlace(), kTp));
  QkNormParams p = FusedInPlace();
  p.tokens = 1;
  EXPECT_NO_THROW(validate_params(p, kTp));
  p.tokens = 2;
  EXPECT_NO_THROW(validate_params(p, kTp));
}

TEST_F(ValidateTest, FusedQkvOutOfPlaceIntoASecondFusedBufferIsFine) {
  QkNormParams p = FusedInPlace();
  const std::size_t es = 2;
  p.q.out = at(kFused2);
  p.k.out = at(kFused2 + kQw * es);
  EXPECT_NO_THROW(validate_params(p, kTp));
  // Output into a plain buffer from fused input, too.
  p.q.out = at(kQOut);
  p.q.out_stride = kQw;
  EXPECT_NO_THROW(validate_params(p, kTp));
}

TEST_F(ValidateTest, Fp8InputWithBf16OutputAndScaleIsFine) {
  QkNormParams p = Valid(DType::kF8E4M3);
  p.q.in_scale = 0.5f;
  p.k.in_scale = 0.5f;
  EXPECT_NO_THROW(validate_params(p, kTp));
  // An fp8 input needs only byte alignment.
  p.q.in = at(kQIn + 1);
  EXPECT_NO_THROW(validate_params(p, kTp));
}

// ---------------------------------------------------------------- bad shapes and strides

TEST_F(ValidateTest, FullWidthNotDivisibleByTp) {
  QkNormParams p = Valid();
  p.q_full_width = 4097;
  EXPECT_TRUE(Rejects(p, "q_full_width 4097 is not divisible by the TP degree 2"));
  p = Valid();
  p.k_full_width = 1025;
  EXPECT_TRUE(Rejects(p, "k_full_width 1025 is not divisible by the TP degree 2"));
  EXPECT_TRUE(Rejects(Valid(), "not divisible by the TP degree 3", 3));
}

TEST_F(ValidateTest, ShardWidthMismatch) {
  QkNormParams p = Valid();
  p.q.width = kQFull;  // the full width instead of the local one
  p.q.in_stride = p.q.out_stride = kQFull;
  EXPECT_TRUE(Rejects(p, "q.width is 4096 but q_full_width / TP = 2048"));
  p = Valid();
  p.k.width = kKw - 8;
  EXPECT_TRUE(Rejects(p, "k.width is 504"));
  // The same params are right for TP 2 and wrong for TP 4.
  EXPECT_TRUE(Rejects(Valid(), "q.width is 2048 but q_full_width / TP = 1024", 4));
}

TEST_F(ValidateTest, NonPositiveFullWidth) {
  QkNormParams p = Valid();
  p.k_full_width = 0;
  p.k.width = 0;
  EXPECT_TRUE(Rejects(p, "k_full_width must be positive"));
  p = Valid();
  p.q_full_width = -4096;
  EXPECT_TRUE(Rejects(p, "q_full_width must be positive"));
}

TEST_F(ValidateTest, InStrideSmallerThanWidth) {
  QkNormParams p = Valid();
  p.q.in_stride = kQw - 1;
  EXPECT_TRUE(Rejects(p, "q.in_stride 2047 is smaller than the width 2048"));
  p = Valid();
  p.k.in_stride = 0;
  EXPECT_TRUE(Rejects(p, "k.in_stride 0 is smaller"));
}

TEST_F(ValidateTest, OutStrideSmallerThanWidth) {
  QkNormParams p = Valid();
  p.k.out_stride = kKw - 1;
  EXPECT_TRUE(Rejects(p, "k.out_stride 511 is smaller than the width 512"));
  p = Valid();
  p.q.out_stride = -kQw;
  EXPECT_TRUE(Rejects(p, "q.out_stride"));
}

// ---------------------------------------------------------------- null and misaligned pointers

TEST_F(ValidateTest, NullPointers) {
  QkNormParams p = Valid();
  p.q.in = nullptr;
  EXPECT_TRUE(Rejects(p, "q.in is null"));
  p = Valid();
  p.k.in = nullptr;
  EXPECT_TRUE(Rejects(p, "k.in is null"));
  p = Valid();
  p.q.out = nullptr;
  EXPECT_TRUE(Rejects(p, "q.out is null"));
  p = Valid();
  p.k.out = nullptr;
  EXPECT_TRUE(Rejects(p, "k.out is null"));
  p = Valid();
  p.q.weight = nullptr;
  EXPECT_TRUE(Rejects(p, "q.weight is null"));
  p = Valid();
  p.k.weight = nullptr;
  EXPECT_TRUE(Rejects(p, "k.weight is null"));
}

TEST_F(ValidateTest, MisalignedPointers) {
  QkNormParams p = Valid();
  p.q.in = at(kQIn + 1);
  EXPECT_TRUE(Rejects(p, "q.in is not aligned to its element size (bf16)"));
  p = Valid();
  p.k.out = at(kKOut + 3);
  EXPECT_TRUE(Rejects(p, "k.out is not aligned to its element size (bf16)"));
  p = Valid();
  p.q.weight = at(kQW + 1);
  EXPECT_TRUE(Rejects(p, "q.weight is not aligned"));
  p = Valid(DType::kF32);
  p.k.in = at(kKIn + 2);  // 2-byte aligned is not enough for f32
  EXPECT_TRUE(Rejects(p, "k.in is not aligned to its element size (f32)"));
  p = Valid(DType::kF8E4M3);
  p.q.out = at(kQOut + 1);  // fp8 output is bf16
  EXPECT_TRUE(Rejects(p, "q.out is not aligned to its element size (bf16)"));
  p = Valid();
  p.rstd_out = reinterpret_cast<float*>(at(kRstd + 2));
  EXPECT_TRUE(Rejects(p, "rstd_out is not aligned"));
}

// ---------------------------------------------------------------- scalars

TEST_F(ValidateTest, EpsMustBeFiniteAndPositive) {
  for (float eps : {0.0f, -0.0f, -1e-6f, kNaN, kInf, -kInf}) {
    QkNormParams p = Valid();
    p.eps = eps;
    EXPECT_TRUE(Rejects(p, "eps must be finite and > 0")) << eps;
  }
  QkNormParams p = Valid();
  p.eps = std::numeric_limits<float>::denorm_min();
  EXPECT_NO_THROW(validate_params(p, kTp));
}

TEST_F(ValidateTest, NegativeTokens) {
  QkNormParams p = Valid();
  p.tokens = -1;
  EXPECT_TRUE(Rejects(p, "tokens must be >= 0, got -1"));
}

TEST_F(ValidateTest, InScaleMustBeOneForNonFp8) {
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    QkNormParams p = Valid(t);
    p.q.in_scale = 0.5f;
    EXPECT_TRUE(
        Rejects(p, "q.in_scale applies to fp8 inputs only; it must be 1 for " + to_string(t)));
    p = Valid(t);
    p.k.in_scale = 2.0f;
    EXPECT_TRUE(Rejects(p, "k.in_scale applies to fp8 inputs only"));
  }
}

TEST_F(ValidateTest, InScaleMustBePositiveForFp8) {
  for (float s : {0.0f, -0.5f, kNaN, kInf}) {
    QkNormParams p = Valid(DType::kF8E4M3);
    p.k.in_scale = s;
    EXPECT_TRUE(Rejects(p, "k.in_scale must be finite and positive")) << s;
    p = Valid(DType::kF8E4M3);
    p.q.in_scale = s;
    EXPECT_TRUE(Rejects(p, "q.in_scale must be finite and positive")) << s;
  }
}

TEST_F(ValidateTest, BadTpDegree) {
  EXPECT_TRUE(Rejects(Valid(), "TP degree must be >= 1", 0));
  EXPECT_TRUE(Rejects(Valid(), "TP degree must be >= 1", -2));
}

TEST_F(ValidateTest, BadEnumValues) {
  QkNormParams p = Valid();
  p.order = static_cast<NormOrder>(2);
  EXPECT_TRUE(Rejects(p, "order must be"));
  p = Valid();
  p.in_dtype = static_cast<DType>(4);
  EXPECT_TRUE(Rejects(p, "in_dtype is not a DType"));
}

// ---------------------------------------------------------------- overlaps

TEST_F(ValidateTest, OutputShiftedOneElementFromInputIsRejected) {
  QkNormParams p = Valid();
  p.q.out = at(kQIn + 2);  // one bf16 element after q.in, same stride
  EXPECT_TRUE(Rejects(p, "q.out partly overlaps q.in"));
  p = Valid();
  p.q.out = at(kQIn + 2 * kQw * 2 - 2);  // one element before row 2
  EXPECT_TRUE(Rejects(p, "q.out partly overlaps q.in"));
  p = Valid();
  p.k.out = at(kKIn + 2);
  EXPECT_TRUE(Rejects(p, "k.out partly overlaps k.in"));
  // Same pointer, another stride: not a valid in-place call.
  p = Valid();
  p.q.out = at(kQIn);
  p.q.out_stride = kQw + 8;
  EXPECT_TRUE(Rejects(p, "q.out partly overlaps q.in"));
  // In a fused buffer, q.out shifted one element inside q's columns.
  p = FusedInPlace();
  p.q.out = at(kFused1 + 2);
  EXPECT_TRUE(Rejects(p, "q.out partly overlaps q.in"));
}

TEST_F(ValidateTest, Fp8CannotBeNormalisedInPlace) {
  QkNormParams p = Valid(DType::kF8E4M3);
  p.q.out = const_cast<void*>(p.q.in);
  EXPECT_TRUE(Rejects(p, "q.out partly overlaps q.in"));
}

TEST_F(ValidateTest, QOutOverlappingKOut) {
  QkNormParams p = Valid();
  p.k.out = at(kQOut + 4096 * 10);  // inside q.out's rows
  EXPECT_TRUE(Rejects(p, "q.out and k.out overlap"));
  p = Valid();
  p.k.out = p.q.out;
  EXPECT_TRUE(Rejects(p, "q.out and k.out overlap"));
  // Fused layout with k's columns wrapping past the row end into the next row's q columns:
  // k at column 2600 of a 3072-wide row covers [2600, 3112), i.e. q's columns [0, 40) of the
  // next row.
  p = FusedInPlace();
  p.k.in = at(kFused2);
  p.k.out = at(kFused1 + 2600 * 2);
  EXPECT_TRUE(Rejects(p, "q.out and k.out overlap"));
  // The same with the columns just fitting ([2560, 3072)) is fine.
  p.k.out = at(kFused1 + 2560 * 2);
  EXPECT_NO_THROW(validate_params(p, kTp));
}

TEST_F(ValidateTest, OutputsOverlappingOtherInputsOrWeights) {
  QkNormParams p = Valid();
  p.q.out = const_cast<void*>(p.k.in);
  p.q.out_stride = kQw;
  EXPECT_TRUE(Rejects(p, "q.out overlaps k.in"));
  p = Valid();
  p.k.out = at(kQIn + 4096);
  EXPECT_TRUE(Rejects(p, "k.out overlaps q.in"));
  p = Valid();
  p.q.weight = at(kKOut + 1024);
  EXPECT_TRUE(Rejects(p, "an output overlaps a weight"));
}

TEST_F(ValidateTest, RstdOverlappingAnOutputOrInput) {
  QkNormParams p = Valid();
  p.rstd_out = reinterpret_cast<float*>(at(kQOut + 1024));
  EXPECT_TRUE(Rejects(p, "rstd_out overlaps an input, output or weight"));
  p = Valid();
  p.rstd_out = reinterpret_cast<float*>(at(kKOut + kTokens * kKw * 2 - 4));  // last 4 bytes
  EXPECT_TRUE(Rejects(p, "rstd_out overlaps an input, output or weight"));
  p = Valid();
  p.rstd_out = reinterpret_cast<float*>(at(kKIn));
  EXPECT_TRUE(Rejects(p, "rstd_out overlaps an input, output or weight"));
  // Just past k.out's last byte is fine.
  p = Valid();
  p.rstd_out = reinterpret_cast<float*>(at(kKOut + kTokens * kKw * 2));
  EXPECT_NO_THROW(validate_params(p, kTp));
  // In the V columns of a fused buffer with the same row stride is still a byte-range overlap
  // (rstd_out is a dense [T, 2] array, so it must not meet the buffer at all).
  p = FusedInPlace();
  p.rstd_out = reinterpret_cast<float*>(at(kFused1 + 2560 * 2));
  EXPECT_TRUE(Rejects(p, "rstd_out overlaps an input, output or weight"));
}

// validate_params does not compare rstd_out with the weights, although rstd_out is written while
// the weights are read (see the report of the test author). Enable once validate.cpp checks it.
TEST_F(ValidateTest, RstdOverlappingAWeightIsRejected) {
  QkNormParams p = Valid();
  p.rstd_out = reinterpret_cast<float*>(at(kQW));
  EXPECT_TRUE(Rejects(p, "rstd_out overlaps"));
}

// ---------------------------------------------------------------- vector_bytes_for

TEST_F(ValidateTest, VectorBytesForAlignedCallsIs16) {
  EXPECT_EQ(vector_bytes_for(Valid()), 16);
  EXPECT_EQ(vector_bytes_for(Valid(DType::kF32)), 16);
  EXPECT_EQ(vector_bytes_for(Valid(DType::kF16)), 16);
  EXPECT_EQ(vector_bytes_for(Valid(DType::kF8E4M3)), 16);
  EXPECT_EQ(vector_bytes_for(FusedInPlace()), 16);
}

// Valid(dt) with Q's (or K's) shard `shard` elements wide over kTp ranks, dense rows.
QkNormParams WithShard(const QkNormParams& valid, bool q, int64_t shard) {
  QkNormParams p = valid;
  (q ? p.q_full_width : p.k_full_width) = shard * kTp;
  ShardView& v = q ? p.q : p.k;
  v.width = v.in_stride = v.out_stride = shard;
  return p;
}

TEST_F(ValidateTest, VectorBytesForShardWidths) {
  struct Want {
    DType dt;
    bool q;
    int64_t shard;
    int bytes;
  };
  const Want cases[] = {
      // Multiples of an 8-byte vector but not of a 16-byte one: 8.
      {DType::kBF16, true, 500, 8},     // 4 x 125
      {DType::kF8E4M3, true, 1016, 8},  // 8 x 127
      {DType::kF32, false, 510, 8},     // 2 x 255
      // Multiples of a 4-byte vector but not of an 8-byte one, for 1- and 2-byte types: 4.
      {DType::kBF16, true, 502, 4},     // 2 x 251
      {DType::kF8E4M3, true, 1012, 4},  // 4 x 253
      // Not even that: the element size (the scalar path).
      {DType::kBF16, true, 501, 2},
      {DType::kF8E4M3, true, 1010, 1},
      {DType::kF32, false, 511, 4},
  };
  for (const Want& w : cases) {
    const QkNormParams p = WithShard(Valid(w.dt), w.q, w.shard);
    ASSERT_NO_THROW(validate_params(p, kTp)) << w.shard;
    EXPECT_EQ(vector_bytes_for(p), w.bytes) << to_string(w.dt) << " shard " << w.shard;
  }
}

TEST_F(ValidateTest, VectorBytesForMisalignedPointerOrStrideIsNarrower) {
  QkNormParams p = Valid();
  p.q.in = at(kQIn + 2);
  EXPECT_EQ(vector_bytes_for(p), 2);
  p = Valid();
  p.q.in = at(kQIn + 8);  // 8-byte aligned: 8-byte vectors
  EXPECT_EQ(vector_bytes_for(p), 8);
  p = Valid();
  p.k.out = at(kKOut + 8);
  EXPECT_EQ(vector_bytes_for(p), 8);
  p = Valid();
  p.k.out = at(kKOut + 4);  // 4-byte aligned: 4-byte vectors of two elements
  EXPECT_EQ(vector_bytes_for(p), 4);
  p = Valid();
  p.k.weight = at(kKW + 2);
  EXPECT_EQ(vector_bytes_for(p), 2);
  p = Valid();
  p.q.in_stride = kQw + 4;  // rows after the first are 8-byte aligned, not 16
  EXPECT_EQ(vector_bytes_for(p), 8);
  p = Valid();
  p.k.out_stride = kKw + 1;
  EXPECT_EQ(vector_bytes_for(p), 2);
  p = Valid(DType::kF32);
  p.q.in = at(kQIn + 4);
  EXPECT_EQ(vector_bytes_for(p), 4);
  p = Valid(DType::kF8E4M3);
  p.q.in = at(kQIn + 8);
  EXPECT_EQ(vector_bytes_for(p), 8);
  p = Valid(DType::kF8E4M3);
  p.q.in = at(kQIn + 4);  // 4-byte vectors of four elements
  EXPECT_EQ(vector_bytes_for(p), 4);
  p = Valid(DType::kF8E4M3);
  p.q.in = at(kQIn + 2);
  EXPECT_EQ(vector_bytes_for(p), 1);
  p = Valid(DType::kF8E4M3);
  // 8 bf16 outputs of an 8-byte input vector are 16 bytes, so aligned to 16; the 4 of a 4-byte
  // one are 8 bytes.
  p.q.out = at(kQOut + 8);
  EXPECT_EQ(vector_bytes_for(p), 4);
  p.q.out = at(kQOut + 4);
  EXPECT_EQ(vector_bytes_for(p), 1);
  // Padding rows to a multiple of the vector keeps the vector path.
  p = Valid();
  p.q.in_stride = kQw + 8;
  EXPECT_EQ(vector_bytes_for(p), 16);
}

TEST_F(ValidateTest, ReplicatedKvHeadsAreNamed) {
  // 8 KV heads of 128 at TP 16: engines give each rank a whole (replicated) head of 128.
  QkNormParams p = Valid();
  p.q.width = p.q_full_width / 16;
  p.k_full_width = 1024;
  p.k.width = 128;
  p.k.in_stride = p.k.out_stride = 128;
  expect_error([&] { validate_params(p, 16); }, "add up to 2 x k_full_width: replicated heads");
}

}  // namespace
}  // namespace swiftqk

namespace swiftqk {
namespace {

using testing::expect_error;

TEST(ValidateConfig, DefaultsAreValid) { EXPECT_NO_THROW(validate_config(CommConfig{})); }

// A timeout becomes a nanosecond count on the device: every value that would overflow it, or is
// not a number, is refused with a sentence naming the setting and the value.
TEST(ValidateConfig, TimeoutMustBeFiniteAndInRange) {
  for (double t : {std::numeric_limits<double>::infinity(), 1e30, 2e10, 3600.5, 0.0, -1.0, 1e-4,
                   std::numeric_limits<double>::quiet_NaN()}) {
    CommConfig c;
    c.timeout_s = t;
    SCOPED_TRACE(t);
    expect_error([&] { validate_config(c); }, "CommConfig.timeout_s");
  }
  for (double t : {kMinTimeoutS, 0.2, 5.0, kMaxTimeoutS}) {
    CommConfig c;
    c.timeout_s = t;
    EXPECT_NO_THROW(validate_config(c)) << t;
  }
}

TEST(ValidateConfig, CapacityAndBudgetRanges) {
  CommConfig c;
  c.token_capacity = 0;
  expect_error([&] { validate_config(c); }, {"CommConfig.token_capacity", "got 0"});
  c.token_capacity = (int64_t{1} << 31) + 1;
  expect_error([&] { validate_config(c); }, {"CommConfig.token_capacity", "got 2147483649"});
  c = CommConfig{};
  c.sm_budget = -1;
  expect_error([&] { validate_config(c); }, {"CommConfig.sm_budget", "got -1"});
}

}  // namespace
}  // namespace swiftqk
