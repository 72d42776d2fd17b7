// Tests for make_launch_plan (launch_plan.hpp): its choices for the five model shapes on a model
// of an H200's residency, the tuning's overrides, chunking and the deterministic mode's shape.
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

// ---------------------------------------------------------------- make_launch_plan

// The residency of an H200-like GPU, for the policy to weigh: 132 SMs, 64 K registers, 2048
// threads, 32 blocks and 228 KB of shared memory an SM (1 KB of it reserved a block). The
// kernels' registers per thread are their caps: 48 alone, 64 with peers. A model, not the
// compiled kernels: the pins below show how the policy answers it, so that a change of the
// policy shows up here.
struct GpuModel {
  int64_t row_vectors;  // vectors of one rank's Q and K row
  std::size_t weight_bytes;
  bool alone;
  mutable std::vector<KernelCandidate> asked;
  KernelFootprint operator()(const KernelCandidate& c) const {
    asked.push_back(c);
    KernelFootprint f;
    if (c.shape.vectors_per_thread > 0) {  // the kernel's staged_smem_bytes
      const std::size_t ring = static_cast<std::size_t>(c.depth.stages) * c.shape.tokens_per_block *
                               row_vectors * c.shape.vec_bytes;
      f.smem_bytes = (ring + 15) / 16 * 16 + weight_bytes;
    }
    const int threads = c.shape.block_threads();
    const int regs = alone ? 48 : 64;
    int blocks = std::min({2048 / threads, 65536 / (regs * threads), 32});
    if (f.smem_bytes > 0) {
      blocks = std::min<int>(blocks, static_cast<int>(228 * 1024 / (f.smem_bytes + 1024)));
    }
    f.blocks_per_sm = blocks;
    return f;
  }
};

constexpr int kH200Sms = 132;

struct ModelShape {
  const char* name;
  int64_t q, k;
};
// The benchmark's five models (bench/bench_common.hpp, docs/design.md).
const ModelShape kModels[] = {{"olmoe", 2048, 2048},
                              {"olmo2-7b", 4096, 4096},
                              {"olmo2-13b", 5120, 5120},
                              {"olmo3-32b", 5120, 1024},
                              {"minimax-m2", 6144, 1024}};

// bf16 rows of every rank 16-byte aligned, TP `world` as virtual ranks in one launch.
LaunchRequest bf16_request(const ModelShape& m, int world, int64_t tokens,
                           const LaunchTuning& tuning = {}) {
  LaunchRequest r;
  r.world = world;
  r.ranks = world;
  r.ranks_on_device = world;
  r.tokens = tokens;
  r.q_full_width = m.q;
  r.k_full_width = m.k;
  r.vec_elems = 8;
  r.token_capacity = 16384;
  r.sm_count = kH200Sms;
  r.tuning = tuning;
  return r;
}

GpuModel model_for(const LaunchRequest& r) {
  const int64_t qw = r.q_full_width / r.world, kw = r.k_full_width / r.world;
  return GpuModel{
      qw / r.vec_elems + kw / r.vec_elems, static_cast<std::size_t>(qw + kw) * 2, r.world == 1, {}};
}

LaunchPlan plan_of(const LaunchRequest& r) {
  const GpuModel gpu = model_for(r);
  return make_launch_plan(r, std::cref(gpu));
}

// What the tuned policy chooses for one call.
struct Pin {
  const char* model;
  int tp;
  int64_t tokens;
  int vpt, group_threads, tokens_per_block;
  int stages, defer;
  SlotLayout slots;
  BlockOrder blocks;
  int blocks_per_rank;
};

std::string describe(const LaunchPlan& p) {
  const ChunkPlan c = p.chunk(0);
  return "vpt " + std::to_string(p.shape.vectors_per_thread) + ", group " +
         std::to_string(p.shape.group_threads) + " x " + std::to_string(p.shape.tokens_per_block) +
         ", " + std::to_string(p.depth.stages) + " stages D " + std::to_string(p.depth.defer) +
         ", slots " + std::to_string(static_cast<int>(c.orders.slots)) + ", blocks " +
         std::to_string(static_cast<int>(c.orders.blocks)) + ", " +
         std::to_string(c.grid.blocks_per_rank) + " blocks a rank";
}

constexpr SlotLayout kTM = SlotLayout::kTokenMajor;
constexpr SlotLayout kSM = SlotLayout::kSourceMajor;
constexpr BlockOrder kRM = BlockOrder::kRankMajor;
constexpr BlockOrder kIL = BlockOrder::kInterleaved;

