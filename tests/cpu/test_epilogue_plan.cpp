// The fused epilogue's launch shape: the access width each pointer, stride and rotation allows,
// the block size and ring depth, and the division by multiply the kernel's loops use.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "epilogue_plan.hpp"
#include "swiftqk/error.hpp"

namespace swiftqk {
namespace {

// A valid-looking bf16 problem with 16-byte aligned (never dereferenced) pointers.
QkEpilogueParams aligned_params() {
  alignas(16) static uint8_t arena[1 << 12];
  QkEpilogueParams p;
  p.q = p.k = p.v = p.q_weight = p.k_weight = arena;
  p.q_out = arena;
  p.q_stride = p.k_stride = p.v_stride = p.q_out_stride = 3 * 1024;
  p.num_q_heads = 4;
  p.num_kv_heads = 2;
  p.head_dim = 128;
  p.rope.rotary_dim = 128;
  p.rope.cos_sin_cache = arena;
  p.cache.k = p.cache.v = arena;
  p.cache.block_stride = 16 * 2 * 128;
  p.cache.slot_stride = 2 * 128;
  p.cache.head_stride = 128;
  return p;
}

TEST(EpiloguePlan, SixteenByteAccessesWhenEverythingAllowsThem) {
  EXPECT_EQ(epilogue_vector_elems(aligned_params()), 8);
}

TEST(EpiloguePlan, ElementPathForAnyMisalignmentOrSplitRotation) {
  QkEpilogueParams p = aligned_params();
  p.q_stride = 3 * 1024 + 1;
  EXPECT_EQ(epilogue_vector_elems(p), 1);
  p = aligned_params();
  p.v = static_cast<const uint8_t*>(p.v) + 2;
  EXPECT_EQ(epilogue_vector_elems(p), 1);
  p = aligned_params();
  p.rope.rotary_dim = 24;  // NeoX pairs vectors 12 apart: not whole 8-element vectors
  EXPECT_EQ(epilogue_vector_elems(p), 1);
  p.rope.style = RopeStyle::kGptj;  // GPT-J needs rotary_dim % 8 only
  EXPECT_EQ(epilogue_vector_elems(p), 8);
  p = aligned_params();
  p.cache.head_stride = 132;
  EXPECT_EQ(epilogue_vector_elems(p), 1);
  p = aligned_params();
  p.q_out_dtype = DType::kF8E4M3;
  p.q_out = static_cast<uint8_t*>(p.q_out) + 8;  // 8-byte aligned suffices for 8 fp8 elements
  EXPECT_EQ(epilogue_vector_elems(p), 8);
  p.q_out = static_cast<uint8_t*>(p.q_out) + 4;
  EXPECT_EQ(epilogue_vector_elems(p), 1);
}

TEST(EpiloguePlan, ExchangeDefersAndDeepensTheRing) {
  QkEpilogueParams p = aligned_params();
  p.tokens = 4096;
  const EpilogueShape alone = epilogue_shape(p, 1, 8, 4096);
  EXPECT_EQ(alone.defer, 0);
  EXPECT_EQ(alone.stages, 3);  // alone, a small stage has two rows loading ahead
  EXPECT_EQ(epilogue_shape(p, 1, 8, 64 * 1024).stages, 2);
  // With peers one row loads ahead, behind the deferred ones and the one reduced.
  EXPECT_EQ(epilogue_shape(p, 2, 8, 4096).defer, 1);
  EXPECT_EQ(epilogue_shape(p, 2, 8, 4096).stages, 3);
  EXPECT_EQ(epilogue_shape(p, 4, 8, 4096).defer, 2);
  EXPECT_EQ(epilogue_shape(p, 4, 8, 4096).stages, 4);
  EXPECT_EQ(epilogue_shape(p, 8, 8, 4096).defer, 2);
  EXPECT_EQ(epilogue_shape(p, 8, 8, 4096).stages, 4);
  EXPECT_EQ(epilogue_shape(p, 16, 8, 64 * 1024).stages, 4);
  QkEpilogueParams headwise = p;
  headwise.scope = NormScope::kHeadwise;  // nothing exchanged: nothing deferred
  EXPECT_EQ(epilogue_shape(headwise, 8, 8, 4096).defer, 0);
  EXPECT_EQ(epilogue_shape(headwise, 8, 8, 4096).stages, 3);
}

TEST(EpiloguePlan, FewTokensWithPeersDeferAtMostOne) {
  QkEpilogueParams p = aligned_params();
  for (int64_t tokens : {int64_t{1}, int64_t{7}, kEpilogueFewTokensMax}) {
    p.tokens = tokens;
    for (int world : {4, 8, 16}) {
      const EpilogueShape s = epilogue_shape(p, world, 8, 4096);
      EXPECT_EQ(s.defer, kEpilogueFewTokensMaxDefer) << tokens << " tokens, TP " << world;
      EXPECT_EQ(s.stages, kEpilogueFewTokensMaxDefer + 2) << tokens << " tokens, TP " << world;
    }
    EXPECT_EQ(epilogue_shape(p, 2, 8, 4096).defer, 1);
  }
  p.tokens = kEpilogueFewTokensMax + 1;
  EXPECT_EQ(epilogue_shape(p, 8, 8, 4096).defer, kEpilogueMaxDefer);
}

TEST(EpiloguePlan, TuningOverridesThePolicyAndAForcedRingShortensItsDeferral) {
  QkEpilogueParams p = aligned_params();
  p.tokens = 4096;
  p.tuning.block_threads = 96;
  p.tuning.stages = 5;
  EpilogueShape s = epilogue_shape(p, 8, 8, 4096);
  EXPECT_EQ(s.threads, 96);
  EXPECT_EQ(s.stages, 5);
  EXPECT_EQ(s.defer, 2);  // the policy's for TP 8
  p.tuning.stages = 3;
  EXPECT_EQ(epilogue_shape(p, 8, 8, 4096).defer, 1);  // stages - 2: one row still loads ahead
  p.tuning.stages = 2;
  EXPECT_EQ(epilogue_shape(p, 2, 8, 4096).defer, 0);
  p.tuning.stages = 6;
  EXPECT_EQ(epilogue_shape(p, 1, 8, 4096).defer, 0);  // alone: all but one stage load ahead
  p.tuning.stages = 0;
  p.tuning.defer = 0;  // the ring follows as defer + 1 + the row ahead
  s = epilogue_shape(p, 2, 8, 4096);
  EXPECT_EQ(s.defer, 0);
  EXPECT_EQ(s.stages, 2);
  p.tuning.defer = 3;
  EXPECT_EQ(epilogue_shape(p, 2, 8, 64 * 1024).stages, 5);
  EXPECT_EQ(epilogue_shape(p, 8, 8, 4096).stages, 5);
  p.tuning.defer = kEpilogueDeferCap;
  EXPECT_EQ(epilogue_shape(p, 8, 8, 4096).stages, kEpilogueStageCap);
}

TEST(EpiloguePlan, AForcedDeferralWithoutAnExchangeIsRefusedByName) {
  QkEpilogueParams p = aligned_params();
  p.tuning.defer = 1;
  try {
    epilogue_shape(p, 1, 8, 4096);
    ADD_FAILURE() << "a deferral at TP 1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tuning.defer = 1: a launch that exchanges nothing"),
              std::string::npos)
        << e.what();
  }
  p.scope = NormScope::kHeadwise;
  EXPECT_THROW(epilogue_shape(p, 8, 8, 4096), Error);
  p.tuning.defer = 0;
  EXPECT_EQ(epilogue_shape(p, 8, 8, 4096).defer, 0);
}

