// Tests for validate_epilogue_params. The pointers point into a host arena but are never
// dereferenced: validation only looks at addresses, strides and sizes. Each test breaks one
// rule of a valid call and expects the refusal to name the field.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "swiftqk/error.hpp"
#include "swiftqk/qk_epilogue_params.hpp"
#include "swiftqk/types.hpp"

namespace swiftqk {
namespace {

// One rank of TP 4 of a model with 32 Q heads and 8 KV heads of 128: 8 Q and 2 KV heads here.
constexpr int kTp = 4;
constexpr int64_t kTokens = 64;
constexpr int64_t kQHeads = 8, kKvHeads = 2, kHeadDim = 128;
constexpr int64_t kQw = kQHeads * kHeadDim, kKw = kKvHeads * kHeadDim;  // 1024, 256
constexpr int64_t kFusedStride = kQw + 2 * kKw;                         // 1536 elements
constexpr int64_t kMaxPosition = 256, kRotaryDim = 128;
constexpr int64_t kBlocks = 16, kBlockSize = 16;
constexpr int64_t kCacheElems = kBlocks * kBlockSize * kKvHeads * kHeadDim;  // 65536
constexpr std::size_t kEs = 2;                                               // bf16

// Byte offsets inside the arena; the fused QKV buffer [T, 1536] bf16 is 0x30000 bytes.
constexpr std::size_t kFused = 0x000000;
constexpr std::size_t kQOut = 0x040000;  // [T, 1024] x 2 B = 0x20000
constexpr std::size_t kKOut = 0x060000;  // [T, 256] x 2 B = 0x8000
constexpr std::size_t kQWeight = 0x070000;
constexpr std::size_t kKWeight = 0x071000;
constexpr std::size_t kPositions = 0x072000;
constexpr std::size_t kSlots = 0x073000;
constexpr std::size_t kScales = 0x074000;  // q_out_scale, then k_scale, v_scale 16 B apart
constexpr std::size_t kCosSin = 0x080000;  // 256 x 128 x 4 B = 0x20000
constexpr std::size_t kCacheK = 0x100000;  // 65536 x 2 B = 0x20000
constexpr std::size_t kCacheV = 0x140000;
constexpr std::size_t kArenaBytes = 0x200000;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

class ValidateEpilogueTest : public ::testing::Test {
 protected:
  ValidateEpilogueTest() : arena_(kArenaBytes + 256) {
    const uintptr_t raw = reinterpret_cast<uintptr_t>(arena_.data());
    base_ = arena_.data() + ((256 - raw % 256) % 256);  // 256-byte aligned, still in the arena
  }

  uint8_t* at(std::size_t offset) { return base_ + offset; }
  template <typename T>
  T* at_as(std::size_t offset) {
    return reinterpret_cast<T*>(at(offset));
  }

  // A valid bf16 call: Q, K, V column views of one fused QKV buffer, Q out of place, K also to
  // k_out, an NHD cache [16 blocks, 16 slots, 2 heads, 128], layerwise Olmo2 norm, NeoX RoPE.
  QkEpilogueParams Valid() {
    QkEpilogueParams p;
    p.q = at(kFused);
    p.k = at(kFused + kQw * kEs);
    p.v = at(kFused + (kQw + kKw) * kEs);
    p.q_stride = p.k_stride = p.v_stride = kFusedStride;
    p.q_out = at(kQOut);
    p.q_out_stride = kQw;
    p.q_out_dtype = DType::kBF16;
    p.k_out = at(kKOut);
    p.k_out_stride = kKw;
    p.q_weight = at(kQWeight);
    p.k_weight = at(kKWeight);
    p.dtype = DType::kBF16;
    p.tokens = kTokens;
    p.num_q_heads = kQHeads;
    p.num_kv_heads = kKvHeads;
    p.head_dim = kHeadDim;
    p.scope = NormScope::kLayerwise;
    p.order = NormOrder::kOlmo2;
    p.eps = 1e-6f;
    p.rope.positions = at_as<const int64_t>(kPositions);
    p.rope.cos_sin_cache = at(kCosSin);
    p.rope.cache_dtype = DType::kF32;
    p.rope.max_position = kMaxPosition;
    p.rope.rotary_dim = kRotaryDim;
    p.rope.style = RopeStyle::kNeox;
    p.cache.k = at(kCacheK);
    p.cache.v = at(kCacheV);
    p.cache.dtype = DType::kBF16;
    p.cache.num_blocks = kBlocks;
    p.cache.block_size = kBlockSize;
    p.cache.block_stride = kBlockSize * kKvHeads * kHeadDim;  // NHD
    p.cache.slot_stride = kKvHeads * kHeadDim;
    p.cache.head_stride = kHeadDim;
    p.cache.slot_mapping = at_as<const int64_t>(kSlots);
    return p;
  }