// At 64 tokens (decode) and 4096 (prefill) for every model and TP 1-8 as virtual ranks (with
// peers at 64 tokens rows over more threads where their blocks still have an SM each), and
// OLMoE at the token counts where its layout changes: at TP 8 the packed rows (from a full grid)
// with source-major slots from 256 tokens, the few-token ring up to 2048, the shallow one at
// 4096 (twice the groups), the world's ring at 16384; at TP 4 the few-token ring's last count.
// clang-format off
const Pin kPins[] = {
    // model, TP, tokens; vectors a thread, group threads, groups a block; stages, D; orders;
    // blocks a rank
    {"olmoe",      1,    64, 2, 256,  1, 2, 0, kTM, kRM,  64},
    {"olmoe",      1,  4096, 4, 128,  3, 2, 0, kTM, kRM, 396},
    {"olmoe",      2,    64, 1, 256,  1, 3, 1, kTM, kRM,  64},
    {"olmoe",      2,  4096, 4,  64,  4, 3, 1, kTM, kIL, 264},
    {"olmoe",      4,    64, 4,  32,  8, 3, 1, kTM, kRM,   8},
    {"olmoe",      4,  2048, 4,  32,  8, 3, 1, kTM, kIL, 132},
    {"olmoe",      4,  4096, 4,  32,  8, 4, 2, kTM, kIL,  99},
    {"olmoe",      8,     1, 2,  32,  8, 3, 1, kTM, kRM,   1},
    {"olmoe",      8,    64, 2,  32,  8, 3, 1, kTM, kRM,   8},
    {"olmoe",      8,  1024, 4,  16, 16, 3, 1, kSM, kRM,  64},
    {"olmoe",      8,  2048, 4,  16, 16, 3, 1, kSM, kIL,  66},
    {"olmoe",      8,  4096, 4,  16, 16, 3, 2, kSM, kIL,  66},
    {"olmoe",      8, 16384, 4,  16, 16, 5, 3, kSM, kIL,  33},
    {"olmo2-7b",   1,    64, 4, 256,  1, 2, 0, kTM, kRM,  64},
    {"olmo2-7b",   1,  4096, 4, 256,  1, 2, 0, kTM, kRM, 528},
    {"olmo2-7b",   2,    64, 2, 256,  1, 3, 1, kTM, kRM,  64},
    {"olmo2-7b",   2,  4096, 4, 128,  2, 3, 1, kTM, kIL, 264},
    {"olmo2-7b",   4,    64, 2, 128,  2, 3, 1, kTM, kRM,  32},
    {"olmo2-7b",   4,  4096, 4,  64,  4, 4, 2, kTM, kIL,  99},
    {"olmo2-7b",   8,    64, 4,  32,  8, 3, 1, kTM, kRM,   8},
    {"olmo2-7b",   8,  4096, 4,  32,  8, 3, 2, kTM, kIL,  66},
    {"olmo2-13b",  1,    64, 4, 320,  1, 2, 0, kTM, kRM,  64},
    {"olmo2-13b",  1,  4096, 4, 320,  1, 2, 0, kTM, kRM, 396},
    {"olmo2-13b",  2,    64, 4, 160,  1, 3, 1, kTM, kRM,  64},
    {"olmo2-13b",  2,  4096, 4, 160,  1, 3, 1, kTM, kIL, 330},
    {"olmo2-13b",  4,    64, 4,  96,  2, 3, 1, kTM, kRM,  32},
    {"olmo2-13b",  4,  4096, 4,  96,  2, 4, 2, kTM, kIL, 132},
    {"olmo2-13b",  8,    64, 4,  64,  4, 3, 1, kTM, kRM,  16},
    {"olmo2-13b",  8,  4096, 4,  64,  4, 5, 3, kTM, kIL,  66},
    {"olmo3-32b",  1,    64, 2, 384,  1, 2, 0, kTM, kRM,  64},
    {"olmo3-32b",  1,  4096, 4, 192,  2, 2, 0, kTM, kRM, 396},
    {"olmo3-32b",  2,    64, 2, 192,  1, 3, 1, kTM, kRM,  64},
    {"olmo3-32b",  2,  4096, 4,  96,  2, 3, 1, kTM, kIL, 330},
    {"olmo3-32b",  4,    64, 2,  96,  2, 3, 1, kTM, kRM,  32},
    {"olmo3-32b",  4,  4096, 4,  64,  4, 4, 2, kTM, kIL, 132},
    {"olmo3-32b",  8,    64, 4,  32,  8, 3, 1, kTM, kRM,   8},
    {"olmo3-32b",  8,  4096, 4,  32,  8, 5, 3, kTM, kIL,  49},
    {"minimax-m2", 1,    64, 4, 224,  1, 2, 0, kTM, kRM,  64},
    {"minimax-m2", 1,  4096, 4, 224,  1, 2, 0, kTM, kRM, 660},
    {"minimax-m2", 2,    64, 2, 224,  1, 3, 1, kTM, kRM,  64},
    {"minimax-m2", 2,  4096, 4, 128,  2, 3, 1, kTM, kIL, 264},
    {"minimax-m2", 4,    64, 2, 128,  2, 3, 1, kTM, kRM,  32},
    {"minimax-m2", 4,  4096, 4,  64,  4, 4, 2, kTM, kIL,  99},
    {"minimax-m2", 8,    64, 4,  32,  8, 3, 1, kTM, kRM,   8},
    {"minimax-m2", 8,  4096, 4,  32,  8, 5, 3, kTM, kIL,  49},
};
// clang-format on