// Alone, a few tokens' launch shares each token of at least 384 rotated pairs between up to 4
// blocks while they take at most a quarter of the SMs; with peers a block is a token's.
TEST(EpiloguePlan, FewTokensAloneShareEachTokenBetweenBlocks) {
  alignas(16) static uint8_t q_out[16];
  QkEpilogueParams p = aligned_params();
  p.q_out = q_out;               // out of place: in place never splits (below)
  const int64_t olmo2 = 80 * 8;  // OLMo2-13B at TP 1: 80 Q and K heads of 8 NeoX pair items
  auto split = [&](const QkEpilogueParams& q, int world, int64_t tokens, int ranks, int64_t pairs,
                   int sms) {
    return epilogue_token_split(q, world, 8, tokens, ranks, pairs, sms);
  };
  EXPECT_EQ(split(p, 1, 1, 1, olmo2, 132), 4);
  EXPECT_EQ(split(p, 1, 8, 1, olmo2, 132), 4);  // 32 blocks
  EXPECT_EQ(split(p, 1, 9, 1, olmo2, 132), 2);
  EXPECT_EQ(split(p, 1, 16, 1, olmo2, 132), 2);
  EXPECT_EQ(split(p, 1, 17, 1, olmo2, 132), 1);
  EXPECT_EQ(split(p, 1, 4096, 1, olmo2, 132), 1);
  EXPECT_EQ(split(p, 1, 1, 1, olmo2, 12), 2);  // an SM budget of 12
  EXPECT_EQ(split(p, 1, 1, 1, 384, 132), 4);   // OLMo3-32B: 48 heads of 8 pairs
  EXPECT_EQ(split(p, 1, 1, 1, 383, 132), 1);
  EXPECT_EQ(split(p, 1, 1, 1, 256, 132), 1);    // OLMoE
  EXPECT_EQ(split(p, 1, 1, 1, 224, 132), 1);    // MiniMax-M2: 56 heads of 4 pairs
  EXPECT_EQ(split(p, 1, 1, 4, olmo2, 132), 4);  // 4 virtual ranks, 16 blocks
  EXPECT_EQ(split(p, 1, 4, 4, olmo2, 132), 2);
  EXPECT_EQ(split(p, 8, 1, 8, olmo2, 132), 1);  // exchanges: never split
  QkEpilogueParams headwise = p;
  headwise.scope = NormScope::kHeadwise;  // exchanges nothing at any TP
  EXPECT_EQ(split(headwise, 8, 2, 8, olmo2, 132), 2);
  QkEpilogueParams det = p;
  det.deterministic = true;  // its kernels never split
  EXPECT_EQ(split(det, 1, 1, 1, olmo2, 132), 1);
  EXPECT_EQ(epilogue_token_split(p, 1, 1, 1, 1, olmo2, 132), 1);  // nor the element path's
  p.tuning.split = 8;  // forced: taken as it is alone, past the policy's bounds
  EXPECT_EQ(split(p, 1, 4096, 1, olmo2, 132), 8);
  p.tuning.split = 1;
  EXPECT_EQ(split(p, 1, 1, 1, olmo2, 132), 1);
  EXPECT_EQ(split(p, 2, 1, 2, olmo2, 132), 1);  // 1 is every launch's
  // Above 1, refused by name with peers, on the element path and in the deterministic mode.
  p.tuning.split = 2;
  det.tuning.split = 2;
  auto refused = [&](const QkEpilogueParams& q, int world, int vec, const std::string& why) {
    try {
      epilogue_token_split(q, world, vec, 1, 1, olmo2, 132);
      ADD_FAILURE() << "a split was accepted: " << why;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("tuning.split = 2: " + why + " splits no token"),
                std::string::npos)
          << e.what();
    }
  };
  refused(p, 2, 8, "a launch that exchanges partial sums");
  refused(p, 1, 1, "the element path");
  refused(det, 1, 8, "the deterministic mode");
  QkEpilogueParams in_place = p;
  in_place.q_out = const_cast<void*>(in_place.q);
  refused(in_place, 1, 8, "a launch that writes Q or K in place");
  in_place = p;
  in_place.k_out = const_cast<void*>(in_place.k);
  in_place.k_out_stride = in_place.k_stride;
  refused(in_place, 1, 8, "a launch that writes Q or K in place");
  in_place.tuning.split = 0;  // tuned: never split there
  EXPECT_EQ(epilogue_token_split(in_place, 1, 8, 1, 1, olmo2, 132), 1);
  in_place.k_out = q_out;  // K out of place again
  EXPECT_EQ(epilogue_token_split(in_place, 1, 8, 1, 1, olmo2, 132), 4);
  // Alone it keeps the tuned block: the parts sum the row's squares in the unsplit order.
  EXPECT_EQ(epilogue_shape(p, 1, 8, 4096).threads,
            epilogue_shape(aligned_params(), 1, 8, 4096).threads);
}

