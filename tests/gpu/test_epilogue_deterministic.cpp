// The fused QK epilogue's deterministic mode on one GPU with virtual ranks: the same model-level
// output bytes (every token's full Q row, and the full K and V rows of every slot the call
// writes) at TP 1, 2, 4, 8 and 16 wherever the heads divide, on the DESIGN shapes in both norm
// orders, with bf16 and fp8 caches and fp8 Q, at token counts that split into chunks, and under
// every forced launch shape; each run also checked against float64. A token alone writes the
// bits it writes inside a batch. The default mode, run the same way, differs between TP degrees
// somewhere (the control that shows the comparison can fail).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "epilogue_group.hpp"
#include "epilogue_problem.hpp"
#include "expect_error.hpp"
#include "require_gpu.hpp"

namespace swiftqk::testing {
namespace {

std::vector<uint8_t> download(const void* p, std::size_t bytes) {
  std::vector<uint8_t> out(bytes);
  if (bytes > 0) SWIFTQK_CUDA_TRY(cudaMemcpy(out.data(), p, bytes, cudaMemcpyDeviceToHost));
  return out;
}

// The model-level outputs of a group's ranks, as bytes: token by token, the full Q row (rank 0's
// heads first), then for a token with a slot the full K row and the full V row of that slot.
// Launches of one problem at different TP degrees write the same model, so their bytes compare.
std::vector<uint8_t> model_outputs(const EpilogueHost& h, const std::vector<EpilogueRank>& d) {
  struct Host {
    std::vector<uint8_t> q, k, v;  // q_out's rows, the two cache buffers
    const uint8_t *k_at, *v_at;    // device addresses of k[0] and v[0]
  };
  std::vector<Host> ranks;
  for (const EpilogueRank& r : d) {
    const QkEpilogueParams& p = r.params;
    const std::size_t qe = dtype_size(p.q_out_dtype);
    const std::size_t q_bytes =
        h.s.tokens == 0 ? 0 : ((h.s.tokens - 1) * p.q_out_stride + p.num_q_heads * p.head_dim) * qe;
    ranks.push_back({download(p.q_out, q_bytes), download(r.k_cache.get(), r.cache_bytes),
                     download(r.v_cache.get(), r.cache_bytes), r.k_cache.get(), r.v_cache.get()});
  }
  std::vector<uint8_t> out;
  auto append = [&out](const uint8_t* p, std::size_t n) { out.insert(out.end(), p, p + n); };
  for (int64_t t = 0; t < h.s.tokens; ++t) {
    for (std::size_t i = 0; i < d.size(); ++i) {
      const QkEpilogueParams& p = d[i].params;
      const std::size_t qe = dtype_size(p.q_out_dtype);
      append(ranks[i].q.data() + t * p.q_out_stride * qe, p.num_q_heads * p.head_dim * qe);
    }
    const int64_t slot = h.slots[t];
    if (slot < 0) continue;
    for (int kv = 0; kv < 2; ++kv) {
      for (std::size_t i = 0; i < d.size(); ++i) {
        const QkEpilogueParams& p = d[i].params;
        const PagedKvCache& c = p.cache;
        const std::size_t ce = dtype_size(c.dtype);
        const int64_t b = slot / c.block_size, o = slot % c.block_size;
        const uint8_t* base = kv == 0 ? ranks[i].k.data() : ranks[i].v.data();
        const uint8_t* dev_base = kv == 0 ? ranks[i].k_at : ranks[i].v_at;
        const uint8_t* dev_cache = static_cast<const uint8_t*>(kv == 0 ? c.k : c.v);
        const std::size_t from = static_cast<std::size_t>(dev_cache - dev_base);
        for (int64_t hh = 0; hh < p.num_kv_heads; ++hh) {
          const int64_t e = b * c.block_stride + o * c.slot_stride + hh * c.head_stride;
          append(base + from + e * ce, p.head_dim * ce);
        }
      }
    }
  }
  return out;
}

struct Outputs {
  std::vector<uint8_t> bytes;
  bool correct = true;
};

// One call of every rank of a TP-`world` group on h, checked against float64 and returned as
// model-level bytes.
Outputs run(const EpilogueHost& h, int world, bool deterministic, const EpilogueTuning& tuning = {},
            const CommConfig& config = {}) {
  EpilogueGroup g(world, config);
  std::vector<EpilogueRank> d;
  std::vector<CacheSnapshot> before;
  std::vector<QkEpilogueParams> params;
  for (int i = 0; i < world; ++i) {
    d.push_back(make_epilogue_rank(h, world, i));
    poison_epilogue(d.back(), h.s.seed * 31 + i, nullptr);
    before.push_back(snapshot_caches(d.back()));
    params.push_back(d.back().params);
    params.back().deterministic = deterministic;
    params.back().tuning = tuning;
  }
  launch_qk_epilogue_group(g.ptrs, params, nullptr);
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  for (auto& c : g.comms) c.check_error();
  Outputs r;
  const ref::EpilogueExpected gold = ref::epilogue_fp64(h.ref);
  for (int i = 0; i < world; ++i) {
    const EpilogueCheck c = check_epilogue_rank(h, gold, world, i, d[i], before[i], {});
    EXPECT_TRUE(c.ok()) << h.s.name() << " TP " << world << " rank " << i << ": " << c.first_error;
    EXPECT_GT(c.checked, 0);
    r.correct = r.correct && c.ok();
  }
  r.bytes = model_outputs(h, d);
  return r;
}

// The DESIGN shapes, and one whose heads TP 16 divides.
const EpilogueModel kModels[] = {
    kDesignModels[0],
    kDesignModels[1],
    kDesignModels[2],
    kDesignModels[3],
    {"tp16", 32, 16, 128, NormOrder::kOlmo2},
};

std::vector<int> tp_degrees(const EpilogueModel& m) {
  std::vector<int> out;
  for (int world : {1, 2, 4, 8, 16}) {
    if (m.q_heads % world == 0 && m.kv_heads % world == 0) out.push_back(world);
  }
  return out;
}

TEST(EpilogueDeterministic, EveryTpDegreeWritesTheSameBits) {
  REQUIRE_GPU();
  uint64_t seed = 7100;
  int compared = 0, default_differs = 0;
  for (const EpilogueModel& m : kModels) {
    for (int64_t tokens : {1, 333}) {
      const EpilogueHost h = EpilogueHost::random(setup_of(m, tokens, ++seed));
      const Outputs tp1 = run(h, 1, true);
      const Outputs tp1_default = run(h, 1, false);
      for (int world : tp_degrees(m)) {
        if (world == 1) continue;
        SCOPED_TRACE(std::string(m.name) + " T " + std::to_string(tokens) + " TP " +
                     std::to_string(world));
        EXPECT_TRUE(run(h, world, true).bytes == tp1.bytes) << "the deterministic bits moved";
        ++compared;
        if (run(h, world, false).bytes != tp1_default.bytes) ++default_differs;
      }
    }
  }
  EXPECT_GE(compared, 20);
  // The control: without the mode, the split changes some bits somewhere.
  EXPECT_GT(default_differs, 0);
}

TEST(EpilogueDeterministic, Fp8CachesAndFp8QKeepTheBitsAcrossTp) {
  REQUIRE_GPU();
  uint64_t seed = 7300;
  for (const EpilogueModel& m : {kModels[1], kModels[3]}) {
    EpilogueSetup s = setup_of(m, 257, ++seed);
    s.cache_dtype = DType::kF8E4M3;
    s.q_out_dtype = DType::kF8E4M3;
    s.in_place = false;
    const EpilogueHost h = EpilogueHost::random(s);
    const Outputs tp1 = run(h, 1, true);
    for (int world : tp_degrees(m)) {
      if (world == 1) continue;
      SCOPED_TRACE(std::string(m.name) + " fp8 TP " + std::to_string(world));
      EXPECT_TRUE(run(h, world, true).bytes == tp1.bytes);
    }
  }
}

// The element path (rows one element off 16 bytes: the canonical sums still read the staged row
// in 16-byte vectors), GPT-J with partial rotary into an HND cache with k_out, and f16.
TEST(EpilogueDeterministic, OtherPathsKeepTheBitsAcrossTp) {
  REQUIRE_GPU();
  uint64_t seed = 7900;
  for (int variant = 0; variant < 3; ++variant) {
    EpilogueSetup s = setup_of(kModels[0], 211, ++seed);  // OLMoE's heads
    if (variant == 0) s.unaligned = true;
    if (variant == 1) {
      s.style = RopeStyle::kGptj;
      s.rotary_dim = 64;
      s.hnd = true;
      s.k_out = true;
    }
    if (variant == 2) s.dtype = s.q_out_dtype = s.cache_dtype = DType::kF16;
    const EpilogueHost h = EpilogueHost::random(s);
    const Outputs tp1 = run(h, 1, true);
    for (int world : {2, 4, 16}) {
      SCOPED_TRACE("variant " + std::to_string(variant) + " TP " + std::to_string(world));
      EXPECT_TRUE(run(h, world, true).bytes == tp1.bytes);
    }
  }
}

// Chunks (a workspace of 256 token slots) and launch shapes change when and where a row is
// processed, never its bits.
TEST(EpilogueDeterministic, ChunksAndForcedLaunchShapesKeepTheBits) {
  REQUIRE_GPU();
  const EpilogueModel& m = kModels[3];  // MiniMax-M2: partial rotary, 48 and 8 heads
  const EpilogueHost h = EpilogueHost::random(setup_of(m, 1000, 7500));
  const Outputs tp1 = run(h, 1, true);
  CommConfig small;
  small.token_capacity = 256;
  for (int world : {2, 8}) {
    SCOPED_TRACE("TP " + std::to_string(world));
    EXPECT_TRUE(run(h, world, true, {}, small).bytes == tp1.bytes) << "chunked";
    for (int threads : {32, 128, 512}) {
      for (int stages : {0, 3, 6}) {
        EpilogueTuning t;
        t.block_threads = threads;
        t.stages = stages;
        try {
          t.validate();
        } catch (const Error&) {
          continue;
        }
        SCOPED_TRACE("threads " + std::to_string(threads) + " stages " + std::to_string(stages));
        EXPECT_TRUE(run(h, world, true, t).bytes == tp1.bytes);
      }
    }
  }
}

// A token's bits do not depend on which tokens share its launch: each of a few tokens of a
// 4096-token batch at TP 4, launched alone (its rows, position and slot as one-token views),
// writes the bytes the batch wrote for it, and the bytes TP 1's batch wrote for it.
TEST(EpilogueDeterministic, ATokenAloneWritesTheBitsItWritesInABatch) {
  REQUIRE_GPU();
  const EpilogueModel& m = kModels[1];
  EpilogueSetup s = setup_of(m, 4096, 7700);
  s.padding = 0.0;  // every token has a slot
  const EpilogueHost h = EpilogueHost::random(s);
  const int world = 4;
  EpilogueGroup g(world);
  std::vector<EpilogueRank> d;
  std::vector<QkEpilogueParams> params;
  for (int i = 0; i < world; ++i) {
    d.push_back(make_epilogue_rank(h, world, i));
    params.push_back(d.back().params);
    params.back().deterministic = true;
  }
  launch_qk_epilogue_group(g.ptrs, params, nullptr);
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  for (auto& c : g.comms) c.check_error();
  const std::vector<uint8_t> batch = model_outputs(h, d);
  const std::size_t per_token = batch.size() / static_cast<std::size_t>(s.tokens);
  ASSERT_EQ(per_token * static_cast<std::size_t>(s.tokens), batch.size());
  const Outputs tp1 = run(h, 1, true);
  ASSERT_EQ(tp1.bytes.size(), batch.size());
  for (int64_t t : {int64_t{0}, int64_t{1}, int64_t{2047}, int64_t{4095}}) {
    SCOPED_TRACE("token " + std::to_string(t));
    // The inputs again (in place, the batch overwrote Q), outputs and caches poisoned.
    for (int i = 0; i < world; ++i) {
      upload_epilogue_inputs(h, world, i, d[i], nullptr);
      poison_epilogue(d[i], 99 + i, nullptr);
    }
    std::vector<QkEpilogueParams> one = params;
    for (QkEpilogueParams& p : one) {
      const std::size_t es = dtype_size(p.dtype), qe = dtype_size(p.q_out_dtype);
      p.tokens = 1;
      p.q = static_cast<const uint8_t*>(p.q) + t * p.q_stride * es;
      p.k = static_cast<const uint8_t*>(p.k) + t * p.k_stride * es;
      p.v = static_cast<const uint8_t*>(p.v) + t * p.v_stride * es;
      p.q_out = static_cast<uint8_t*>(p.q_out) + t * p.q_out_stride * qe;
      p.rope.positions += t;
      p.cache.slot_mapping += t;
    }
    launch_qk_epilogue_group(g.ptrs, one, nullptr);
    SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
    for (auto& c : g.comms) c.check_error();
    const std::vector<uint8_t> all = model_outputs(h, d);  // token t's part is the call's
    const std::size_t at = static_cast<std::size_t>(t) * per_token;
    EXPECT_TRUE(std::equal(batch.begin() + at, batch.begin() + at + per_token, all.begin() + at));
    EXPECT_TRUE(
        std::equal(tp1.bytes.begin() + at, tp1.bytes.begin() + at + per_token, all.begin() + at));
  }
}

TEST(EpilogueDeterministic, TpAndWidthsOutsideTheCanonicalOrderAreRefusedWithNothingWritten) {
  REQUIRE_GPU();
  // 3 heads of 40: rows of 120 elements, not 16 segments of 8-element vectors (128).
  EpilogueSetup s;
  s.tokens = 5;
  s.q_heads = 3;
  s.kv_heads = 3;
  s.head_dim = 40;
  s.rotary_dim = 40;
  const EpilogueHost h = EpilogueHost::random(s);
  EpilogueGroup g(1);
  EpilogueRank d = make_epilogue_rank(h, 1, 0);
  poison_epilogue(d, 5, nullptr);
  const std::vector<uint8_t> q_before = download(d.qkv.get(), d.qkv.bytes());
  const CacheSnapshot cache_before = snapshot_caches(d);
  QkEpilogueParams p = d.params;
  p.deterministic = true;
  expect_error([&] { launch_qk_epilogue_group(g.ptrs, {p}, nullptr); },
               {"deterministic mode", "120"});
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  EXPECT_TRUE(download(d.qkv.get(), d.qkv.bytes()) == q_before);
  const CacheSnapshot cache_after = snapshot_caches(d);
  EXPECT_TRUE(cache_after.k == cache_before.k && cache_after.v == cache_before.v);
}

}  // namespace
}  // namespace swiftqk::testing