TEST(MakeLaunchPlan, TunedChoicesForTheFiveModels) {
  for (const Pin& w : kPins) {
    const ModelShape& m =
        *std::find_if(std::begin(kModels), std::end(kModels),
                      [&](const ModelShape& s) { return std::string(s.name) == w.model; });
    const LaunchPlan p = plan_of(bf16_request(m, w.tp, w.tokens));
    SCOPED_TRACE(std::string(w.model) + " TP " + std::to_string(w.tp) + ", " +
                 std::to_string(w.tokens) + " tokens: " + describe(p));
    EXPECT_EQ(p.shape.vectors_per_thread, w.vpt);
    EXPECT_EQ(p.shape.group_threads, w.group_threads);
    EXPECT_EQ(p.shape.tokens_per_block, w.tokens_per_block);
    EXPECT_EQ(p.depth.stages, w.stages);
    EXPECT_EQ(p.depth.defer, w.defer);
    ASSERT_EQ(p.chunks, 1);
    EXPECT_EQ(p.chunk(0).orders.slots, w.slots);
    EXPECT_EQ(p.chunk(0).orders.blocks, w.blocks);
    EXPECT_EQ(p.chunk(0).grid.blocks_per_rank, w.blocks_per_rank);
    EXPECT_EQ(p.chunk(0).grid.ranks, w.tp);
    EXPECT_EQ(p.chunk(0).tokens, w.tokens);
  }
}

TEST(MakeLaunchPlan, TheFootprintIsAskedForEachOrderTheChunksTake) {
  // OLMoE at TP 8, 16500 tokens in chunks of 16384: the first chunk is source-major and
  // interleaved, the last (116 tokens) token-major and rank-major. The residency counts both.
  LaunchRequest r = bf16_request(kModels[0], 8, 16500);
  const GpuModel gpu = model_for(r);
  const LaunchPlan p = make_launch_plan(r, std::cref(gpu));
  ASSERT_EQ(p.chunks, 2);
  const ChunkPlan a = p.chunk(0), b = p.chunk(1);
  EXPECT_EQ(a.first_token, 0);
  EXPECT_EQ(a.tokens, 16384);
  EXPECT_EQ(a.orders, (ChunkOrders{kSM, kIL}));
  EXPECT_EQ(b.first_token, 16384);
  EXPECT_EQ(b.tokens, 116);
  EXPECT_EQ(b.orders, (ChunkOrders{kTM, kRM}));
  EXPECT_EQ(b.grid.blocks_per_rank,
            (116 + p.shape.tokens_per_block - 1) / p.shape.tokens_per_block);
  bool asked_first = false, asked_last = false;
  for (const KernelCandidate& c : gpu.asked) {
    asked_first = asked_first || c.orders == a.orders;
    asked_last = asked_last || c.orders == b.orders;
  }
  EXPECT_TRUE(asked_first);
  EXPECT_TRUE(asked_last);
  // Three chunks of one length but the last: chunk(i) steps by the chunk length.
  r.token_capacity = 100;
  r.tokens = 250;
  const LaunchPlan q = plan_of(r);
  ASSERT_EQ(q.chunks, 3);
  EXPECT_EQ(q.chunk(1).first_token, 100);
  EXPECT_EQ(q.chunk(1).tokens, 100);
  EXPECT_EQ(q.chunk(2).first_token, 200);
  EXPECT_EQ(q.chunk(2).tokens, 50);
  EXPECT_TRUE(testing::throws_error([&] { q.chunk(3); }, "chunk 3 of 3"));
  EXPECT_TRUE(testing::throws_error([&] { q.chunk(-1); }, "chunk -1 of 3"));
}

TEST(MakeLaunchPlan, ResidencyIsTheSmallerOfTheTwoKernels) {
  LaunchRequest r = bf16_request(kModels[0], 8, 16500);
  const GpuModel gpu = model_for(r);
  // The last chunk's kernel fits one block an SM fewer: the grid must fit that one too.
  auto fewer_for_the_last = [&](const KernelCandidate& c) {
    KernelFootprint f = gpu(c);
    if (c.orders.slots == kTM) f.blocks_per_sm -= 1;
    return f;
  };
  const LaunchPlan p = make_launch_plan(r, fewer_for_the_last);
  const LaunchPlan same = plan_of(r);
  EXPECT_EQ(p.shape.group_threads, same.shape.group_threads);
  EXPECT_EQ(p.blocks_per_sm, same.blocks_per_sm - 1);
}

TEST(MakeLaunchPlan, TunedStagesOrDeferTurnTheTokenCountExceptionsOff) {
  const ModelShape& olmoe = kModels[0];
  // TP 4 at 1024 tokens takes the few-token ring (3 stages, D = 1) on its own ...
  EXPECT_EQ(plan_of(bf16_request(olmoe, 4, 1024)).depth.stages, 3);
  EXPECT_EQ(plan_of(bf16_request(olmoe, 4, 1024)).depth.defer, 1);
  // ... and the world's ring once the depth is tuned: stages 5 with D log2(4) = 2, or D 3 with
  // its stages following as D + 2.
  LaunchTuning t;
  t.stages = 5;
  PipelineDepth d = plan_of(bf16_request(olmoe, 4, 1024, t)).depth;
  EXPECT_EQ(d.stages, 5);
  EXPECT_EQ(d.defer, 2);
  t = {};
  t.defer = 3;
  d = plan_of(bf16_request(olmoe, 4, 1024, t)).depth;
  EXPECT_EQ(d.stages, 5);
  EXPECT_EQ(d.defer, 3);
  // At TP 8 the shallow ring is no candidate either: 4 stages with D = log2(8) = 3.
  t = {};
  t.stages = 4;
  d = plan_of(bf16_request(olmoe, 8, 4096, t)).depth;
  EXPECT_EQ(d.stages, 4);
  EXPECT_EQ(d.defer, 3);
  // Alone nothing is deferred, whatever the tuning says.
  t = {};
  t.stages = 4;
  t.defer = 2;
  d = plan_of(bf16_request(olmoe, 1, 4096, t)).depth;
  EXPECT_EQ(d.stages, 4);
  EXPECT_EQ(d.defer, 0);
}

