// Tests for the launch policy's parts (launch_plan.hpp): kernel shapes, pipeline depths,
// persistent grids and block order. make_launch_plan: test_make_launch_plan.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "expect_error.hpp"
#include "launch_plan.hpp"
#include "swiftqk/error.hpp"

namespace swiftqk {
namespace {

// ---------------------------------------------------------------- choose_kernel_shape

struct Widths {
  int64_t q, k;
};

// Full (all-rank) Q/K widths of real models plus odd ones.
const std::vector<Widths> kFullWidths = {
    {2048, 2048}, {4096, 4096}, {5120, 5120}, {5120, 1024},
    {6144, 1024}, {1000, 200},  {4100, 12},   {130000, 8},
};
const std::vector<int> kTp = {1, 2, 4, 8};
// bf16 (16 B / 2), f32 (16 B / 4), fp8 (16 B / 1) and the scalar path.
const std::vector<int> kVec = {8, 4, 16, 1};

// Checks every invariant the kernel relies on; returns a description of the first violation.
::testing::AssertionResult ShapeIsValid(const KernelShape& s, int64_t qw, int64_t kw, int vec,
                                        int world = 1, int vec_bytes = 16) {
  const int64_t n = qw / vec + kw / vec;
  auto fail = [&]() {
    return ::testing::AssertionFailure()
           << "q " << qw << " k " << kw << " vec " << vec << " (n = " << n << " vectors): vpt "
           << s.vectors_per_thread << " group " << s.group_threads << " tokens/block "
           << s.tokens_per_block << ": ";
  };
  if (s.vec_elems != vec) return fail() << "vec_elems " << s.vec_elems;
  if (vec > 1 && s.vec_bytes != vec_bytes) return fail() << "vec_bytes " << s.vec_bytes;
  // Staged rows hold at most kMaxStagedVectors 16-byte vectors' bytes, 4 a thread in 1024
  // threads.
  const bool streaming = vec == 1 || n * vec_bytes > kMaxStagedVectors * 16 || n > 1024 * 4;
  const int G = s.group_threads;
  if (G < 32) {
    // Narrower than a warp: staged rows only, a power of two, one lane per rank's slot.
    if (streaming) return fail() << "a streaming group narrower than a warp";
    if (G < kMinGroupThreads || (G & (G - 1)) != 0) return fail() << "sub-warp group size";
    if (G < world) return fail() << "fewer lanes than ranks";
  } else if (G % 32 != 0) {
    return fail() << "group not whole warps";
  }
  if (G > 1024) return fail() << "group > 1024";
  if (s.tokens_per_block < 1) return fail() << "tokens_per_block < 1";
  if (s.block_threads() > 1024) return fail() << "block_threads > 1024";
  if (s.block_threads() != s.group_threads * s.tokens_per_block) return fail() << "block_threads";
  // Groups of whole warps each have a hardware barrier (and a slot of the kernel's 32-entry
  // per-group arrays); narrower groups use neither.
  if (G > 32 && s.tokens_per_block > kMaxGroupsPerBlock)
    return fail() << "more groups than barriers";
  if (streaming != (s.vectors_per_thread == 0)) return fail() << "streaming choice wrong";
  if (!streaming) {
    const int vpt = s.vectors_per_thread;
    if (vpt != 1 && vpt != 2 && vpt != 4 && vpt != 8) return fail() << "vectors_per_thread";
    if (static_cast<int64_t>(G) * vpt < n) return fail() << "row does not fit";
    // The deepest ring of the block's rows must fit the 227 KB of shared memory a block may use.
    if (kMaxStages * vec_bytes * n * s.tokens_per_block > kMaxStagedRingBytes &&
        s.tokens_per_block > 1)
      return fail() << "staged rows too large";
    // No whole warp of the group holds nothing; a sub-warp group is no wider than it must be.
    if (G > 32 && static_cast<int64_t>(G - 32) * vpt >= n) return fail() << "idle warp";
    if (G < 32 && G > std::max(kMinGroupThreads, world) && static_cast<int64_t>(G / 2) * vpt >= n)
      return fail() << "sub-warp group twice too wide";
  }
  return ::testing::AssertionSuccess();
}

TEST(ChooseKernelShape, AllModelShapesAndTpDegrees) {
  int checked = 0, rejected = 0;
  for (const Widths& full : kFullWidths) {
    for (int tp : kTp) {
      if (full.q % tp != 0 || full.k % tp != 0) continue;  // validate_params rejects these
      const int64_t qw = full.q / tp, kw = full.k / tp;
      for (int vec : kVec) {
        SCOPED_TRACE("full " + std::to_string(full.q) + "/" + std::to_string(full.k) + " TP " +
                     std::to_string(tp) + " vec " + std::to_string(vec));
        if (qw % vec != 0 || kw % vec != 0) {
          EXPECT_TRUE(testing::throws_error([&] { choose_kernel_shape(qw, kw, vec); },
                                            "multiples of the vector size"));
          ++rejected;
          continue;
        }
        EXPECT_TRUE(ShapeIsValid(choose_kernel_shape(qw, kw, vec), qw, kw, vec));
        ++checked;
      }
    }
  }
  // The scalar path takes every shape, so each (shape, TP) that divides is checked at least once.
  EXPECT_GT(checked, 80);
  EXPECT_GT(rejected, 0);
}

// Rows of 8-byte vectors (widths 16-byte vectors do not divide): bf16 (8 B / 2), f32 (8 B / 4)
// and fp8 (8 B / 1), staged up to the bytes of kMaxStagedVectors 16-byte vectors.
TEST(ChooseKernelShape, EightAndFourByteVectorsOnEveryModelShapeAndTpDegree) {
  int checked = 0, streamed = 0, four = 0;
  for (const Widths& full : kFullWidths) {
    for (int tp : kTp) {
      if (full.q % tp != 0 || full.k % tp != 0) continue;
      const int64_t qw = full.q / tp, kw = full.k / tp;
      struct Vector {
        int elems, bytes;
      };
      // 8-byte vectors of 16-bit, f32 and fp8 elements; 4-byte ones of 16-bit and fp8.
      for (const Vector v :
           {Vector{4, 8}, Vector{2, 8}, Vector{8, 8}, Vector{2, 4}, Vector{4, 4}}) {
        const int vec = v.elems;
        if (qw % vec != 0 || kw % vec != 0) continue;
        SCOPED_TRACE("full " + std::to_string(full.q) + "/" + std::to_string(full.k) + " TP " +
                     std::to_string(tp) + " vec " + std::to_string(vec) + " of " +
                     std::to_string(v.bytes) + " bytes");
        const KernelShape s =
            choose_kernel_shape(qw, kw, vec, kDefaultBlockThreads, tp, 0, v.bytes);
        EXPECT_TRUE(ShapeIsValid(s, qw, kw, vec, tp, v.bytes));
        EXPECT_EQ(s.vec_bytes, v.bytes);
        for (int forced : {1, 2, 4, 8}) {
          if ((qw / vec + kw / vec + forced - 1) / forced > 1024 ||
              (qw / vec + kw / vec) * v.bytes > kMaxStagedVectors * 16) {
            continue;
          }
          EXPECT_TRUE(ShapeIsValid(choose_kernel_shape(qw, kw, vec, 1024, tp, forced, v.bytes), qw,
                                   kw, vec, tp, v.bytes))
              << "forced " << forced;
        }
        streamed += s.vectors_per_thread == 0;
        four += v.bytes == 4;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 110);
  EXPECT_GT(streamed, 0);
  EXPECT_GT(four, 40);
  // fp8 3296:5312 at TP 8: 412 + 664 elements are 269 4-byte vectors (8-byte ones do not
  // divide 412), staged 8 a thread in 64 threads in launches of many tokens, and 4 a thread in
  // 96 threads (68 used) in launches of fewer than kEightVectorsMinTokens.
  KernelShape fp8_tp8 = choose_kernel_shape(412, 664, 4, kDefaultBlockThreads, 8, 0, 4);
  EXPECT_EQ(fp8_tp8.vectors_per_thread, 8);
  EXPECT_EQ(fp8_tp8.group_threads, 64);
  fp8_tp8 = choose_kernel_shape(412, 664, 4, kDefaultBlockThreads, 8, 0, 4, kMaxStagedRowBytes,
                                kEightVectorsMinTokens - 1);
  EXPECT_EQ(fp8_tp8.vectors_per_thread, 4);
  EXPECT_EQ(fp8_tp8.group_threads, 96);
  // 2560 + 2560 bf16 elements are 640 16-byte vectors or 1280 8-byte ones: staged either way,
  // 4 a thread, so the group doubles; 9000 + 9000 bf16 elements (4500 8-byte vectors) stream.
  EXPECT_EQ(choose_kernel_shape(2560, 2560, 8).group_threads, 160);
  EXPECT_EQ(choose_kernel_shape(2560, 2560, 4, kDefaultBlockThreads, 1, 0, 8).group_threads, 320);
  EXPECT_EQ(choose_kernel_shape(9000, 9000, 4, kDefaultBlockThreads, 1, 0, 8).vectors_per_thread,
            0);
  EXPECT_TRUE(testing::throws_error(
      [] { choose_kernel_shape(2560, 2560, 4, kDefaultBlockThreads, 1, 0, 2); },
      "vectors are of 16, 8 or 4 bytes"));
}

// fp8 rows alone in 8-byte vectors, in launches of many tokens, take 8 a thread where 4 would
// need more than kFp8AloneMaxGroupAtFour threads; 16-bit 8-byte rows, fp8 with peers and
// launches of fewer tokens keep 4.
TEST(ChooseKernelShape, Fp8AloneTakesEightVectorsAThreadPastFourWarpsAtFour) {
  // OLMoE: 512 vectors, 128 threads at 4: kept.
  KernelShape s = choose_kernel_shape(2048, 2048, 8, kDefaultBlockThreadsAlone, 1, 0, 8);
  EXPECT_EQ(s.vectors_per_thread, 4);
  EXPECT_EQ(s.group_threads, 128);
  // OLMo3-32B (768), MiniMax-M2 (896), OLMo2-13B (1280) and 3296:5312 (1076): 8 a thread.
  const std::pair<int64_t, int64_t> wide[] = {
      {5120, 1024}, {6144, 1024}, {5120, 5120}, {3296, 5312}};
  for (const auto& [q, k] : wide) {
    SCOPED_TRACE(std::to_string(q) + ":" + std::to_string(k));
    const int64_t n = (q + k) / 8;
    s = choose_kernel_shape(q, k, 8, kDefaultBlockThreadsAlone, 1, 0, 8);
    EXPECT_EQ(s.vectors_per_thread, 8);
    EXPECT_EQ(s.group_threads, (n + 8 * 32 - 1) / (8 * 32) * 32);
    EXPECT_TRUE(ShapeIsValid(s, q, k, 8, 1, 8));
    // With peers, in 16-bit 8-byte vectors, and when forced, the count stays the policy's.
    EXPECT_EQ(choose_kernel_shape(q, k, 8, kDefaultBlockThreads, 2, 0, 8).vectors_per_thread, 4);
    EXPECT_EQ(choose_kernel_shape(q, k, 4, kDefaultBlockThreadsAlone, 1, 0, 8).vectors_per_thread,
              4);
    EXPECT_EQ(choose_kernel_shape(q, k, 8, kDefaultBlockThreadsAlone, 1, 4, 8).vectors_per_thread,
              4);
  }
  // Launches of fewer than kEightVectorsMinTokens tokens keep 4.
  EXPECT_EQ(choose_kernel_shape(5120, 5120, 8, kDefaultBlockThreadsAlone, 1, 0, 8,
                                kMaxStagedRowBytes, kEightVectorsMinTokens - 1)
                .vectors_per_thread,
            4);
  EXPECT_EQ(choose_kernel_shape(5120, 5120, 8, kDefaultBlockThreadsAlone, 1, 0, 8,
                                kMaxStagedRowBytes, kEightVectorsMinTokens)
                .vectors_per_thread,
            8);
  // The boundary: 516 vectors need 160 threads at 4.
  EXPECT_EQ(
      choose_kernel_shape(2048, 2080, 8, kDefaultBlockThreadsAlone, 1, 0, 8).vectors_per_thread, 8);
  // Rows that need more than kFp8EightMaxGroupAtFour threads at 4 keep 4: 2048 vectors (512
  // threads) take 8, 2049 (513) and the fuzz's 6720:11408 (2266) take 4.
  EXPECT_EQ(
      choose_kernel_shape(8192, 8192, 8, kDefaultBlockThreadsAlone, 1, 0, 8).vectors_per_thread, 8);
  EXPECT_EQ(
      choose_kernel_shape(8192, 8200, 8, kDefaultBlockThreadsAlone, 1, 0, 8).vectors_per_thread, 4);
  s = choose_kernel_shape(6720, 11408, 8, kDefaultBlockThreadsAlone, 1, 0, 8,
                          kMaxStagedRowBytesAlone);
  EXPECT_EQ(s.vectors_per_thread, 4);
  EXPECT_EQ(s.group_threads, 576);
}

// With peers, rows of 8- or 4-byte vectors of 129 to kNarrowEightMaxVectors vectors take 8 a
// thread in launches of many tokens (one or two warps); 16-byte rows, rows alone, longer rows
// and launches of fewer tokens keep 4.
TEST(ChooseKernelShape, NarrowRowsWithPeersTakeEightVectorsAThread) {
  struct Row {
    int64_t q, k;
    int vec, bytes, world, vpt, group;
  };
  const Row rows[] = {
      {412, 664, 4, 8, 8, 8, 64},     // bf16 3296:5312 at TP 8: 269 8-byte vectors
      {410, 130, 2, 4, 8, 8, 64},     // bf16 3280:1040 at TP 8: 270 4-byte vectors
      {824, 1328, 8, 8, 4, 8, 64},    // fp8 3296:5312 at TP 4: 269 8-byte vectors
      {260, 256, 4, 8, 2, 8, 32},     // 129 vectors: one warp
      {1024, 1024, 4, 8, 2, 8, 64},   // 512 vectors: the bound
      {1028, 1024, 4, 8, 2, 4, 160},  // 513 vectors: 4 a thread
      {640, 640, 8, 16, 8, 4, 64},    // OLMo2-13B at TP 8, 16-byte vectors: 160 vectors, 4
      {412, 664, 4, 8, 1, 4, 96},     // alone
      {256, 256, 4, 8, 2, 4, 32},     // 128 vectors: one warp at 4 already
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(std::to_string(r.q) + ":" + std::to_string(r.k) + " vec " + std::to_string(r.vec) +
                 " of " + std::to_string(r.bytes) + " bytes at TP " + std::to_string(r.world));
    const KernelShape s =
        choose_kernel_shape(r.q, r.k, r.vec, kDefaultBlockThreads, r.world, 0, r.bytes);
    EXPECT_EQ(s.vectors_per_thread, r.vpt);
    EXPECT_EQ(s.group_threads, r.group);
    EXPECT_TRUE(ShapeIsValid(s, r.q, r.k, r.vec, r.world, r.bytes));
    // Fewer tokens keep 4.
    EXPECT_EQ(choose_kernel_shape(r.q, r.k, r.vec, kDefaultBlockThreads, r.world, 0, r.bytes,
                                  kMaxStagedRowBytes, kEightVectorsMinTokens - 1)
                  .vectors_per_thread,
              4);
  }
}

TEST(ChooseVectorBytes, Fp8WithPeersTakesEightBytesOnWideRowsAtFewTokens) {
  const int64_t wide = kFp8FewTokensMinRowBytes + 1;
  for (int world : {2, 4, 8, 16}) {
    for (int64_t tokens : {int64_t{1}, int64_t{16}, kFp8FewTokensMax}) {
      EXPECT_EQ(choose_vector_bytes(1, 16, world, true, 0, tokens, wide), 8) << world;
      // OLMo2-13B's 10240 bytes of fp8 split over TP 2-8 (1280 at TP 8) take 8 too; at TP 16
      // its 640 keep 16.
      EXPECT_EQ(choose_vector_bytes(1, 16, world, true, 0, tokens, 10240 / world),
                world <= 8 ? 8 : 16)
          << world;
      // Rows of at most 64 16-byte vectors (OLMoE at TP 4: 1024 bytes) keep 16.
      EXPECT_EQ(choose_vector_bytes(1, 16, world, true, 0, tokens, kFp8FewTokensMinRowBytes), 16);
      // 16-bit and f32 rows, the kernels without narrower vectors and a forced width: as before.
      EXPECT_EQ(choose_vector_bytes(2, 16, world, true, 0, tokens, 4 * wide), 16);
      EXPECT_EQ(choose_vector_bytes(4, 16, world, true, 0, tokens, 4 * wide), 16);
      EXPECT_EQ(choose_vector_bytes(1, 16, world, false, 0, tokens, wide), 16);
      EXPECT_EQ(choose_vector_bytes(1, 16, world, true, 16, tokens, wide), 16);
      // Rows that allow 8 bytes at most take them either way.
      EXPECT_EQ(choose_vector_bytes(1, 8, world, true, 0, tokens, wide), 8);
    }
    // More tokens, or a count not given: 16-byte vectors with peers.
    EXPECT_EQ(choose_vector_bytes(1, 16, world, true, 0, kFp8FewTokensMax + 1, wide), 16);
    EXPECT_EQ(choose_vector_bytes(1, 16, world, true, 0, 4096, wide), 16);
    EXPECT_EQ(choose_vector_bytes(1, 16, world, true, 0, 0, wide), 16);
  }
  // Alone fp8 takes 8 bytes at every token count and row width.
  for (int64_t tokens : {int64_t{0}, int64_t{1}, int64_t{4096}}) {
    EXPECT_EQ(choose_vector_bytes(1, 16, 1, true, 0, tokens, 512), 8);
  }
}

TEST(ChooseVectorBytes, TheWidestTheRowsAllowAndFp8AloneInEightBytes) {
  for (int world : {1, 2, 8}) {
    for (int size : {1, 2, 4}) {
      const bool fp8_alone = size == 1 && world == 1;
      EXPECT_EQ(choose_vector_bytes(size, 16, world, true), fp8_alone ? 8 : 16) << size;
      EXPECT_EQ(choose_vector_bytes(size, 8, world, true), 8) << size;
      // 4-byte vectors hold two or more elements: 1- and 2-byte types only.
      EXPECT_EQ(choose_vector_bytes(size, 4, world, true), size <= 2 ? 4 : 1) << size;
      EXPECT_EQ(choose_vector_bytes(size, size, world, true), 1) << size;
      // Without narrower kernels (MiniMax-fused, the deterministic mode): 16 bytes or scalar.
      EXPECT_EQ(choose_vector_bytes(size, 16, world, false), 16) << size;
      EXPECT_EQ(choose_vector_bytes(size, 8, world, false), 1) << size;
      EXPECT_EQ(choose_vector_bytes(size, 4, world, false), 1) << size;
      // Forced: that width where the rows allow it, else the widest narrower one.
      EXPECT_EQ(choose_vector_bytes(size, 16, world, true, 16), 16) << size;
      EXPECT_EQ(choose_vector_bytes(size, 16, world, true, 8), 8) << size;
      EXPECT_EQ(choose_vector_bytes(size, 16, world, true, 4), size <= 2 ? 4 : 1) << size;
      EXPECT_EQ(choose_vector_bytes(size, 8, world, true, 4), size <= 2 ? 4 : 1) << size;
      EXPECT_EQ(choose_vector_bytes(size, 16, world, true, 1), 1) << size;
      EXPECT_EQ(choose_vector_bytes(size, 4, world, true, 16), size <= 2 ? 4 : 1) << size;
      EXPECT_EQ(choose_vector_bytes(size, 8, world, true, 16), 8) << size;
      EXPECT_EQ(choose_vector_bytes(size, size, world, true, 16), 1) << size;
    }
  }
  EXPECT_TRUE(testing::throws_error([] { choose_vector_bytes(1, 2, 1, true); },
                                    "rows allow 16, 8, 4 or element-size accesses"));
  EXPECT_TRUE(testing::throws_error([] { choose_vector_bytes(1, 16, 2, true, 0, -1, 2048); },
                                    "tokens and row bytes must be >= 0"));
  EXPECT_TRUE(testing::throws_error([] { choose_vector_bytes(2, 16, 1, true, 2); },
                                    "a forced width is 16, 8, 4 or 1"));
}

TEST(StagedRowBytesLimit, AloneAtTwoStagesWhereTheRingAndWeightsFit) {
  EXPECT_EQ(staged_row_bytes_limit(1, 2, 1), kMaxStagedRowBytesAlone);
  EXPECT_EQ(staged_row_bytes_limit(1, 2, 2), kMaxStagedRowBytes);  // fp8: bf16 weights
  EXPECT_EQ(staged_row_bytes_limit(1, 3, 1), kMaxStagedRowBytes);
  EXPECT_EQ(staged_row_bytes_limit(2, 2, 1), kMaxStagedRowBytes);
  EXPECT_LE(kMaxStagedRowBytesAlone * 3, kMaxStagedSmemBytes);
  // 16192 + 15296 bf16 elements (3936 vectors) stream by default and are staged under the alone
  // limit in 984 threads; 4100 vectors would need more than 1024 threads, and stream.
  EXPECT_EQ(choose_kernel_shape(16192, 15296, 8).vectors_per_thread, 0);
  const KernelShape s = choose_kernel_shape(16192, 15296, 8, kDefaultBlockThreadsAlone, 1, 0, 16,
                                            kMaxStagedRowBytesAlone);
  EXPECT_EQ(s.vectors_per_thread, 4);
  EXPECT_EQ(s.group_threads, 992);
  EXPECT_EQ(s.tokens_per_block, 1);
  EXPECT_EQ(choose_kernel_shape(16400, 16400, 8, kDefaultBlockThreadsAlone, 1, 0, 16,
                                kMaxStagedRowBytesAlone)
                .vectors_per_thread,
            0);
  EXPECT_TRUE(testing::throws_error(
      [] { choose_kernel_shape(2048, 2048, 8, 256, 1, 0, 16, 1 << 20); }, "staged row limit"));
}

TEST(ChooseKernelShape, KnownShapes) {
  // bf16, 4096/1024 at TP 2: 2048 + 512 elements = 320 vectors, 4 a thread, 80 -> 96 threads.
  KernelShape s = choose_kernel_shape(2048, 512, 8);
  EXPECT_EQ(s.vectors_per_thread, 4);
  EXPECT_EQ(s.group_threads, 96);
  EXPECT_EQ(s.tokens_per_block, 2);
  // Narrow rows at TP 8: 256 + 128 bf16 elements = 48 vectors, one warp, 2 vectors a thread.
  s = choose_kernel_shape(256, 128, 8);
  EXPECT_EQ(s.group_threads, 32);
  EXPECT_EQ(s.vectors_per_thread, 2);
  EXPECT_EQ(s.tokens_per_block, 8);
  // 130000 + 8 scalar elements stream, 1024 threads a row.
  s = choose_kernel_shape(130000, 8, 1);
  EXPECT_EQ(s.vectors_per_thread, 0);
  EXPECT_EQ(s.group_threads, 1024);
  EXPECT_EQ(s.block_threads(), 1024);
}

TEST(ChooseKernelShape, BlockThreadsSetsGroupsPerBlock) {
  // OLMoE alone (TP 1): 2048 + 2048 bf16 = 512 vectors, 128-thread groups.
  EXPECT_EQ(choose_kernel_shape(2048, 2048, 8, kDefaultBlockThreads).tokens_per_block, 2);
  EXPECT_EQ(choose_kernel_shape(2048, 2048, 8, kDefaultBlockThreadsAlone).tokens_per_block, 3);
  // OLMo3-32B alone: 5120 + 1024 = 768 vectors, 192-thread groups: one per 256, two per 384.
  EXPECT_EQ(choose_kernel_shape(5120, 1024, 8, 256).tokens_per_block, 1);
  EXPECT_EQ(choose_kernel_shape(5120, 1024, 8, 384).tokens_per_block, 2);
  // A group wider than the target still gets a block; groups of several warps stop at the
  // barrier count, one-warp groups (which need no barrier) fill the block.
  EXPECT_EQ(choose_kernel_shape(5120, 5120, 8, 32).tokens_per_block, 1);
  EXPECT_EQ(choose_kernel_shape(528, 528, 8, 1024).group_threads, 64);  // 132 vectors
  EXPECT_EQ(choose_kernel_shape(528, 528, 8, 1024).tokens_per_block, kMaxGroupsPerBlock);
  // 256 vectors: the deepest ring of 5 x 4 KB rows holds 10 groups in kMaxStagedRingBytes.
  EXPECT_EQ(choose_kernel_shape(1024, 1024, 8, 1024).tokens_per_block, 10);
  EXPECT_EQ(choose_kernel_shape(256, 128, 8, 1024).tokens_per_block, 32);
  for (int bad : {0, 31, 1025}) {
    EXPECT_TRUE(testing::throws_error([&] { choose_kernel_shape(2048, 2048, 8, bad); },
                                      "block_threads must be in [32, 1024]"));
  }
}

TEST(PipelineDepth, DefersLog2WorldWithOneRowAhead) {
  struct Want {
    int world, stages, defer;
  };
  // Alone nothing is deferred; with peers D = log2(world) capped at kMaxStages - 2, stages D + 2.
  for (const Want w : {Want{1, 2, 0}, Want{2, 3, 1}, Want{3, 3, 1}, Want{4, 4, 2}, Want{6, 4, 2},
                       Want{8, 5, 3}, Want{16, 5, 3}, Want{32, 5, 3}}) {
    const PipelineDepth d = choose_pipeline_depth(w.world);
    EXPECT_EQ(d.stages, w.stages) << "world " << w.world;
    EXPECT_EQ(d.defer, w.defer) << "world " << w.world;
    // The staged rows always hold the reduced one and the deferred ones.
    EXPECT_GE(d.stages - 1 - d.defer, 0) << "world " << w.world;
    EXPECT_GE(d.stages, kMinStages);
    EXPECT_LE(d.stages, kMaxStages);
  }
}

TEST(PipelineDepth, ShallowCandidateOnlyForManyRanksAndFewTokens) {
  for (const int world : {8, 16}) {
    for (const int64_t tokens : {int64_t{0}, int64_t{1}, int64_t{64}, kShallowMaxTokens}) {
      const PipelineDepth d = shallow_pipeline_depth(world, tokens);
      EXPECT_EQ(d.stages, 3) << "world " << world << ", " << tokens << " tokens";
      EXPECT_EQ(d.defer, 2) << "world " << world << ", " << tokens << " tokens";
    }
    EXPECT_EQ(shallow_pipeline_depth(world, kShallowMaxTokens + 1).stages, 0);
  }
  for (const int world : {1, 2, 4, 6, 7}) {
    EXPECT_EQ(shallow_pipeline_depth(world, 64).stages, 0) << "world " << world;
    EXPECT_EQ(shallow_pipeline_depth(world, 64).defer, 0) << "world " << world;
  }
  EXPECT_TRUE(testing::throws_error([] { shallow_pipeline_depth(0, 64); }, "world must be >= 1"));
  EXPECT_TRUE(testing::throws_error([] { shallow_pipeline_depth(8, -1); }, "tokens >= 0"));
}

TEST(PipelineDepth, FewTokensAtTp4To8TakeThreeStagesAndOneDeferred) {
  for (const int world : {4, 5, 6, 8}) {
    for (const int64_t tokens :
         {int64_t{0}, int64_t{1}, int64_t{64}, int64_t{1536}, kFewTokensMax}) {
      const PipelineDepth d = few_token_pipeline_depth(world, tokens);
      EXPECT_EQ(d.stages, 3) << "world " << world << ", " << tokens << " tokens";
      EXPECT_EQ(d.defer, 1) << "world " << world << ", " << tokens << " tokens";
      // Like every pipeline with peers it keeps one row loading ahead.
      EXPECT_EQ(d.stages - 1 - d.defer, 1) << "world " << world;
    }
    // Past the threshold the world's own depth (and, at TP 8, the shallow choice) applies.
    EXPECT_EQ(few_token_pipeline_depth(world, kFewTokensMax + 1).stages, 0) << "world " << world;
    EXPECT_EQ(few_token_pipeline_depth(world, 16384).defer, 0) << "world " << world;
  }
  // TP 2 and 3 run 3 stages with D = 1 anyway; alone nothing is deferred; from TP 9 on (TP 16
  // measured: 3 stages and D = 1 up to 13.6 us slower at 1536-3072 tokens) the rule does not apply.
  for (const int world : {1, 2, 3, kFewTokensMaxWorld + 1, 16}) {
    EXPECT_EQ(few_token_pipeline_depth(world, 64).stages, 0) << "world " << world;
    EXPECT_EQ(few_token_pipeline_depth(world, 64).defer, 0) << "world " << world;
  }
  EXPECT_EQ(choose_pipeline_depth(2).stages, 3);
  EXPECT_EQ(choose_pipeline_depth(2).defer, 1);
  EXPECT_TRUE(testing::throws_error([] { few_token_pipeline_depth(0, 64); }, "world must be >= 1"));
  EXPECT_TRUE(testing::throws_error([] { few_token_pipeline_depth(4, -1); }, "tokens >= 0"));
}

TEST(PipelineDepth, ShallowTakenForAnyGainAtFewTokensAndForDoubleGainUpToTheCap) {
  // Up to kShallowAnyGainTokens any gain in resident groups takes it; none or a loss never does.
  for (const int64_t tokens : {int64_t{0}, int64_t{1}, int64_t{64}, kShallowAnyGainTokens}) {
    EXPECT_TRUE(take_shallow_pipeline(tokens, 396, 528)) << tokens;   // 3 -> 4 blocks an SM
    EXPECT_TRUE(take_shallow_pipeline(tokens, 264, 528)) << tokens;   // 2 -> 4
    EXPECT_FALSE(take_shallow_pipeline(tokens, 528, 528)) << tokens;  // registers cap both
    EXPECT_FALSE(take_shallow_pipeline(tokens, 528, 396)) << tokens;
  }
  // Past it, up to kShallowMaxTokens, only at least twice the groups does.
  for (const int64_t tokens : {kShallowAnyGainTokens + 1, int64_t{4096}, kShallowMaxTokens}) {
    EXPECT_FALSE(take_shallow_pipeline(tokens, 396, 528)) << tokens;
    EXPECT_FALSE(take_shallow_pipeline(tokens, 265, 528)) << tokens;
    EXPECT_TRUE(take_shallow_pipeline(tokens, 264, 528)) << tokens;
    EXPECT_TRUE(take_shallow_pipeline(tokens, 132, 528)) << tokens;
  }
  // Past the cap, never.
  for (const int64_t tokens : {kShallowMaxTokens + 1, int64_t{8192}, int64_t{16384}}) {
    EXPECT_FALSE(take_shallow_pipeline(tokens, 264, 528)) << tokens;
    EXPECT_FALSE(take_shallow_pipeline(tokens, 132, 528)) << tokens;
  }
  EXPECT_TRUE(testing::throws_error([] { take_shallow_pipeline(-1, 1, 2); }, "must be >= 0"));
  EXPECT_TRUE(testing::throws_error([] { take_shallow_pipeline(64, -1, 2); }, "must be >= 0"));
}

TEST(PipelineDepth, OverridesAreCutToFit) {
  EXPECT_EQ(choose_pipeline_depth(1, 4, 0).stages, 4);
  EXPECT_EQ(choose_pipeline_depth(1, 4, 3).defer, 0);      // alone nothing waits
  const PipelineDepth a = choose_pipeline_depth(8, 2, 0);  // forced shallow: D cut to 1
  EXPECT_EQ(a.stages, 2);
  EXPECT_EQ(a.defer, 1);
  const PipelineDepth b = choose_pipeline_depth(8, 0, 1);  // forced D 1: stages follow
  EXPECT_EQ(b.stages, 3);
  EXPECT_EQ(b.defer, 1);
  const PipelineDepth c = choose_pipeline_depth(2, 3, 4);  // D 4 in 3 stages: cut to 2
  EXPECT_EQ(c.stages, 3);
  EXPECT_EQ(c.defer, 2);
  EXPECT_TRUE(testing::throws_error([] { choose_pipeline_depth(0); }, "world must be >= 1"));
  EXPECT_TRUE(testing::throws_error([] { choose_pipeline_depth(2, 6, 0); }, "stages must be 0 or"));
  EXPECT_TRUE(testing::throws_error([] { choose_pipeline_depth(2, 0, 5); }, "defer must be in"));
}

TEST(ChooseKernelShape, BoundariesOfEachRegime) {
  // n = vectors per row; the q/k split does not matter, only the total.
  for (int64_t n : {1,   2,   31,  32,  33,   63,   64,   65,   127,  128,   129,
                    130, 255, 256, 257, 1000, 2047, 2048, 2049, 4096, 100000}) {
    for (int64_t q : {int64_t{0}, n / 2, n - 1}) {
      if (q < 0 || n - q <= 0) continue;
      for (int vec : kVec) {
        SCOPED_TRACE("n " + std::to_string(n) + " q " + std::to_string(q) + " vec " +
                     std::to_string(vec));
        const KernelShape s = choose_kernel_shape(q * vec, (n - q) * vec, vec);
        EXPECT_TRUE(ShapeIsValid(s, q * vec, (n - q) * vec, vec));
      }
    }
  }
  EXPECT_EQ(choose_kernel_shape(2048 * 8, 0, 8).vectors_per_thread, 4);
  EXPECT_EQ(choose_kernel_shape(2048 * 8, 0, 8).group_threads, 512);
  EXPECT_EQ(choose_kernel_shape(2048 * 8, 8, 8).vectors_per_thread, 0);
  // The scalar path always streams, about 8 elements a thread, in whole warps.
  EXPECT_EQ(choose_kernel_shape(32, 0, 1).vectors_per_thread, 0);
  EXPECT_EQ(choose_kernel_shape(256, 0, 1).group_threads, 32);
  EXPECT_EQ(choose_kernel_shape(257, 0, 1).group_threads, 64);
  EXPECT_EQ(choose_kernel_shape(1 << 20, 0, 1).group_threads, 1024);
  // Staged rows: 1, 2 or 4 vectors a thread by row length.
  EXPECT_EQ(choose_kernel_shape(32 * 8, 0, 8).vectors_per_thread, 1);
  EXPECT_EQ(choose_kernel_shape(33 * 8, 0, 8).vectors_per_thread, 2);
  EXPECT_EQ(choose_kernel_shape(65 * 8, 0, 8).vectors_per_thread, 4);
  EXPECT_EQ(choose_kernel_shape(128 * 8, 0, 8).group_threads, 32);
  EXPECT_EQ(choose_kernel_shape(129 * 8, 0, 8).group_threads, 64);
}

// A forced vector count (LaunchTuning::vectors_per_thread) sets the vectors per thread of staged
// rows: the row then takes the fewest lanes, down to 8 (and never fewer than the ranks, which
// each need a lane of the exchange).
TEST(ChooseKernelShape, ForcedVectorsPerThreadPacksShortRowsIntoPartWarps) {
  // OLMoE at TP 8, bf16: 256 + 256 elements = 64 vectors.
  KernelShape s = choose_kernel_shape(256, 256, 8, 256, 8, 4);
  EXPECT_EQ(s.vectors_per_thread, 4);
  EXPECT_EQ(s.group_threads, 16);
  EXPECT_EQ(s.tokens_per_block, 16);
  s = choose_kernel_shape(256, 256, 8, 256, 8, 8);
  EXPECT_EQ(s.group_threads, 8);
  EXPECT_EQ(s.tokens_per_block, 32);
  EXPECT_EQ(choose_kernel_shape(256, 256, 8, 256, 16, 8).group_threads, 16);  // a lane per rank
  EXPECT_EQ(choose_kernel_shape(256, 256, 8, 256, 32, 8).group_threads, 32);
  EXPECT_EQ(choose_kernel_shape(256, 256, 8, 256, 1, 8).group_threads, 8);
  // 96 vectors (OLMo3-32B at TP 8) at 8 a thread: 12 lanes, rounded up to 16.
  EXPECT_EQ(choose_kernel_shape(640, 128, 8, 256, 8, 8).group_threads, 16);
  // Longer rows stay whole warps: 512 vectors at 8 a thread.
  s = choose_kernel_shape(2048, 2048, 8, 256, 2, 8);
  EXPECT_EQ(s.group_threads, 64);
  EXPECT_EQ(s.tokens_per_block, 4);
  // Streaming rows ignore the override.
  EXPECT_EQ(choose_kernel_shape(2048 * 8, 8, 8, 256, 2, 8).vectors_per_thread, 0);
  EXPECT_EQ(choose_kernel_shape(256, 256, 1, 256, 2, 8).vectors_per_thread, 0);
  // The ring of staged rows bounds the groups of a large block: 5 stages x 1 KB rows.
  EXPECT_EQ(choose_kernel_shape(256, 256, 8, 1024, 8, 8).tokens_per_block,
            kMaxStagedRingBytes / (kMaxStages * 16 * 64));
  // Without the override the layout does not depend on the group size.
  for (int world : {1, 2, 4, 8, 16}) {
    const KernelShape d = choose_kernel_shape(256, 256, 8, 256, world);
    EXPECT_EQ(d.group_threads, 32);
    EXPECT_EQ(d.vectors_per_thread, 2);
  }
  // Every forced value on every regime's boundary gives a valid layout.
  for (int64_t n : {1, 7, 8, 9, 16, 17, 64, 65, 128, 255, 256, 257, 1000, 2048}) {
    for (int world : {1, 2, 8, 16, 32}) {
      for (int vpt : {1, 2, 4, 8}) {
        SCOPED_TRACE("n " + std::to_string(n) + " world " + std::to_string(world) + " vpt " +
                     std::to_string(vpt));
        if ((n + vpt - 1) / vpt > 1024) {
          EXPECT_TRUE(testing::throws_error(
              [&] { choose_kernel_shape(n * 8, 0, 8, 256, world, vpt); }, "more than 1024"));
          continue;
        }
        const KernelShape f = choose_kernel_shape(n * 8, 0, 8, 256, world, vpt);
        EXPECT_EQ(f.vectors_per_thread, vpt);
        EXPECT_TRUE(ShapeIsValid(f, n * 8, 0, 8, world));
      }
    }
  }
}

// With peers, rows of up to kMaxPackedVectors vectors have a packed alternative: 4 vectors a
// thread in groups of 16 or 8 lanes, at least one lane per rank (the launch takes it when the GPU
// is full).
TEST(ChooseKernelShape, PackedShapeForShortRowsWithPeers) {
  // OLMoE at TP 8, bf16: 64 vectors -> 16 lanes, 16 groups in 256 threads.
  KernelShape s = packed_kernel_shape(256, 256, 8, 256, 8);
  EXPECT_EQ(s.vectors_per_thread, 4);
  EXPECT_EQ(s.group_threads, 16);
  EXPECT_EQ(s.tokens_per_block, 16);
  EXPECT_TRUE(ShapeIsValid(s, 256, 256, 8, 8));
  // 8 vectors at TP 2: 2 lanes would do, the floor is 8.
  EXPECT_EQ(packed_kernel_shape(32, 32, 8, 256, 2).group_threads, kMinGroupThreads);
  // 16 ranks need 16 lanes.
  EXPECT_EQ(packed_kernel_shape(32, 32, 8, 256, 16).group_threads, 16);
  // Not applicable: alone, more ranks than a 16-lane group serves, longer rows, scalar path,
  // streamed rows.
  EXPECT_EQ(packed_kernel_shape(256, 256, 8, 256, 1).vectors_per_thread, 0);
  EXPECT_EQ(packed_kernel_shape(256, 256, 8, 256, 32).vectors_per_thread, 0);
  EXPECT_EQ(packed_kernel_shape(264, 256, 8, 256, 8).vectors_per_thread, 0);  // 65 vectors
  EXPECT_EQ(packed_kernel_shape(256, 256, 1, 256, 8).vectors_per_thread, 0);
  // Every row length up to the limit, every dtype's vector and every group size: valid.
  for (int world : {2, 4, 8, 16}) {
    for (int vec : {4, 8, 16}) {
      for (int64_t n = 1; n <= kMaxPackedVectors; ++n) {
        const KernelShape p = packed_kernel_shape(n * vec, 0, vec, kDefaultBlockThreads, world);
        SCOPED_TRACE("n " + std::to_string(n) + " world " + std::to_string(world));
        EXPECT_EQ(p.vectors_per_thread, 4);
        EXPECT_LE(p.group_threads, 16);
        EXPECT_TRUE(ShapeIsValid(p, n * vec, 0, vec, world));
      }
    }
  }
}

TEST(GridIsFull, WhenResidencyCapsTheGrid) {
  // 132 SMs x 4 blocks, 8 virtual ranks: 66 blocks each; 8 tokens a block.
  EXPECT_FALSE(grid_is_full(64, 8, 8, 4, 132, 0));   // 8 blocks wanted
  EXPECT_FALSE(grid_is_full(528, 8, 8, 4, 132, 0));  // 66 wanted, 66 fit
  EXPECT_TRUE(grid_is_full(529, 8, 8, 4, 132, 0));   // 67 wanted
  EXPECT_TRUE(grid_is_full(4096, 8, 8, 4, 132, 0));
  EXPECT_TRUE(grid_is_full(64, 8, 8, 4, 132, 2));  // an SM budget of 2: one block a rank
  EXPECT_FALSE(grid_is_full(8, 8, 8, 4, 132, 2));
}

TEST(ResidentBlocks, OccupancyTimesTheSmsInTheBudget) {
  EXPECT_EQ(resident_blocks(4, 132, 0), 528);
  EXPECT_EQ(resident_blocks(4, 132, 2), 8);
  EXPECT_EQ(resident_blocks(4, 132, 500), 528);  // a budget above the SM count
  EXPECT_EQ(resident_blocks(0, 132, 0), 0);
  // The packed layout of TP 8 OLMoE holds 2 blocks an SM: a budget of 2 SMs leaves 4 < 8 ranks,
  // so the launch keeps the unpacked one (4 an SM, 8 blocks).
  EXPECT_LT(resident_blocks(2, 132, 2), 8);
  EXPECT_GE(resident_blocks(4, 132, 2), 8);
}

TEST(ChooseKernelShape, BadArgumentsThrow) {
  EXPECT_TRUE(testing::throws_error([] { choose_kernel_shape(2048, 100, 8); }, "multiples"));
  EXPECT_TRUE(testing::throws_error([] { choose_kernel_shape(2044, 1024, 8); }, "multiples"));
  EXPECT_TRUE(testing::throws_error([] { choose_kernel_shape(2048, 1024, 0); }, "vector size"));
  EXPECT_TRUE(testing::throws_error([] { choose_kernel_shape(2048, 1024, -8); }, "vector size"));
  EXPECT_TRUE(testing::throws_error([] { choose_kernel_shape(0, 0, 8); }, "empty rows"));
  EXPECT_THROW(choose_kernel_shape(12, 4, 8), Error);
  EXPECT_TRUE(testing::throws_error([] { choose_kernel_shape(2048, 1024, 8, 256, 0); }, "world"));
  for (int bad : {-1, 3, 5, 16}) {
    EXPECT_TRUE(testing::throws_error([&] { choose_kernel_shape(2048, 1024, 8, 256, 2, bad); },
                                      "forced vectors per thread"));
  }
}

// ---------------------------------------------------------------- plan_grid

TEST(PlanGrid, NeverExceedsResidency) {
  int planned = 0, refused = 0;
  for (int64_t tokens : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{64}, int64_t{1000},
                         int64_t{100000}, int64_t{1} << 40}) {
    for (int ranks : {1, 2, 4, 8}) {
      for (int tpb : {1, 2, 8}) {
        for (int occ : {1, 2, 4, 16}) {
          for (int sms : {1, 8, 132}) {
            for (int budget : {0, 1, 4, 132, 1000}) {
              SCOPED_TRACE("tokens " + std::to_string(tokens) + " ranks " + std::to_string(ranks) +
                           " tpb " + std::to_string(tpb) + " occ " + std::to_string(occ) + " sms " +
                           std::to_string(sms) + " budget " + std::to_string(budget));
              const int64_t usable = budget == 0 ? sms : std::min(budget, sms);
              const int64_t resident = static_cast<int64_t>(occ) * usable;
              if (resident < ranks) {
                EXPECT_TRUE(testing::throws_error(
                    [&] { plan_grid(tokens, ranks, tpb, occ, sms, budget); }, "resident"));
                ++refused;
                continue;
              }
              const GridPlan g = plan_grid(tokens, ranks, tpb, occ, sms, budget);
              ++planned;
              EXPECT_EQ(g.ranks, ranks);
              EXPECT_GE(g.blocks_per_rank, 1);
              EXPECT_EQ(g.grid(), g.ranks * g.blocks_per_rank);
              EXPECT_LE(g.grid(), resident);
              // No more blocks than there are token groups (at least one).
              const int64_t wanted = std::max<int64_t>(1, (tokens + tpb - 1) / tpb);
              EXPECT_LE(g.blocks_per_rank, wanted);
              // And as many as residency allows otherwise.
              EXPECT_EQ(g.blocks_per_rank, std::min(wanted, resident / ranks));
            }
          }
        }
      }
    }
  }
  EXPECT_GT(planned, 0);
  EXPECT_GT(refused, 0);
}

TEST(PlanGrid, ZeroTokensStillOneBlockPerRank) {
  for (int ranks : {1, 2, 8}) {
    const GridPlan g = plan_grid(0, ranks, 4, 2, 132, 0);
    EXPECT_EQ(g.blocks_per_rank, 1);
    EXPECT_EQ(g.grid(), ranks);
  }
}

TEST(PlanGrid, BudgetClampsToSmCount) {
  EXPECT_EQ(plan_grid(1 << 20, 1, 1, 2, 132, 1000).grid(), 264);
  EXPECT_EQ(plan_grid(1 << 20, 1, 1, 2, 132, 0).grid(), 264);
  EXPECT_EQ(plan_grid(1 << 20, 2, 1, 2, 132, 8).grid(), 16);
  EXPECT_EQ(plan_grid(1 << 20, 2, 1, 2, 132, 8).blocks_per_rank, 8);
  // 3 ranks, 16 resident blocks: 5 each, one resident slot unused.
  EXPECT_EQ(plan_grid(1 << 20, 3, 1, 2, 132, 8).blocks_per_rank, 5);
}

TEST(PlanGrid, BudgetTooSmallForOneBlockPerRankThrows) {
  // 8 ranks need 8 resident blocks; 4 SMs x 1 block hold 4.
  EXPECT_TRUE(testing::throws_error([] { plan_grid(64, 8, 1, 1, 132, 4); },
                                    "8 ranks in one launch need at least one resident block each"));
  EXPECT_TRUE(testing::throws_error([] { plan_grid(64, 8, 1, 1, 132, 4); }, "only 4 fit"));
  EXPECT_TRUE(testing::throws_error([] { plan_grid(64, 4, 1, 1, 2, 0); }, "resident"));
  EXPECT_NO_THROW(plan_grid(64, 8, 1, 2, 132, 4));
}

TEST(PlanGrid, BadArgumentsThrow) {
  EXPECT_TRUE(testing::throws_error([] { plan_grid(64, 2, 1, 0, 132, 0); }, "occupancy 0"));
  EXPECT_TRUE(testing::throws_error([] { plan_grid(64, 0, 1, 2, 132, 0); }, "must be positive"));
  EXPECT_TRUE(testing::throws_error([] { plan_grid(64, 2, 0, 2, 132, 0); }, "must be positive"));
  EXPECT_TRUE(testing::throws_error([] { plan_grid(64, 2, 1, 2, 0, 0); }, "must be positive"));
  EXPECT_TRUE(testing::throws_error([] { plan_grid(64, 2, 1, 2, 132, -1); }, "sm_budget"));
}

TEST(BlockOrder, InterleavedFrom2048TokensWithSeveralRanks) {
  EXPECT_EQ(choose_block_order(2, kInterleaveMinTokens), BlockOrder::kInterleaved);
  EXPECT_EQ(choose_block_order(8, 16384), BlockOrder::kInterleaved);
  EXPECT_EQ(choose_block_order(2, kInterleaveMinTokens - 1), BlockOrder::kRankMajor);
  EXPECT_EQ(choose_block_order(8, 64), BlockOrder::kRankMajor);
  // One rank per launch (TP 1, or one process per GPU): nothing to interleave.
  EXPECT_EQ(choose_block_order(1, 16384), BlockOrder::kRankMajor);
}
}  // namespace
}  // namespace swiftqk