TEST(EpiloguePlan, TuningValuesNoLaunchTakesAreRefusedByName) {
  auto refused = [](EpilogueTuning t, const std::string& what) {
    try {
      t.validate();
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  EpilogueTuning t;
  EXPECT_NO_THROW(t.validate());
  t.block_threads = 48;
  refused(t, "block_threads = 48");
  t.block_threads = 1024;
  refused(t, "block_threads = 1024");
  t = {};
  t.stages = 1;
  refused(t, "stages = 1");
  t.stages = kEpilogueStageCap + 1;
  refused(t, "stages = 7");
  t = {};
  for (int split : {-1, 3, 6, 16}) {
    t.split = split;
    refused(t, "split = " + std::to_string(split) + " is not a power of two in [1, 8]");
  }
  t = {};
  t.defer = kEpilogueDeferCap + 1;
  refused(t, "defer = 5");
  t.stages = 3;
  t.defer = 2;
  refused(t, "defer = 2 is outside [0, 1] (stages - 2 with stages = 3");
  t.defer = -2;
  refused(t, "defer = -2");
  t.defer = 1;
  EXPECT_NO_THROW(t.validate());
  t = {};
  for (int w : {-1, 3}) {
    t.weights = w;
    refused(t, "weights = " + std::to_string(w) + " is not 1 (shared memory) or 2 (global");
  }
  for (int w : {0, 1, 2}) {
    t.weights = w;
    EXPECT_NO_THROW(t.validate());
  }
}

TEST(EpiloguePlan, BlockGrowsWithTheRowUpToTheCap) {
  QkEpilogueParams p = aligned_params();
  p.num_q_heads = 1;
  p.num_kv_heads = 1;
  EXPECT_EQ(epilogue_shape(p, 1, 8, 0).threads, kEpilogueMinThreads);
  p.num_q_heads = 40;
  p.num_kv_heads = 40;  // 15360 elements: 1920 vectors
  EXPECT_EQ(epilogue_shape(p, 1, 8, 0).threads, kEpilogueBlockCap);
}

TEST(EpiloguePlan, CosSinRowsStageInTheWidestUnitTheirAlignmentAllows) {
  QkEpilogueParams p = aligned_params();  // fp32 table, rows of 128 x 4 bytes
  EXPECT_EQ(epilogue_cos_sin_copy_bytes(p), 16);
  p.rope.cos_sin_cache = static_cast<const uint8_t*>(p.rope.cos_sin_cache) + 4;
  EXPECT_EQ(epilogue_cos_sin_copy_bytes(p), 4);
  p = aligned_params();
  p.rope.cache_dtype = DType::kBF16;
  p.rope.rotary_dim = 6;  // 12-byte rows: whole 4-byte units only
  EXPECT_EQ(epilogue_cos_sin_copy_bytes(p), 4);
  p.rope.cos_sin_cache = static_cast<const uint8_t*>(p.rope.cos_sin_cache) + 2;
  EXPECT_EQ(epilogue_cos_sin_copy_bytes(p), 2);
  EXPECT_EQ(epilogue_shape(p, 1, 1, 0).cs_copy_bytes, 2);
}

TEST(EpiloguePlan, ItemsPerHead) {
  QkEpilogueParams p = aligned_params();
  EXPECT_EQ(epilogue_items_per_head(p, 8), 8);  // 8 NeoX pairs of vectors
  EXPECT_EQ(epilogue_pair_items(p, 8), 8);
  p.rope.rotary_dim = 64;
  EXPECT_EQ(epilogue_items_per_head(p, 8), 4 + 8);  // 4 pairs, then 8 unrotated vectors
  EXPECT_EQ(epilogue_pair_items(p, 8), 4);
  p.rope.style = RopeStyle::kGptj;
  EXPECT_EQ(epilogue_items_per_head(p, 8), 16);  // every vector rotates inside itself
  EXPECT_EQ(epilogue_pair_items(p, 8), 0);
  EXPECT_EQ(epilogue_items_per_head(p, 1), 32 + 64);
  EXPECT_EQ(epilogue_pair_items(p, 1), 32);  // the element path's GPT-J pairs
}

TEST(EpiloguePlan, DivisionByMultiplyIsExactInItsRange) {
  for (uint32_t d : {1u, 2u, 3u, 7u, 12u, 16u, 96u, 128u, 255u, 1000u}) {
    const uint32_t m = epilogue_div_magic(d);
    for (uint32_t n = 0; n < 70000 && static_cast<uint64_t>(n) * d < (uint64_t{1} << 32); ++n) {
      const uint32_t q = m == 0 ? n : static_cast<uint32_t>((static_cast<uint64_t>(n) * m) >> 32);
      ASSERT_EQ(q, n / d) << n << " / " << d;
    }
  }
}

}  // namespace
}  // namespace swiftqk