TEST(MakeLaunchPlan, TunedVectorsPerThreadAndBlockThreadsShapeTheLayout) {
  const ModelShape& olmoe = kModels[0];
  // OLMoE at TP 8 and 4096 tokens packs its 64-vector rows 4 a thread into 16 lanes; with 8
  // vectors a thread forced, the row takes 8 lanes and nothing else packs it.
  LaunchTuning t;
  t.vectors_per_thread = 8;
  LaunchPlan p = plan_of(bf16_request(olmoe, 8, 4096, t));
  EXPECT_EQ(p.shape.vectors_per_thread, 8);
  EXPECT_EQ(p.shape.group_threads, 8);
  EXPECT_EQ(p.shape.tokens_per_block, 32);
  // Block threads set the groups a block holds: OLMo3-32B alone, 192-thread groups, one in
  // 256 threads, two in the tuned 384.
  const ModelShape& olmo3 = kModels[3];
  EXPECT_EQ(plan_of(bf16_request(olmo3, 1, 4096)).shape.tokens_per_block, 2);
  t = {};
  t.block_threads = 256;
  p = plan_of(bf16_request(olmo3, 1, 4096, t));
  EXPECT_EQ(p.shape.group_threads, 192);
  EXPECT_EQ(p.shape.tokens_per_block, 1);
}

TEST(MakeLaunchPlan, EightByteVectorsStageTwiceAsManyVectorsInTheSameBytes) {
  // OLMoE alone in 8-byte bf16 vectors: 1024 vectors a row, 4 a thread, 256-thread groups; the
  // footprint is asked of the 8-byte shape, whose ring holds the same bytes as the 16-byte one.
  LaunchRequest r = bf16_request(kModels[0], 1, 4096);
  r.vec_elems = 4;
  r.vec_bytes = 8;
  const GpuModel gpu = model_for(r);
  const LaunchPlan p = make_launch_plan(r, std::cref(gpu));
  EXPECT_EQ(p.shape.vec_elems, 4);
  EXPECT_EQ(p.shape.vec_bytes, 8);
  EXPECT_EQ(p.shape.vectors_per_thread, 4);
  EXPECT_EQ(p.shape.group_threads, 256);
  ASSERT_FALSE(gpu.asked.empty());
  for (const KernelCandidate& c : gpu.asked) EXPECT_EQ(c.shape.vec_bytes, 8);
  const LaunchPlan wide = plan_of(bf16_request(kModels[0], 1, 4096));
  EXPECT_EQ(wide.shape.vec_bytes, 16);
  EXPECT_EQ(wide.shape.group_threads, 128);
  EXPECT_EQ(p.smem_bytes - 4096 * 2,
            (wide.smem_bytes - 4096 * 2) / wide.shape.tokens_per_block * p.shape.tokens_per_block);
  // The deterministic mode's canonical order is defined on 16-byte vectors.
  r.deterministic = true;
  testing::expect_error([&] { plan_of(r); }, {"16-byte vectors", "vector_bytes"});
}

TEST(MakeLaunchPlan, Fp8AloneTakesEightVectorsAThreadFromManyTokensOnWideRows) {
  // fp8 in 8-byte vectors (8 elements), bf16 out: OLMo2-13B's 1280 vectors a row.
  auto fp8 = [](const ModelShape& m, int world, int64_t tokens) {
    LaunchRequest r = bf16_request(m, world, tokens);
    r.vec_elems = 8;
    r.vec_bytes = 8;
    r.out_elem_bytes = 2;
    return plan_of(r);
  };
  LaunchPlan p = fp8(kModels[2], 1, kEightVectorsMinTokens);
  EXPECT_EQ(p.shape.vectors_per_thread, 8);
  EXPECT_EQ(p.shape.group_threads, 160);
  // The plan is of the first chunk's tokens: a call of many chunks of capacity 16384 still
  // takes it; fewer tokens a launch, TP 2 and OLMoE's rows (128 threads at 4) keep 4.
  EXPECT_EQ(fp8(kModels[2], 1, 100000).shape.vectors_per_thread, 8);
  EXPECT_EQ(fp8(kModels[2], 1, kEightVectorsMinTokens - 1).shape.vectors_per_thread, 4);
  EXPECT_EQ(fp8(kModels[2], 1, 64).shape.group_threads, 320);
  EXPECT_EQ(fp8(kModels[2], 2, 16384).shape.vectors_per_thread, 4);
  EXPECT_EQ(fp8(kModels[0], 1, 16384).shape.vectors_per_thread, 4);
  // A forced count wins.
  LaunchTuning t;
  t.vectors_per_thread = 4;
  LaunchRequest r = bf16_request(kModels[2], 1, 16384, t);
  r.vec_bytes = 8;
  r.out_elem_bytes = 2;
  EXPECT_EQ(plan_of(r).shape.vectors_per_thread, 4);
}