  // The same with an HND cache [16 blocks, 2 heads, 16 slots, 128].
  QkEpilogueParams ValidHnd() {
    QkEpilogueParams p = Valid();
    p.cache.head_stride = kBlockSize * kHeadDim;
    p.cache.slot_stride = kHeadDim;
    return p;
  }

  // fp8 q_out and an fp8 cache, with their scales.
  QkEpilogueParams ValidFp8() {
    QkEpilogueParams p = Valid();
    p.q_out_dtype = DType::kF8E4M3;
    p.q_out_scale = at_as<const float>(kScales);
    p.cache.dtype = DType::kF8E4M3;
    p.cache.k_scale = at_as<const float>(kScales + 16);
    p.cache.v_scale = at_as<const float>(kScales + 32);
    return p;
  }

  static ::testing::AssertionResult Rejects(const QkEpilogueParams& p, const std::string& needle,
                                            int world = kTp) {
    return testing::throws_error([&] { validate_epilogue_params(p, world); }, {needle});
  }

 private:
  std::vector<uint8_t> arena_;
  uint8_t* base_ = nullptr;
};

// ---------------------------------------------------------------- valid calls

TEST_F(ValidateEpilogueTest, ValidCallsPass) {
  EXPECT_NO_THROW(validate_epilogue_params(Valid(), kTp));
  EXPECT_NO_THROW(validate_epilogue_params(ValidHnd(), kTp));
  EXPECT_NO_THROW(validate_epilogue_params(ValidFp8(), kTp));
  for (int world : {1, 2, 8, 32}) EXPECT_NO_THROW(validate_epilogue_params(Valid(), world));
  QkEpilogueParams p = Valid();
  p.k_out = nullptr;  // optional; its stride is then not looked at
  p.k_out_stride = 0;
  EXPECT_NO_THROW(validate_epilogue_params(p, kTp));
  p = Valid();
  p.dtype = p.q_out_dtype = p.cache.dtype = DType::kF16;
  EXPECT_NO_THROW(validate_epilogue_params(p, kTp));
  p.order = NormOrder::kLlama;
  p.rope.style = RopeStyle::kGptj;
  p.rope.rotary_dim = 64;            // partial rotary
  p.rope.cache_dtype = DType::kF16;  // cos/sin in the model dtype: 2-byte alignment
  p.rope.cos_sin_cache = at(kCosSin + 2);
  EXPECT_NO_THROW(validate_epilogue_params(p, kTp));
}

TEST_F(ValidateEpilogueTest, HeadwiseWithWeightPlusOnePasses) {
  QkEpilogueParams p = Valid();
  p.scope = NormScope::kHeadwise;
  p.weight_plus_one = true;
  EXPECT_NO_THROW(validate_epilogue_params(p, 1));
  EXPECT_NO_THROW(validate_epilogue_params(p, 32));
  EXPECT_TRUE(Rejects(p, "world_size must be in [1, 32], got 33", 33));
}

TEST_F(ValidateEpilogueTest, InPlaceQAndKPass) {
  QkEpilogueParams p = Valid();
  p.q_out = const_cast<void*>(p.q);
  p.q_out_stride = p.q_stride;
  p.k_out = const_cast<void*>(p.k);
  p.k_out_stride = p.k_stride;
  EXPECT_NO_THROW(validate_epilogue_params(p, kTp));
  p.tokens = 1;
  EXPECT_NO_THROW(validate_epilogue_params(p, kTp));
}

// A cache where one dimension takes a single index needs no stride for it.
TEST_F(ValidateEpilogueTest, ADimensionOfOneIndexIsExemptFromTheGeometry) {
  QkEpilogueParams p = Valid();
  p.cache.num_blocks = 1;
  p.cache.block_stride = 0;
  EXPECT_NO_THROW(validate_epilogue_params(p, kTp));
  p = Valid();
  p.num_kv_heads = 1;
  p.k_stride = p.v_stride = kFusedStride;
  p.cache.head_stride = 0;
  EXPECT_NO_THROW(validate_epilogue_params(p, kTp));
  // Padded blocks and slots are still injective.
  p = Valid();
  p.cache.slot_stride = kKw + 64;
  p.cache.block_stride = kBlockSize * (kKw + 64) + 128;
  p.cache.v = at(kCacheV + 0x10000);  // the padded K cache is longer
  EXPECT_NO_THROW(validate_epilogue_params(p, kTp));
}

TEST_F(ValidateEpilogueTest, ZeroTokensChecksOnlyScalars) {
  QkEpilogueParams p = Valid();
  p.tokens = 0;
  p.q = p.k = p.v = nullptr;
  p.q_out = p.k_out = nullptr;
  p.q_weight = p.k_weight = nullptr;
  p.rope.positions = nullptr;
  p.rope.cos_sin_cache = nullptr;
  p.cache.k = p.cache.v = nullptr;
  p.cache.slot_mapping = nullptr;
  EXPECT_NO_THROW(validate_epilogue_params(p, kTp));
  p.head_dim = 127;
  EXPECT_TRUE(Rejects(p, "head_dim must be even, got 127"));
  p = Valid();
  p.tokens = 0;
  p.cache.slot_stride = 1;
  EXPECT_TRUE(Rejects(p, "cache geometry"));
}

// ---------------------------------------------------------------- scalars

TEST_F(ValidateEpilogueTest, WorldSizeOutOfRange) {
  EXPECT_TRUE(Rejects(Valid(), "world_size must be in [1, 32], got 0", 0));
  EXPECT_TRUE(Rejects(Valid(), "world_size must be in [1, 32], got -1", -1));
  EXPECT_TRUE(Rejects(Valid(), "world_size must be in [1, 32], got 64", 64));
}

TEST_F(ValidateEpilogueTest, NegativeTokens) {
  QkEpilogueParams p = Valid();
  p.tokens = -1;
  EXPECT_TRUE(Rejects(p, "tokens must be >= 0, got -1"));
}

TEST_F(ValidateEpilogueTest, ModelDtypeMustBeBf16OrF16) {
  QkEpilogueParams p = Valid();
  p.dtype = p.q_out_dtype = p.cache.dtype = DType::kF32;
  EXPECT_TRUE(
      Rejects(p, "dtype: the epilogue takes bf16 or f16 models (q, k, v, weights), got f32"));
  p.dtype = DType::kF8E4M3;
  EXPECT_TRUE(Rejects(p, "the epilogue takes bf16 or f16 models (q, k, v, weights), got f8e4m3"));
  p.dtype = static_cast<DType>(9);
  EXPECT_TRUE(Rejects(p, "dtype is not a DType: DType(9)"));
}

TEST_F(ValidateEpilogueTest, HeadsAndHeadDim) {
  QkEpilogueParams p = Valid();
  p.num_q_heads = 0;
  EXPECT_TRUE(Rejects(p, "num_q_heads must be > 0, got 0"));
  p = Valid();
  p.num_kv_heads = -2;
  EXPECT_TRUE(Rejects(p, "num_kv_heads must be > 0, got -2"));
  p = Valid();
  p.head_dim = 0;
  EXPECT_TRUE(Rejects(p, "head_dim must be > 0, got 0"));
  p = Valid();
  p.head_dim = 127;
  EXPECT_TRUE(Rejects(p, "head_dim must be even, got 127"));
  p = Valid();
  p.num_q_heads = int64_t{1} << 62;
  EXPECT_TRUE(Rejects(p, "num_q_heads x head_dim overflows"));
}

TEST_F(ValidateEpilogueTest, BadEnumValues) {
  QkEpilogueParams p = Valid();
  p.scope = static_cast<NormScope>(2);
  EXPECT_TRUE(Rejects(p, "scope is not a NormScope: 2"));
  p = Valid();
  p.order = static_cast<NormOrder>(-1);
  EXPECT_TRUE(Rejects(p, "order is not a NormOrder: -1"));
  p = Valid();
  p.rope.style = static_cast<RopeStyle>(3);
  EXPECT_TRUE(Rejects(p, "rope.style is not a RopeStyle: 3"));
}

TEST_F(ValidateEpilogueTest, EpsMustBeFiniteAndPositive) {
  for (float eps : {0.f, -1e-6f, kNaN, kInf}) {
    QkEpilogueParams p = Valid();
    p.eps = eps;
    EXPECT_TRUE(Rejects(p, "eps must be finite and > 0")) << eps;
  }
}

TEST_F(ValidateEpilogueTest, WeightPlusOneIsHeadwiseOnly) {
  QkEpilogueParams p = Valid();
  p.weight_plus_one = true;
  EXPECT_TRUE(Rejects(p, "weight_plus_one"));
}

// The deterministic mode's canonical order: 16 segments of each full row, 16 / world of them a
// rank, in 16-byte vectors; a headwise norm has nothing to order and takes any group.
TEST_F(ValidateEpilogueTest, DeterministicNeedsAPowerOfTwoTpUpTo16AndWholeSegments) {
  QkEpilogueParams p = Valid();
  p.deterministic = true;
  for (int world : {1, 2, 4, 8, 16}) EXPECT_NO_THROW(validate_epilogue_params(p, world)) << world;
  EXPECT_TRUE(Rejects(p, "deterministic mode: TP degree 32 must be a power of two up to 16", 32));
  EXPECT_TRUE(Rejects(p, "deterministic mode: TP degree 6 must be a power of two up to 16", 6));
  p.head_dim = 96;  // rows of 768 and 192 elements
  p.rope.rotary_dim = 96;
  EXPECT_NO_THROW(validate_epilogue_params(p, 2));  // 8 segments a rank: multiples of 64
  EXPECT_TRUE(Rejects(p,
                      "deterministic mode: local widths 768 and 192 must be multiples of 128 (16 "
                      "segments of 8-element vectors)",
                      1));
  p.deterministic = false;  // the default mode takes them
  EXPECT_NO_THROW(validate_epilogue_params(p, 1));
  p = Valid();
  p.deterministic = true;
  p.scope = NormScope::kHeadwise;
  for (int world : {1, 6, 32}) EXPECT_NO_THROW(validate_epilogue_params(p, world)) << world;
}

TEST_F(ValidateEpilogueTest, QOutDtype) {
  QkEpilogueParams p = Valid();
  p.q_out_dtype = DType::kF16;  // of a bf16 model
  EXPECT_TRUE(Rejects(p, "q_out_dtype must be the model dtype bf16 or f8e4m3, got f16"));
  p.q_out_dtype = DType::kF32;
  EXPECT_TRUE(Rejects(p, "q_out_dtype must be the model dtype bf16 or f8e4m3, got f32"));
}

TEST_F(ValidateEpilogueTest, StridesSmallerThanTheRow) {
  QkEpilogueParams p = Valid();
  p.q_stride = kQw - 1;
  EXPECT_TRUE(
      Rejects(p, "q_stride 1023 is smaller than the row width num_q_heads x head_dim = 1024"));
  p = Valid();
  p.k_stride = 0;
  EXPECT_TRUE(Rejects(p, "k_stride 0 is smaller than the row width num_kv_heads x head_dim = 256"));
  p = Valid();
  p.v_stride = -kFusedStride;
  EXPECT_TRUE(Rejects(p, "v_stride -1536 is smaller"));
  p = Valid();
  p.q_out_stride = 512;
  EXPECT_TRUE(Rejects(p, "q_out_stride 512 is smaller"));
  p = Valid();
  p.k_out_stride = kKw - 2;
  EXPECT_TRUE(Rejects(p, "k_out_stride 254 is smaller"));
}

// ---------------------------------------------------------------- rope

TEST_F(ValidateEpilogueTest, RotaryDim) {
  for (int64_t rd : {0, 1, 3, 127, 130, -2}) {
    QkEpilogueParams p = Valid();
    p.rope.rotary_dim = rd;
    EXPECT_TRUE(Rejects(
        p, "rope.rotary_dim must be even and in [2, head_dim = 128], got " + std::to_string(rd)));
  }
  QkEpilogueParams p = Valid();
  p.rope.rotary_dim = 2;
  EXPECT_NO_THROW(validate_epilogue_params(p, kTp));
}

TEST_F(ValidateEpilogueTest, MaxPosition) {
  QkEpilogueParams p = Valid();
  p.rope.max_position = 0;
  EXPECT_TRUE(Rejects(p, "rope.max_position must be >= 1, got 0"));
  p.rope.max_position = int64_t{1} << 60;  // the table would span more than 2^50 bytes
  EXPECT_TRUE(Rejects(p, "rope.cos_sin_cache spans more than 2^50 bytes"));
}

TEST_F(ValidateEpilogueTest, CosSinCacheDtype) {
  QkEpilogueParams p = Valid();
  p.rope.cache_dtype = DType::kF16;  // of a bf16 model
  EXPECT_TRUE(Rejects(p, "rope.cache_dtype must be f32 or the model dtype bf16, got f16"));
  p.rope.cache_dtype = DType::kF8E4M3;
  EXPECT_TRUE(Rejects(p, "rope.cache_dtype must be f32 or the model dtype bf16, got f8e4m3"));
}

// ---------------------------------------------------------------- the cache's scalars

TEST_F(ValidateEpilogueTest, CacheDtype) {
  QkEpilogueParams p = Valid();
  p.cache.dtype = DType::kF16;
  EXPECT_TRUE(Rejects(p, "cache.dtype must be the model dtype bf16 or f8e4m3, got f16"));
  p.cache.dtype = DType::kF32;
  EXPECT_TRUE(Rejects(p, "cache.dtype must be the model dtype bf16 or f8e4m3, got f32"));
}

TEST_F(ValidateEpilogueTest, CacheCounts) {
  QkEpilogueParams p = Valid();
  p.cache.num_blocks = 0;
  EXPECT_TRUE(Rejects(p, "cache.num_blocks must be >= 1, got 0"));
  p = Valid();
  p.cache.block_size = -16;
  EXPECT_TRUE(Rejects(p, "cache.block_size must be >= 1, got -16"));
}

TEST_F(ValidateEpilogueTest, NegativeCacheStrides) {
  QkEpilogueParams p = Valid();
  p.cache.block_stride = -1;
  EXPECT_TRUE(Rejects(p, "cache.block_stride must be >= 0, got -1"));
  p = Valid();
  p.cache.slot_stride = -256;
  EXPECT_TRUE(Rejects(p, "cache.slot_stride must be >= 0, got -256"));
  p = Valid();
  p.cache.head_stride = -128;
  EXPECT_TRUE(Rejects(p, "cache.head_stride must be >= 0, got -128"));
}

TEST_F(ValidateEpilogueTest, OverlappingCacheGeometriesAreRejected) {
  // NHD with the slot stride of one head: slot s + 1's head 0 is slot s's head 1.
  QkEpilogueParams p = Valid();
  p.cache.slot_stride = kHeadDim;
  EXPECT_TRUE(Rejects(p,
                      "cache geometry: cache.slot_stride 128 is smaller than "
                      "cache.head_stride x num_kv_heads = 128 x 2 = 256"));
  // Heads closer than head_dim.
  p = Valid();
  p.cache.head_stride = 64;
  EXPECT_TRUE(Rejects(p,
                      "cache.head_stride 64 is smaller than 1 (the element stride) x "
                      "head_dim = 1 x 128"));
  // Blocks closer than a block.
  p = Valid();
  p.cache.block_stride = kBlockSize * kKw - 1;
  EXPECT_TRUE(Rejects(p,
                      "cache.block_stride 4095 is smaller than cache.slot_stride x "
                      "cache.block_size = 256 x 16"));
  // HND with the block stride of one head's slots.
  p = ValidHnd();
  p.cache.block_stride = kBlockSize * kHeadDim;
  EXPECT_TRUE(Rejects(p,
                      "cache.block_stride 2048 is smaller than cache.head_stride x "
                      "num_kv_heads = 2048 x 2"));
  // A zero stride on a dimension of several indices.
  p = Valid();
  p.cache.block_stride = 0;
  EXPECT_TRUE(Rejects(p, "cache geometry: cache.block_stride is 0 but cache.num_blocks is 16"));
  // Two dimensions with the same stride.
  p = Valid();
  p.cache.head_stride = p.cache.slot_stride;
  EXPECT_TRUE(Rejects(p, "so two (block, slot, head, element) share an address"));
}

TEST_F(ValidateEpilogueTest, HugeCacheGeometryIsRejectedBeforeItWraps) {
  QkEpilogueParams p = Valid();
  p.cache.block_stride = int64_t{1} << 50;
  EXPECT_TRUE(Rejects(p, "cache.k and cache.v would each span more than 2^50 bytes"));
  p.cache.block_stride = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE(Rejects(p, "more than 2^50 bytes"));
}

// ---------------------------------------------------------------- pointers

TEST_F(ValidateEpilogueTest, NullPointers) {
  struct Case {
    const char* name;
    void (*clear)(QkEpilogueParams&);
  };
  const Case cases[] = {
      {"q is null", [](QkEpilogueParams& p) { p.q = nullptr; }},
      {"k is null", [](QkEpilogueParams& p) { p.k = nullptr; }},
      {"v is null", [](QkEpilogueParams& p) { p.v = nullptr; }},
      {"q_out is null", [](QkEpilogueParams& p) { p.q_out = nullptr; }},
      {"q_weight is null", [](QkEpilogueParams& p) { p.q_weight = nullptr; }},
      {"k_weight is null", [](QkEpilogueParams& p) { p.k_weight = nullptr; }},
      {"rope.positions is null", [](QkEpilogueParams& p) { p.rope.positions = nullptr; }},
      {"rope.cos_sin_cache is null", [](QkEpilogueParams& p) { p.rope.cos_sin_cache = nullptr; }},
      {"cache.k is null", [](QkEpilogueParams& p) { p.cache.k = nullptr; }},
      {"cache.v is null", [](QkEpilogueParams& p) { p.cache.v = nullptr; }},
      {"cache.slot_mapping is null", [](QkEpilogueParams& p) { p.cache.slot_mapping = nullptr; }},
  };
  for (const Case& c : cases) {
    QkEpilogueParams p = Valid();
    c.clear(p);
    EXPECT_TRUE(Rejects(p, c.name));
  }
}

TEST_F(ValidateEpilogueTest, Fp8NeedsItsScales) {
  QkEpilogueParams p = ValidFp8();
  p.q_out_scale = nullptr;
  EXPECT_TRUE(Rejects(p, "q_out_scale (needed by an fp8 q_out) is null"));
  p = ValidFp8();
  p.cache.k_scale = nullptr;
  EXPECT_TRUE(Rejects(p, "cache.k_scale (needed by an fp8 cache) is null"));
  p = ValidFp8();
  p.cache.v_scale = nullptr;
  EXPECT_TRUE(Rejects(p, "cache.v_scale (needed by an fp8 cache) is null"));
  // Not looked at without fp8.
  p = Valid();
  p.q_out_scale = p.cache.k_scale = p.cache.v_scale = nullptr;
  EXPECT_NO_THROW(validate_epilogue_params(p, kTp));
}

TEST_F(ValidateEpilogueTest, MisalignedPointers) {
  QkEpilogueParams p = Valid();
  p.q = at(kFused + 1);
  EXPECT_TRUE(Rejects(p, "q is not aligned to 2 bytes (bf16)"));
  p = Valid();
  p.v = at(kFused + (kQw + kKw) * kEs + 1);
  EXPECT_TRUE(Rejects(p, "v is not aligned to 2 bytes"));
  p = Valid();
  p.q_out = at(kQOut + 1);
  EXPECT_TRUE(Rejects(p, "q_out is not aligned to 2 bytes (bf16)"));
  p = Valid();
  p.k_out = at(kKOut + 3);
  EXPECT_TRUE(Rejects(p, "k_out is not aligned to 2 bytes"));
  p = Valid();
  p.k_weight = at(kKWeight + 1);
  EXPECT_TRUE(Rejects(p, "k_weight is not aligned to 2 bytes"));
  p = Valid();
  p.rope.positions = at_as<const int64_t>(kPositions + 4);
  EXPECT_TRUE(Rejects(p, "rope.positions is not aligned to 8 bytes (int64)"));
  p = Valid();
  p.cache.slot_mapping = at_as<const int64_t>(kSlots + 2);
  EXPECT_TRUE(Rejects(p, "cache.slot_mapping is not aligned to 8 bytes (int64)"));
  p = Valid();
  p.rope.cos_sin_cache = at(kCosSin + 2);
  EXPECT_TRUE(Rejects(p, "rope.cos_sin_cache is not aligned to 4 bytes (f32)"));
  p = Valid();
  p.cache.v = at(kCacheV + 1);
  EXPECT_TRUE(Rejects(p, "cache.v is not aligned to 2 bytes (bf16)"));
  p = ValidFp8();
  p.cache.k_scale = at_as<const float>(kScales + 18);
  EXPECT_TRUE(Rejects(p, "cache.k_scale is not aligned to 4 bytes"));
  p = ValidFp8();
  p.q_out_scale = at_as<const float>(kScales + 1);
  EXPECT_TRUE(Rejects(p, "q_out_scale is not aligned to 4 bytes"));
  // fp8 outputs need only byte alignment.
  p = ValidFp8();
  p.q_out = at(kQOut + 1);
  p.cache.k = at(kCacheK + 1);
  p.cache.v = at(kCacheV + 3);
  EXPECT_NO_THROW(validate_epilogue_params(p, kTp));
}

// ---------------------------------------------------------------- overlaps

TEST_F(ValidateEpilogueTest, QOutMayBeQExactlyAndNothingElse) {
  QkEpilogueParams p = Valid();
  p.q_out = at(kFused + kEs);  // one element past q, same stride
  p.q_out_stride = kFusedStride;
  EXPECT_TRUE(Rejects(p, "q_out partly overlaps q (in place needs the same pointer and stride)"));
  p = Valid();
  p.q_out = const_cast<void*>(p.q);
  p.q_out_stride = kQw;  // same pointer, another stride
  EXPECT_TRUE(Rejects(p, "q_out partly overlaps q"));
  p = ValidFp8();
  p.q_out = const_cast<void*>(p.q);
  p.q_out_stride = p.q_stride;
  EXPECT_TRUE(Rejects(p, "in place needs q_out_dtype == dtype"));
}

TEST_F(ValidateEpilogueTest, QOutMustNotOverlapWhatElseIsReadOrWritten) {
  // K, then V, in a buffer of their own (the fused rows would overlap q as well).
  QkEpilogueParams p = Valid();
  p.k = at(kKOut);
  p.k_stride = kKw;
  p.k_out = nullptr;
  p.q_out = at(kKOut + 0x100);
  EXPECT_TRUE(Rejects(p, "q_out overlaps k"));
  p = Valid();
  p.v = at(kKOut);
  p.v_stride = kKw;
  p.k_out = nullptr;
  p.q_out = at(kKOut + 0x100);
  EXPECT_TRUE(Rejects(p, "q_out overlaps v"));
  p = Valid();
  p.k_out = at(kQOut + 0x1000);
  EXPECT_TRUE(Rejects(p, "q_out and k_out overlap"));
  p = Valid();
  p.cache.k = at(kQOut + 0x10000);
  EXPECT_TRUE(Rejects(p, "q_out and cache.k overlap"));
  p = Valid();
  p.cache.v = at(kQOut);
  EXPECT_TRUE(Rejects(p, "q_out and cache.v overlap"));
  p = Valid();
  p.rope.cos_sin_cache = at(kQOut + 0x1f000);
  EXPECT_TRUE(Rejects(p, "q_out overlaps rope.cos_sin_cache"));
  p = Valid();
  p.rope.positions = at_as<const int64_t>(kQOut + 0x800);
  EXPECT_TRUE(Rejects(p, "q_out overlaps rope.positions"));
}

// The weights' extents are the local slices (layerwise) or one head (headwise): a q_weight that
// ends 512 bytes into q_out overlaps it as a 2048-byte layerwise slice, not as a 256-byte head.
TEST_F(ValidateEpilogueTest, WeightExtentsFollowTheScope) {
  QkEpilogueParams p = Valid();
  p.q_weight = at(kQOut - 1536);
  EXPECT_TRUE(Rejects(p, "q_out overlaps q_weight"));
  p.scope = NormScope::kHeadwise;
  EXPECT_NO_THROW(validate_epilogue_params(p, kTp));
  p.k_weight = at(kKOut + 0x8000 - 128);  // a head of K's weight is 256 bytes
  EXPECT_TRUE(Rejects(p, "k_out overlaps k_weight"));
}

TEST_F(ValidateEpilogueTest, KOutMayBeKExactlyAndNothingElse) {
  QkEpilogueParams p = Valid();
  p.k_out = const_cast<void*>(p.k);
  p.k_out_stride = kKw;  // same pointer, another stride
  EXPECT_TRUE(Rejects(p, "k_out overlaps k (in place needs the same pointer and stride)"));
  p = Valid();
  p.k_out = const_cast<void*>(p.q);
  p.k_out_stride = kFusedStride;
  EXPECT_TRUE(Rejects(p, "k_out overlaps q"));
  p = Valid();
  p.k_out = const_cast<void*>(p.v);
  p.k_out_stride = kFusedStride;
  EXPECT_TRUE(Rejects(p, "k_out overlaps v"));
  p = Valid();
  p.k_out = at(kCacheV + 0x100);
  EXPECT_TRUE(Rejects(p, "cache.v and k_out overlap"));
}

TEST_F(ValidateEpilogueTest, CachesMustNotOverlapInputsOrEachOther) {
  QkEpilogueParams p = Valid();
  p.cache.k = at(kFused + 0x2000);
  EXPECT_TRUE(Rejects(p, "cache.k overlaps k"));  // the fused rows hold q, k and v alike
  p = Valid();
  p.q = at(kCacheK);  // q in a buffer of its own, where cache.k is
  p.q_stride = kQw;
  EXPECT_TRUE(Rejects(p, "cache.k overlaps q"));
  p = Valid();
  p.cache.v = at(kFused + 0x10000);
  EXPECT_TRUE(Rejects(p, "cache.v overlaps k"));
  p = Valid();
  p.cache.v = at(kCacheK + 0x1000);
  EXPECT_TRUE(Rejects(p, "cache.k and cache.v overlap"));
  p = Valid();
  p.v = at(kKOut);  // v in a buffer of its own
  p.v_stride = kKw;
  p.k_out = nullptr;
  p.cache.k = at(kKOut + 0x100);
  EXPECT_TRUE(Rejects(p, "cache.k overlaps v"));
  p = Valid();
  p.cache.v = p.cache.k;
  EXPECT_TRUE(Rejects(p, "cache.k and cache.v overlap"));
  p = Valid();
  p.cache.slot_mapping = at_as<const int64_t>(kCacheK + 0x8000);
  EXPECT_TRUE(Rejects(p, "cache.k overlaps cache.slot_mapping"));
  p = ValidFp8();
  p.cache.v_scale = at_as<const float>(kCacheV + 0x40);
  EXPECT_TRUE(Rejects(p, "cache.v overlaps cache.v_scale"));
  p = Valid();
  p.k_weight = at(kCacheV + 0x1fe00);
  EXPECT_TRUE(Rejects(p, "cache.v overlaps k_weight"));
}

// K and V interleaved block by block in one buffer (FlashInfer's [num_blocks, 2, block_size,
// heads, head_dim]): their byte ranges meet but no element is shared, which is accepted (V one
// block further is still disjoint); a V base that lands on any K element is refused, and one
// between two elements is misaligned.
TEST_F(ValidateEpilogueTest, KAndVInterleavedPerBlockAreAcceptedWhenDisjoint) {
  QkEpilogueParams p = Valid();
  p.cache.block_stride = 2 * kBlockSize * kKw;
  p.cache.v = at(kCacheK + kBlockSize * kKw * kEs);
  EXPECT_NO_THROW(validate_epilogue_params(p, kTp));
  // The HND variant: [num_blocks, 2, heads, block_size, head_dim].
  p.cache.head_stride = kBlockSize * kHeadDim;
  p.cache.slot_stride = kHeadDim;
  EXPECT_NO_THROW(validate_epilogue_params(p, kTp));
  p = Valid();
  p.cache.block_stride = 2 * kBlockSize * kKw;
  p.cache.v = at(kCacheK + 3 * kBlockSize * kKw * kEs);  // the odd half of the next block
  EXPECT_NO_THROW(validate_epilogue_params(p, kTp));
  // V on K's own elements: the same base, a head, a slot, a block, a head of the next block on.
  for (int64_t elements : {int64_t{0}, kHeadDim, kKw, 3 * kKw + 5, 2 * kBlockSize * kKw,
                           2 * kBlockSize * kKw + kHeadDim}) {
    p.cache.v = at(kCacheK + elements * kEs);
    EXPECT_TRUE(Rejects(p, "cache.k and cache.v overlap")) << elements;
  }
  p.cache.v = at(kCacheK + kBlockSize * kKw * kEs + 1);  // between two elements
  EXPECT_TRUE(Rejects(p, "cache.v is not aligned"));
}

// The interleaving check is exact: against a brute-force intersection of K's and V's element
// sets, over padded and interleaved geometries and V bases across the whole span.
TEST_F(ValidateEpilogueTest, InterleavedCachesAcceptedExactlyWhenTheirElementsAreDisjoint) {
  struct Geometry {
    int64_t block_stride, slot_stride, head_stride;
  };
  const std::vector<Geometry> geometries = {
      {2 * kBlockSize * kKw, kKw, kHeadDim},                    // NHD, K and V per block
      {2 * kBlockSize * kKw, kHeadDim, kBlockSize * kHeadDim},  // HND, K and V per block
      {kBlockSize * (kKw + 64) + 256, kKw + 64, kHeadDim},      // padded slots and blocks
      {kBlockSize * kKw, kKw, kHeadDim},                        // dense: V must lie outside
  };
  constexpr int64_t kFewBlocks = 4;  // a small cache keeps the brute force quick
  int accepted = 0, refused = 0;
  for (const Geometry& g : geometries) {
    QkEpilogueParams p = Valid();
    p.cache.num_blocks = kFewBlocks;
    p.cache.block_stride = g.block_stride;
    p.cache.slot_stride = g.slot_stride;
    p.cache.head_stride = g.head_stride;
    const int64_t span = (kFewBlocks - 1) * g.block_stride + (kBlockSize - 1) * g.slot_stride +
                         (kKvHeads - 1) * g.head_stride + kHeadDim;
    std::vector<bool> in_k(span, false);
    std::vector<int64_t> k_elements;
    for (int64_t b = 0; b < kFewBlocks; ++b)
      for (int64_t s = 0; s < kBlockSize; ++s)
        for (int64_t h = 0; h < kKvHeads; ++h)
          for (int64_t d = 0; d < kHeadDim; ++d) {
            k_elements.push_back(b * g.block_stride + s * g.slot_stride + h * g.head_stride + d);
            in_k[k_elements.back()] = true;
          }
    // V bases on every head-sized step (where disjoint ones lie) and on an odd step between.
    std::vector<int64_t> deltas;
    for (int64_t delta = -span + 1; delta < span; delta += 61) deltas.push_back(delta);
    for (int64_t delta = -(span / kHeadDim) * kHeadDim; delta < span; delta += kHeadDim) {
      deltas.push_back(delta);
    }
    for (int64_t delta : deltas) {
      bool disjoint = true;
      for (int64_t e : k_elements) {  // V's element e + delta is one of K's
        const int64_t w = e + delta;
        if (w >= 0 && w < span && in_k[w]) {
          disjoint = false;
          break;
        }
      }
      p.cache.v = at(kCacheK + delta * static_cast<int64_t>(kEs));
      if (disjoint) {
        EXPECT_NO_THROW(validate_epilogue_params(p, kTp)) << delta;
        ++accepted;
      } else {
        EXPECT_TRUE(Rejects(p, "cache.k and cache.v overlap")) << delta;
        ++refused;
      }
    }
  }
  EXPECT_GE(accepted, 10);  // both outcomes are exercised (15 disjoint bases here)
  EXPECT_GE(refused, 10);
}

TEST_F(ValidateEpilogueTest, ExtentsThatWrapTheAddressSpaceAreRejected) {
  QkEpilogueParams p = Valid();
  p.q_out_stride = int64_t{1} << 48;
  EXPECT_TRUE(Rejects(p, "q_out spans more than 2^50 bytes"));
  p = Valid();
  p.cache.k = reinterpret_cast<void*>(~uintptr_t{0} - 0xfff);  // the last 4 KiB
  EXPECT_TRUE(Rejects(p, "cache.k spans more than 2^50 bytes"));
}

}  // namespace
}  // namespace swiftqk