TEST(MakeLaunchPlan, FewTokensWithPeersSpreadRowsOverMoreThreads) {
  auto shape = [](const ModelShape& m, int world, int64_t tokens, const LaunchTuning& t = {}) {
    return plan_of(bf16_request(m, world, tokens, t)).shape;
  };
  const ModelShape &olmoe = kModels[0], &olmo2_13b = kModels[2], &minimax = kModels[4];
  // OLMoE at TP 2 (256 vectors a row): one vector a thread in 256 threads where each token's
  // block still has an SM (64 tokens x 2 ranks = 128 blocks of 132), two a thread where one
  // would split a rank's one block in two (2 tokens), four from kSpreadMaxTokens + 1 tokens.
  KernelShape s = shape(olmoe, 2, 1);
  EXPECT_EQ(s.vectors_per_thread, 1);
  EXPECT_EQ(s.group_threads, 256);
  s = shape(olmoe, 2, 2);
  EXPECT_EQ(s.vectors_per_thread, 2);
  EXPECT_EQ(s.tokens_per_block, 2);
  EXPECT_EQ(shape(olmoe, 2, kSpreadMaxTokens).vectors_per_thread, 1);
  s = shape(olmoe, 2, kSpreadMaxTokens + 1);
  EXPECT_EQ(s.vectors_per_thread, 4);
  EXPECT_EQ(s.group_threads, 64);
  // OLMo2-13B at TP 4 (320 vectors): two a thread (160 threads) at 16 tokens; at 64 tokens
  // that is 256 blocks for 132 SMs, so four. At TP 2 (640 vectors) two a thread would need 320
  // threads, over kSpreadMaxGroupThreads: four at any count.
  EXPECT_EQ(shape(olmo2_13b, 4, 16).vectors_per_thread, 2);
  EXPECT_EQ(shape(olmo2_13b, 4, 64).vectors_per_thread, 4);
  EXPECT_EQ(shape(olmo2_13b, 2, 1).vectors_per_thread, 4);
  // Rows of a warp (OLMoE at TP 8), forced counts and forced block sizes are left as they were.
  EXPECT_EQ(shape(olmoe, 8, 16).group_threads, 32);
  LaunchTuning t;
  t.vectors_per_thread = 4;
  EXPECT_EQ(shape(minimax, 2, 16, t).vectors_per_thread, 4);
  t = {};
  t.block_threads = 128;  // MiniMax-M2's 448 vectors at TP 2: 4 a thread, 128 threads
  s = shape(minimax, 2, 16, t);
  EXPECT_EQ(s.vectors_per_thread, 4);
  EXPECT_EQ(s.group_threads, 128);
  // The SMs counted are the launch's budget: MiniMax-M2 at TP 2, 64 tokens takes 2 a thread
  // (224 threads, 128 blocks) on all SMs, not within 40.
  EXPECT_EQ(shape(minimax, 2, 64).vectors_per_thread, 2);
  LaunchRequest r = bf16_request(minimax, 2, 64);
  r.sm_budget = 40;
  EXPECT_EQ(plan_of(r).shape.vectors_per_thread, 4);
}

TEST(MakeLaunchPlan, FewTokensAloneTakeTwoVectorsAThreadWhereTheGroupStillFitsTheBlock) {
  auto shape = [](const ModelShape& m, int64_t tokens, const LaunchTuning& t = {}) {
    return plan_of(bf16_request(m, 1, tokens, t)).shape;
  };
  // OLMoE's 512 vectors: 2 a thread in 256 threads (not 4 in 128, three groups a block) up to
  // kSpreadMaxTokens tokens; OLMo3-32B's 768: 384 threads, the block's whole target.
  for (int64_t tokens : {int64_t{1}, int64_t{16}, kSpreadMaxTokens}) {
    SCOPED_TRACE(tokens);
    KernelShape s = shape(kModels[0], tokens);
    EXPECT_EQ(s.vectors_per_thread, 2);
    EXPECT_EQ(s.group_threads, 256);
    EXPECT_EQ(s.tokens_per_block, 1);
    s = shape(kModels[3], tokens);
    EXPECT_EQ(s.vectors_per_thread, 2);
    EXPECT_EQ(s.group_threads, 384);
  }
  // More tokens, or a doubled group over the block (MiniMax-M2's 896 vectors: 448 threads;
  // OLMo2-7B and OLMo2-13B), keep 4; so do a forced vector count and a forced block size.
  EXPECT_EQ(shape(kModels[0], kSpreadMaxTokens + 1).vectors_per_thread, 4);
  EXPECT_EQ(shape(kModels[3], kSpreadMaxTokens + 1).group_threads, 192);
  for (int m : {1, 2, 4}) EXPECT_EQ(shape(kModels[m], 1).vectors_per_thread, 4) << kModels[m].name;
  // A row too wide for 2 a thread in one block (3936 vectors, 992 threads at 4) keeps 4.
  EXPECT_EQ(shape(ModelShape{"wide", 16192, 15296}, 9).group_threads, 992);
  LaunchTuning t;
  t.vectors_per_thread = 4;
  EXPECT_EQ(shape(kModels[0], 16, t).group_threads, 128);
  t = {};
  t.block_threads = 384;
  EXPECT_EQ(shape(kModels[0], 16, t).vectors_per_thread, 4);
}

TEST(MakeLaunchPlan, AloneMidRowsOfManyTokensTakeTwoVectorsAThread) {
  auto shape = [](const ModelShape& m, int64_t tokens, int vec_elems = 8,
                  const LaunchTuning& t = {}) {
    LaunchRequest r = bf16_request(m, 1, tokens, t);
    r.vec_elems = vec_elems;
    r.out_elem_bytes = vec_elems == 4 ? 4 : 2;
    return plan_of(r).shape;
  };
  // 16-bit rows of 1408, 1518 and 1664 vectors (352, 384 and 416 threads at 4 a thread): from
  // kAloneHalfVectorsFromTokens tokens one group of 704, 768 and 832 threads at 2 a thread.
  const ModelShape mid[] = {
      {"5632:5632", 5632, 5632}, {"7376:4768", 7376, 4768}, {"7168:6144", 7168, 6144}};
  const int doubled[] = {704, 768, 832};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(mid[i].name);
    for (int64_t tokens : {kAloneHalfVectorsFromTokens, int64_t{4781}, int64_t{16384}}) {
      const KernelShape s = shape(mid[i], tokens);
      EXPECT_EQ(s.vectors_per_thread, 2);
      EXPECT_EQ(s.group_threads, doubled[i]);
      EXPECT_EQ(s.tokens_per_block, 1);
    }
    const KernelShape fewer = shape(mid[i], kAloneHalfVectorsFromTokens - 1);
    EXPECT_EQ(fewer.vectors_per_thread, 4);
    EXPECT_EQ(fewer.group_threads, doubled[i] / 2);
  }
  // Groups of 320 threads (OLMo2-13B, 6144:4096) and the other models keep 4; so do rows of
  // the same widths in f32 (4 elements a vector), fp8 (8 elements in 8 bytes), with peers, or
  // with a forced vector count or block size.
  for (const ModelShape& m : kModels) {
    EXPECT_EQ(shape(m, 4096).vectors_per_thread, 4) << m.name;
  }
  EXPECT_EQ(shape(ModelShape{"6144:4096", 6144, 4096}, 4096).group_threads, 320);
  // The ends of the range: the 4-vector group is ceil(vectors / 4) rounded up to a warp, so rows
  // of 1281 vectors (321 threads, 352 with the warp) take 2 a thread and rows of 1665 (417, 448)
  // keep 4.
  const KernelShape first = shape(ModelShape{"5128:5120", 5128, 5120}, 4096);
  EXPECT_EQ(first.vectors_per_thread, 2);
  EXPECT_EQ(first.group_threads, 672);
  const KernelShape past = shape(ModelShape{"7176:6144", 7176, 6144}, 4096);
  EXPECT_EQ(past.vectors_per_thread, 4);
  EXPECT_EQ(past.group_threads, 448);
  const ModelShape w = mid[1];
  EXPECT_NE(shape(w, 4096, 4).vectors_per_thread, 2);
  LaunchRequest fp8 = bf16_request(w, 1, 4096);
  fp8.vec_bytes = 8;
  EXPECT_NE(plan_of(fp8).shape.vectors_per_thread, 2);
  EXPECT_EQ(plan_of(bf16_request(w, 2, 4096)).shape.vectors_per_thread, 4);
  LaunchTuning t;
  t.vectors_per_thread = 4;
  EXPECT_EQ(shape(w, 4096, 8, t).group_threads, 384);
  t = {};
  t.block_threads = 384;
  EXPECT_EQ(shape(w, 4096, 8, t).vectors_per_thread, 4);
}

TEST(MakeLaunchPlan, Fp8WithPeersTakesTwoVectorsAThreadJustPastTheSpread) {
  // fp8 in 16-byte vectors (16 elements), bf16 out, past kFp8FewTokensMax (8-byte vectors below).
  auto fp8 = [](const ModelShape& m, int world, int64_t tokens, const LaunchTuning& t = {}) {
    LaunchRequest r = bf16_request(m, world, tokens, t);
    r.vec_elems = 16;
    r.out_elem_bytes = 2;
    return plan_of(r).shape;
  };
  // OLMo2-7B at TP 2 (256 vectors a row) and TP 4 (128): 2 a thread in 128 and 64 threads up to
  // kFp8HalfVectorsMaxTokens tokens, 4 after.
  for (int64_t tokens : {kFp8FewTokensMax + 1, kFp8HalfVectorsMaxTokens}) {
    SCOPED_TRACE(tokens);
    KernelShape s = fp8(kModels[1], 2, tokens);
    EXPECT_EQ(s.vectors_per_thread, 2);
    EXPECT_EQ(s.group_threads, 128);
    s = fp8(kModels[1], 4, tokens);
    EXPECT_EQ(s.vectors_per_thread, 2);
    EXPECT_EQ(s.group_threads, 64);
    // MiniMax-M2 at TP 4: 112 vectors, at least kFp8HalfVectorsMinVectors.
    EXPECT_EQ(fp8(kModels[4], 4, tokens).vectors_per_thread, 2);
    // OLMo2-13B at TP 8: 80 vectors, fewer: 4 a thread in a warp.
    s = fp8(kModels[2], 8, tokens);
    EXPECT_EQ(s.vectors_per_thread, 4);
    EXPECT_EQ(s.group_threads, 32);
  }
  EXPECT_EQ(fp8(kModels[1], 2, kFp8HalfVectorsMaxTokens + 1).vectors_per_thread, 4);
  // A row of 4096 vectors a rank (131072 + 2048 at TP 2) cannot take 2 a thread in 1024 threads.
  EXPECT_NE(fp8(ModelShape{"long", 131072, 2048}, 2, 96).vectors_per_thread, 2);
  // bf16 rows of the same vectors keep 4; so does a forced count.
  EXPECT_EQ(plan_of(bf16_request(kModels[1], 4, 96)).shape.vectors_per_thread, 4);
  LaunchTuning t;
  t.vectors_per_thread = 4;
  EXPECT_EQ(fp8(kModels[1], 2, 96, t).vectors_per_thread, 4);
}

TEST(MakeLaunchPlan, FewTokensWithPeersSpreadStreamedRows) {
  // f32 rows of 15872 + 15696 elements: at TP 2 each rank's row is 3946 16-byte vectors, too
  // wide to stage, streamed 8 vectors a thread in 512 threads. Up to kSpreadMaxTokens tokens with
  // every block on an SM of its own, one lane per 2 vectors (1024 threads at most) instead.
  const ModelShape wide{"wide", 15872, 15696};
  auto f32 = [&](int world, int64_t tokens, const LaunchTuning& t = {}) {
    LaunchRequest r = bf16_request(wide, world, tokens, t);
    r.vec_elems = 4;
    r.out_elem_bytes = 4;
    return plan_of(r).shape;
  };
  KernelShape s = f32(2, 1);
  EXPECT_EQ(s.vectors_per_thread, 0);
  EXPECT_EQ(s.group_threads, 1024);
  EXPECT_EQ(f32(2, kSpreadMaxTokens).group_threads, 1024);
  s = f32(2, 4096);
  EXPECT_EQ(s.vectors_per_thread, 0);
  EXPECT_EQ(s.group_threads, 512);
  EXPECT_EQ(f32(2, kSpreadMaxTokens + 1).group_threads, 512);
  // A forced block size keeps the streamed group.
  LaunchTuning t;
  t.block_threads = 512;
  EXPECT_EQ(f32(2, 1, t).group_threads, 512);
}

TEST(MakeLaunchPlan, WideRowsAloneAreStagedAtTwoStagesAndStreamOtherwise) {
  // 16192 + 15296 bf16 elements: 3936 vectors, 61.5 KB a row. Alone at the tuned 2 stages the
  // two rows and the weights fit a block: staged in 992 threads, one block an SM.
  const ModelShape wide{"wide", 16192, 15296};
  const LaunchPlan alone = plan_of(bf16_request(wide, 1, 4096));
  EXPECT_EQ(alone.shape.vectors_per_thread, 4);
  EXPECT_EQ(alone.shape.group_threads, 992);
  EXPECT_EQ(alone.blocks_per_sm, 1);
  EXPECT_LE(alone.smem_bytes, static_cast<std::size_t>(kMaxStagedSmemBytes));
  // Three stages forced: streamed.
  LaunchTuning t;
  t.stages = 3;
  EXPECT_EQ(plan_of(bf16_request(wide, 1, 4096, t)).shape.vectors_per_thread, 0);
  // With peers at TP 2 each rank's row is 1968 vectors: staged under the default limit.
  EXPECT_EQ(plan_of(bf16_request(wide, 2, 4096)).shape.vectors_per_thread, 4);
}

TEST(MakeLaunchPlan, TunedBlockOrderAppliesToLaunchesOfSeveralRanksOnly) {
  const ModelShape& m = kModels[1];
  EXPECT_EQ(plan_of(bf16_request(m, 2, 64)).chunk(0).orders.blocks, kRM);
  EXPECT_EQ(plan_of(bf16_request(m, 2, 4096)).chunk(0).orders.blocks, kIL);
  LaunchTuning t;
  t.block_order = LaunchTuning::BlockOrder::kInterleaved;
  EXPECT_EQ(plan_of(bf16_request(m, 2, 64, t)).chunk(0).orders.blocks, kIL);
  t.block_order = LaunchTuning::BlockOrder::kRankMajor;
  EXPECT_EQ(plan_of(bf16_request(m, 2, 4096, t)).chunk(0).orders.blocks, kRM);
  // One rank per launch (TP 1, or one process per GPU) has one order.
  t.block_order = LaunchTuning::BlockOrder::kInterleaved;
  EXPECT_EQ(plan_of(bf16_request(m, 1, 4096, t)).chunk(0).orders.blocks, kRM);
  LaunchRequest one = bf16_request(m, 2, 4096, t);
  one.ranks = 1;
  one.ranks_on_device = 1;
  EXPECT_EQ(plan_of(one).chunk(0).orders.blocks, kRM);
}

TEST(MakeLaunchPlan, RanksLaunchedApartTakeTheirShareOfTheBudget) {
  EXPECT_EQ(launch_sm_budget(0, 132, 8, 8), 0);    // all ranks in one launch: all SMs
  EXPECT_EQ(launch_sm_budget(40, 132, 8, 8), 40);  // the communicator's budget
  EXPECT_EQ(launch_sm_budget(0, 132, 1, 8), 16);   // one of 8 ranks on its own stream
  EXPECT_EQ(launch_sm_budget(40, 132, 2, 8), 10);
  EXPECT_EQ(launch_sm_budget(500, 132, 1, 2), 66);  // a budget above the SM count
  EXPECT_EQ(launch_sm_budget(4, 132, 1, 8), 1);     // at least one SM
  // The plan's grid stays within the share: one of TP 8's ranks launched alone.
  LaunchRequest r = bf16_request(kModels[1], 8, 16384);
  r.ranks = 1;
  const LaunchPlan p = plan_of(r);
  EXPECT_EQ(p.sm_budget, 16);
  EXPECT_LE(p.chunk(0).grid.grid(), 16 * p.blocks_per_sm);
}

TEST(MakeLaunchPlan, BadRequestsAndTuningsThrow) {
  const ModelShape& m = kModels[1];
  LaunchRequest r = bf16_request(m, 2, 64);
  r.tokens = 0;
  EXPECT_TRUE(testing::throws_error([&] { plan_of(r); }, "tokens must be >= 1"));
  r = bf16_request(m, 2, 64);
  r.ranks = 3;
  EXPECT_TRUE(testing::throws_error([&] { plan_of(r); }, "ranks must be in [1, world]"));
  r = bf16_request({"odd", 4098, 4096}, 4, 64);
  EXPECT_TRUE(testing::throws_error([&] { plan_of(r); }, "split over the world"));
  r = bf16_request(m, 2, 64);
  r.sm_count = 0;
  EXPECT_TRUE(testing::throws_error([&] { plan_of(r); }, "sm_count"));
  LaunchTuning t;
  t.stages = 3;
  t.defer = 3;
  EXPECT_TRUE(
      testing::throws_error([&] { plan_of(bf16_request(m, 2, 64, t)); }, "LaunchTuning.defer = 3"));
  // A kernel that cannot be resident at all.
  auto none = [](const KernelCandidate&) { return KernelFootprint{0, 0}; };
  EXPECT_TRUE(testing::throws_error([&] { make_launch_plan(bf16_request(m, 2, 64), none); },
                                    "occupancy 0"));
  // Under a forced block size, the error names the tuning field and the size.
  LaunchTuning big;
  big.block_threads = 1024;
  testing::expect_error([&] { make_launch_plan(bf16_request(m, 2, 64, big), none); },
                        {"LaunchTuning::block_threads 1024", "occupancy 0"});
}

TEST(MakeLaunchPlan, DeterministicModeTakesItsOwnShapeTokenMajorSlotsAndTheTunedBlockOrder) {
  for (const ModelShape& m : kModels) {
    for (int world : {1, 2, 4, 8}) {
      for (int64_t tokens : {int64_t{1}, int64_t{4096}}) {
        LaunchRequest r = bf16_request(m, world, tokens);
        r.deterministic = true;
        const LaunchPlan plan = plan_of(r);
        const DeterministicShape want = deterministic_kernel_shape(
            m.q / world, m.k / world, 8, world,
            world == 1 ? kDefaultBlockThreadsAlone : kDefaultBlockThreads, 0, plan.full.tokens);
        EXPECT_EQ(plan.shape.group_threads, want.shape.group_threads) << m.name << " TP " << world;
        EXPECT_EQ(plan.shape.vectors_per_thread, want.shape.vectors_per_thread) << m.name;
        EXPECT_EQ(plan.det_q_slots, want.q_slots) << m.name << " TP " << world;
        EXPECT_EQ(plan.shape.det_lanes, want.shape.det_lanes) << m.name << " TP " << world;
        EXPECT_EQ(plan.chunk(0).orders.slots, SlotLayout::kTokenMajor) << m.name;
        EXPECT_EQ(plan.chunk(0).orders.blocks, choose_block_order(r.ranks, plan.full.tokens))
            << m.name << " TP " << world << ", " << tokens << " tokens";
      }
    }
  }
  // With peers the block order follows the token count (interleaved from 2048 tokens), and a
  // forced one is taken: it changes which block serves a token, not the order of any sum.
  LaunchRequest many = bf16_request(kModels[2], 2, 4096);
  many.deterministic = true;
  EXPECT_EQ(plan_of(many).chunk(0).orders.blocks, BlockOrder::kInterleaved);
  EXPECT_EQ(plan_of(many).chunk(0).orders.slots, SlotLayout::kTokenMajor);
  LaunchTuning rank_major;
  rank_major.block_order = LaunchTuning::BlockOrder::kRankMajor;
  LaunchRequest forced = bf16_request(kModels[2], 2, 4096, rank_major);
  forced.deterministic = true;
  EXPECT_EQ(plan_of(forced).chunk(0).orders.blocks, BlockOrder::kRankMajor);
}

TEST(MakeLaunchPlan, DeterministicModeTakesForcedVectorsAndRefusesTheScalarPath) {
  LaunchTuning t;
  t.vectors_per_thread = 8;
  LaunchRequest r = bf16_request(kModels[0], 2, 64, t);
  r.deterministic = true;
  const LaunchPlan plan = plan_of(r);
  const DeterministicShape want =
      deterministic_kernel_shape(kModels[0].q / 2, kModels[0].k / 2, 8, 2, kDefaultBlockThreads, 8);
  EXPECT_EQ(plan.shape.vectors_per_thread, 8);
  EXPECT_EQ(plan.shape.det_lanes, want.shape.det_lanes);
  EXPECT_EQ(plan.shape.group_threads, want.shape.group_threads);
  t.vectors_per_thread = 1;
  LaunchRequest one = bf16_request(kModels[0], 2, 64, t);
  one.deterministic = true;
  testing::expect_error([&] { plan_of(one); }, {"deterministic mode", "not 1"});
  LaunchRequest s = bf16_request(kModels[0], 2, 64);
  s.deterministic = true;
  s.vec_elems = 1;
  testing::expect_error([&] { plan_of(s); }, {"16-byte vectors"});
}

}  // namespace
}  // namespace swiftqk
