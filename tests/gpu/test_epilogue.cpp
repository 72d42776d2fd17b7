// The fused QK epilogue on one GPU with virtual ranks: against the float64 gold at TP 1-8 on the
// DESIGN shapes with their real head counts, both RoPE styles, full and partial rotary, both
// cache layouts, fp8 caches and fp8 Q, headwise norms; bad positions and slots raised by name
// with nothing written to the cache; graph replays at several token counts; chunked launches.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "epilogue_group.hpp"
#include "epilogue_problem.hpp"
#include "expect_error.hpp"
#include "require_gpu.hpp"

namespace swiftqk::testing {
namespace {

// One call of every rank in one launch; no error may be recorded.
void run_once(const EpilogueSetup& s, int world) {
  const EpilogueHost h = EpilogueHost::random(s);
  EpilogueGroup g(world);
  EpilogueRanks r = make_ranks(h, world, s.seed * 31);
  launch_qk_epilogue_group(g.ptrs, r.params(), nullptr);
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  for (auto& c : g.comms) c.check_error();
  expect_ranks_correct(h, world, r);
}

const auto& kModels = kDesignModels;

TEST(Epilogue, DesignShapesAtEveryTpDegree) {
  REQUIRE_GPU();
  uint64_t seed = 100;
  for (const EpilogueModel& m : kModels) {
    for (int world : {1, 2, 4, 8}) {
      if (m.kv_heads % world != 0 || m.q_heads % world != 0) continue;
      for (int64_t tokens : {1, 37, 300}) run_once(setup_of(m, tokens, ++seed), world);
    }
  }
}

TEST(Epilogue, StylesRotaryDimsDtypesAndLayouts) {
  REQUIRE_GPU();
  uint64_t seed = 500;
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
    for (int64_t rot : {128, 64, 32}) {
      for (DType dt : {DType::kBF16, DType::kF16}) {
        for (bool hnd : {false, true}) {
          EpilogueSetup s = setup_of(kModels[3], 77, ++seed);  // MiniMax-M2's heads
          s.style = style;
          s.rotary_dim = rot;
          s.dtype = s.q_out_dtype = s.cache_dtype = dt;
          s.cos_sin_dtype = hnd ? dt : DType::kF32;
          s.hnd = hnd;
          s.in_place = !hnd;
          s.k_out = hnd;
          run_once(s, 2);
        }
      }
    }
  }
}

// Head dims of 80 and 96: 5 or 6 rotated pairs a head (3 with partial rotary) and 10 or 12
// GPT-J vectors, which divide no block size, so a thread's items fall in different heads and at
// different offsets from token to token; 40 of 80 rotates a NeoX half of 20, which takes the
// element path.
TEST(Epilogue, HeadItemsThatDoNotDivideTheBlock) {
  REQUIRE_GPU();
  uint64_t seed = 700;
  for (int64_t hd : {80, 96}) {
    for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
      for (int64_t rot : {hd, hd / 2}) {
        for (int world : {1, 2}) {
          EpilogueSetup s;
          s.q_heads = 12;
          s.kv_heads = 4;
          s.head_dim = hd;
          s.rotary_dim = rot;
          s.style = style;
          s.tokens = 70;
          s.k_out = world == 2;
          s.seed = ++seed;
          run_once(s, world);
        }
      }
    }
  }
}

TEST(Epilogue, Fp8CacheAndFp8Q) {
  REQUIRE_GPU();
  uint64_t seed = 900;
  for (const EpilogueModel& m : {kModels[0], kModels[3]}) {
    for (int world : {1, 4}) {
      for (int variant = 0; variant < 3; ++variant) {
        EpilogueSetup s = setup_of(m, 129, ++seed);
        s.cache_dtype = variant != 1 ? DType::kF8E4M3 : s.dtype;
        s.q_out_dtype = variant != 0 ? DType::kF8E4M3 : s.dtype;
        s.in_place = s.q_out_dtype == s.dtype;
        s.hnd = variant == 2;
        run_once(s, world);
      }
    }
  }
}

TEST(Epilogue, HeadwiseNorms) {
  REQUIRE_GPU();
  uint64_t seed = 1300;
  // Qwen3: rounded, then weighted (Llama order); Gemma-3: 1 + w in fp32, rounded once.
  for (bool gemma : {false, true}) {
    for (int world : {1, 2}) {
      EpilogueSetup s;
      s.q_heads = 32;
      s.kv_heads = 8;
      s.tokens = 200;
      s.scope = NormScope::kHeadwise;
      s.order = gemma ? NormOrder::kOlmo2 : NormOrder::kLlama;
      s.weight_plus_one = gemma;
      s.seed = ++seed;
      run_once(s, world);
    }
  }
}

TEST(Epilogue, UnalignedRowsTakeTheElementPath) {
  REQUIRE_GPU();
  for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
    EpilogueSetup s = setup_of(kModels[3], 45, style == RopeStyle::kNeox ? 1401 : 1402);
    s.unaligned = true;
    s.style = style;
    s.k_out = true;
    run_once(s, 2);
  }
}

TEST(Epilogue, ChunkedBeyondTheWorkspaceCapacity) {
  REQUIRE_GPU();
  CommConfig config;
  config.token_capacity = 64;
  config.chunk_oversize = true;
  const EpilogueHost h = EpilogueHost::random(setup_of(kModels[0], 300, 1500));
  EpilogueGroup g(2, config);
  EpilogueRanks r = make_ranks(h, 2, 1501);
  launch_qk_epilogue_group(g.ptrs, r.params(), nullptr);
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  for (auto& c : g.comms) c.check_error();
  expect_ranks_correct(h, 2, r);
}

// Every output byte a call writes (q_out, or the rows of q in place; both caches; k_out).
std::vector<uint8_t> output_bytes(const EpilogueRank& d) {
  std::vector<uint8_t> out;
  for (const DeviceBuffer* b : {&d.qkv, &d.q_out, &d.k_out, &d.k_cache, &d.v_cache}) {
    const std::size_t at = out.size();
    out.resize(at + b->bytes());
    if (b->bytes() > 0) {
      SWIFTQK_CUDA_TRY(cudaMemcpy(out.data() + at, b->get(), b->bytes(), cudaMemcpyDeviceToHost));
    }
  }
  return out;
}

// One launch of every rank with tuning t, checked against float64; each rank's output bytes.
std::vector<std::vector<uint8_t>> checked_outputs(const EpilogueHost& h,
                                                  const ref::EpilogueExpected& gold, int world,
                                                  const EpilogueTuning& t) {
  EpilogueGroup g(world);
  EpilogueRanks r = make_ranks(h, world, h.s.seed * 31);
  std::vector<QkEpilogueParams> p = r.params();
  for (QkEpilogueParams& e : p) e.tuning = t;
  launch_qk_epilogue_group(g.ptrs, p, nullptr);
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  for (auto& c : g.comms) c.check_error();
  for (int i = 0; i < world; ++i) {
    const EpilogueCheck c = check_epilogue_rank(h, gold, world, i, r.d[i], r.before[i], {});
    EXPECT_TRUE(c.ok()) << "rank " << i << ": " << c.first_error;
    EXPECT_GT(c.checked, 0);
  }
  std::vector<std::vector<uint8_t>> bytes;
  for (const EpilogueRank& d : r.d) bytes.push_back(output_bytes(d));
  return bytes;
}

// Every launch shape EpilogueTuning allows is correct against float64; the ring's depth and the
// deferral leave every output bit as the tuned launch writes it, since they change when a row is
// processed, not how. A deferral at TP 1 is refused by name, with nothing written.
TEST(Epilogue, EveryForcedLaunchShapeIsCorrectAndRingsKeepTheBits) {
  REQUIRE_GPU();
  uint64_t seed = 3100;
  int compared = 0, refused = 0;
  for (const EpilogueModel& m : {kModels[0], kModels[2], kModels[3]}) {
    for (int world : {1, 2, 8}) {
      if (m.kv_heads % world != 0) continue;
      const EpilogueSetup s = setup_of(m, 300, ++seed);
      const EpilogueHost h = EpilogueHost::random(s);
      const ref::EpilogueExpected gold = ref::epilogue_fp64(h.ref);
      auto run = [&](const EpilogueTuning& t) { return checked_outputs(h, gold, world, t); };
      const auto tuned = run({});
      for (int threads : {0, 32, 512}) {
        for (int stages : {0, 2, 4, 6}) {
          for (int defer : {-1, 0, 1, 2, 3}) {
            EpilogueTuning t;
            t.block_threads = threads;
            t.stages = stages;
            t.defer = defer;
            try {
              t.validate();
            } catch (const Error&) {
              continue;  // refused by name (CPU-tested); not a launch shape
            }
            SCOPED_TRACE(m.name + std::string(" TP ") + std::to_string(world) + " threads " +
                         std::to_string(threads) + " stages " + std::to_string(stages) + " defer " +
                         std::to_string(defer));
            if (world == 1 && defer > 0) {  // nothing exchanged, nothing to defer: refused
              EpilogueGroup g(world);
              EpilogueRanks r = make_ranks(h, world, s.seed * 31);
              const std::vector<uint8_t> before = output_bytes(r.d[0]);
              std::vector<QkEpilogueParams> p = r.params();
              p[0].tuning = t;
              expect_error([&] { launch_qk_epilogue_group(g.ptrs, p, nullptr); },
                           {"tuning.defer = ", "a launch that exchanges nothing"});
              SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
              EXPECT_TRUE(output_bytes(r.d[0]) == before) << "a refused launch wrote";
              ++refused;
              continue;
            }
            const auto got = run(t);
            if (threads == 0) {
              for (int i = 0; i < world; ++i) EXPECT_TRUE(got[i] == tuned[i]) << "rank " << i;
              ++compared;
            }
          }
        }
      }
    }
  }
  EXPECT_GE(compared, 100);  // the bitwise comparisons ran
  EXPECT_GT(refused, 0);
}

// With peers, the norm weights read from global memory (EpilogueTuning::weights = 2) enter the
// same arithmetic as the staged copy (1): every output bit is the same at TP 2-8 on the DESIGN
// shapes (a few tokens and many), on the element path and with an fp8 cache and Q. A launch that
// exchanges nothing, and the deterministic mode, refuse it by name and write nothing.
TEST(Epilogue, WeightsFromGlobalMemoryKeepTheBits) {
  REQUIRE_GPU();
  uint64_t seed = 3300;
  std::vector<std::pair<EpilogueSetup, int>> cases;
  for (const EpilogueModel& m : kModels) {
    for (int world : {2, 4, 8}) {
      if (m.kv_heads % world != 0) continue;
      for (int64_t tokens : {3, 300}) cases.emplace_back(setup_of(m, tokens, ++seed), world);
    }
  }
  EpilogueSetup fp8 = setup_of(kModels[3], 120, ++seed);
  fp8.cache_dtype = fp8.q_out_dtype = DType::kF8E4M3;
  fp8.in_place = false;
  cases.emplace_back(fp8, 2);
  EpilogueSetup element = setup_of(kModels[0], 40, ++seed);
  element.unaligned = true;  // rows one element off 16 bytes: the element path
  cases.emplace_back(element, 2);
  EpilogueTuning shared, global;
  shared.weights = 1;
  global.weights = 2;
  for (const auto& [s, world] : cases) {
    SCOPED_TRACE("heads " + std::to_string(s.q_heads) + "/" + std::to_string(s.kv_heads) +
                 " tokens " + std::to_string(s.tokens) + " TP " + std::to_string(world));
    const EpilogueHost h = EpilogueHost::random(s);
    const ref::EpilogueExpected gold = ref::epilogue_fp64(h.ref);
    const auto a = checked_outputs(h, gold, world, shared);
    const auto b = checked_outputs(h, gold, world, global);
    for (int i = 0; i < world; ++i) EXPECT_TRUE(a[i] == b[i]) << "rank " << i;
  }
  for (int world : {1, 2}) {  // TP 1 exchanges nothing; TP 2 in the deterministic mode
    const EpilogueHost h = EpilogueHost::random(setup_of(kModels[0], 16, ++seed));
    EpilogueGroup g(world);
    EpilogueRanks r = make_ranks(h, world, h.s.seed * 31);
    const std::vector<uint8_t> before = output_bytes(r.d[0]);
    std::vector<QkEpilogueParams> p = r.params();
    for (QkEpilogueParams& e : p) {
      e.tuning = global;
      e.deterministic = world == 2;
    }
    expect_error([&] { launch_qk_epilogue_group(g.ptrs, p, nullptr); },
                 {"tuning.weights = 2: ",
                  world == 1 ? "a launch that exchanges nothing" : "the deterministic mode"});
    SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
    EXPECT_TRUE(output_bytes(r.d[0]) == before) << "a refused launch wrote";
  }
}

// Alone and out of place, the blocks that share a token (EpilogueTuning::split; the policy
// splits launches of a few tokens) write the bits of the unsplit launch: each sums the whole
// row's squares in the same order and writes its own items and V vectors. Every DESIGN shape at
// TP 1, and a headwise launch at TP 2 (alone at any TP), GPT-J with partial rotary, fp8 Q and
// cache, and an HND cache with k_out; token counts that leave parts of one token to blocks with
// and without a second token. In place, a part would overwrite a row the token's other parts may
// not have staged yet: a forced split is refused there, as on the element path.
TEST(Epilogue, SplitTokensKeepTheBits) {
  REQUIRE_GPU();
  std::vector<std::pair<EpilogueSetup, int>> cases;
  uint64_t seed = 3300;
  for (const EpilogueModel& m : kModels) cases.emplace_back(setup_of(m, 1, ++seed), 1);
  EpilogueSetup headwise = setup_of(kModels[0], 1, ++seed);
  headwise.scope = NormScope::kHeadwise;
  cases.emplace_back(headwise, 2);
  EpilogueSetup gptj = setup_of(kModels[3], 1, ++seed);
  gptj.style = RopeStyle::kGptj;
  gptj.q_out_dtype = gptj.cache_dtype = DType::kF8E4M3;
  gptj.in_place = false;
  cases.emplace_back(gptj, 1);
  EpilogueSetup hnd = setup_of(kModels[2], 1, ++seed);
  hnd.hnd = true;
  hnd.in_place = false;
  hnd.k_out = true;
  cases.emplace_back(hnd, 1);
  int compared = 0;
  for (auto [s, world] : cases) {
    s.in_place = false;
    for (int64_t tokens : {1, 3, 64, 300}) {
      s.tokens = tokens;
      s.seed += 7;
      const EpilogueHost h = EpilogueHost::random(s);
      const ref::EpilogueExpected gold = ref::epilogue_fp64(h.ref);
      EpilogueTuning t;
      t.split = 1;
      const auto unsplit = checked_outputs(h, gold, world, t);
      for (int split : {0, 2, 4, 8}) {
        SCOPED_TRACE(s.name() + " TP " + std::to_string(world) + " split " + std::to_string(split));
        t.split = split;
        const auto got = checked_outputs(h, gold, world, t);
        for (int i = 0; i < world; ++i) EXPECT_TRUE(got[i] == unsplit[i]) << "rank " << i;
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 7 * 4 * 4);
  // Where no kernel splits, a forced split is refused by name and nothing is written.
  EpilogueSetup element = setup_of(kModels[3], 3, ++seed);
  element.unaligned = true;
  element.in_place = false;
  EpilogueSetup in_place = setup_of(kModels[1], 3, ++seed);
  for (const auto& [s, why] : {std::pair{element, "the element path"},
                               std::pair{in_place, "a launch that writes Q or K in place"}}) {
    const EpilogueHost h = EpilogueHost::random(s);
    EpilogueGroup g(1);
    EpilogueRanks r = make_ranks(h, 1, 3400);
    const std::vector<uint8_t> before = output_bytes(r.d[0]);
    std::vector<QkEpilogueParams> p = r.params();
    p[0].tuning.split = 2;
    expect_error([&] { launch_qk_epilogue_group(g.ptrs, p, nullptr); },
                 {"tuning.split = 2", std::string(why) + " splits no token"});
    SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
    EXPECT_TRUE(output_bytes(r.d[0]) == before) << "a refused launch wrote";
  }
}

// Graphs captured once per token count replay on fresh inputs each time.
TEST(Epilogue, GraphReplaysAtSeveralTokenCounts) {
  REQUIRE_GPU();
  const int world = 4;
  EpilogueGroup g(world);
  cudaStream_t st;
  SWIFTQK_CUDA_TRY(cudaStreamCreate(&st));
  for (int64_t tokens : {1, 64, 513}) {
    EpilogueHost h = EpilogueHost::random(setup_of(kModels[2], tokens, 1600 + tokens));
    EpilogueRanks r = make_ranks(h, world, 1700 + tokens);
    const std::vector<QkEpilogueParams> params = r.params();
    cudaGraphExec_t ge = capture_graph(st, [&] { launch_qk_epilogue_group(g.ptrs, params, st); });
    for (int replay = 0; replay < 3; ++replay) {
      h.refill(1800 + tokens * 10 + replay);
      for (int i = 0; i < world; ++i) {
        upload_epilogue_inputs(h, world, i, r.d[i], st);
        poison_epilogue(r.d[i], 1900 + replay, st);
        r.before[i] = snapshot_caches(r.d[i]);
      }
      SWIFTQK_CUDA_TRY(cudaGraphLaunch(ge, st));
      SWIFTQK_CUDA_TRY(cudaStreamSynchronize(st));
      for (auto& c : g.comms) c.check_error();
      expect_ranks_correct(h, world, r);
    }
    SWIFTQK_CUDA_TRY(cudaGraphExecDestroy(ge));
  }
  SWIFTQK_CUDA_TRY(cudaStreamDestroy(st));
}

// A bad position or slot on the device: the token's writes are skipped (its Q row is NaN), every
// other token is right, no other cache byte changes, and the host raises naming the token and
// the value, at check_error() and at the next launch, until reset(). With 50 tokens each block
// has one, the first it stages; with 3000 at TP 1 (264 blocks of OLMo2-13B on an H100 or H200)
// token 2990 is its block's twelfth, whose position warp 0 loads one staging ahead in the loop.
// With 4 tokens at TP 1 out of place each token is split between four blocks
// (epilogue_token_split): the first records the failure and poisons Q, and none writes the
// token's K or V.
void bad_value_case(bool position, int world, int64_t tokens = 50, int64_t bad_token = 17,
                    bool in_place = true, std::optional<int64_t> bad_position = std::nullopt) {
  EpilogueSetup s = setup_of(kModels[1], tokens, position ? 2001 : 2002);
  s.in_place = in_place;
  EpilogueHost h = EpilogueHost::random(s);
  int64_t bad_value;
  if (position) {
    bad_value = bad_position.value_or(s.max_position);
    h.ref.positions[bad_token] = bad_value;
  } else {
    bad_value = h.cache_slots() + 5;
    h.slots[bad_token] = bad_value;
  }
  EpilogueGroup g(world);
  EpilogueRanks r = make_ranks(h, world, 2100);
  launch_qk_epilogue_group(g.ptrs, r.params(), nullptr);
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  expect_ranks_correct(h, world, r, {bad_token});
  const std::string what = position ? "position" : "slot";
  for (auto& c : g.comms) {
    EXPECT_EQ(c.failure().code, position ? 4u : 5u);
    EXPECT_EQ(c.failure().token, bad_token);
    EXPECT_EQ(c.failure().value, bad_value);
    expect_error([&] { c.check_error(); },
                 {"token " + std::to_string(bad_token), std::to_string(bad_value), what});
  }
  // The next launch refuses before writing anything.
  for (int i = 0; i < world; ++i) {
    poison_epilogue(r.d[i], 2200 + i, nullptr);
    r.before[i] = snapshot_caches(r.d[i]);
  }
  expect_error([&] { launch_qk_epilogue_group(g.ptrs, r.params(), nullptr); },
               {"token " + std::to_string(bad_token)});
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  for (int i = 0; i < world; ++i) {
    const CacheSnapshot now = snapshot_caches(r.d[i]);
    EXPECT_EQ(now.k, r.before[i].k);
    EXPECT_EQ(now.v, r.before[i].v);
  }
  // After reset() and with good data, the group works again.
  g.comms[0].reset();
  if (position) {
    h.ref.positions[bad_token] = 3;
  } else {
    h.slots[bad_token] = -1;
  }
  for (int i = 0; i < world; ++i) {
    upload_epilogue_inputs(h, world, i, r.d[i], nullptr);
    poison_epilogue(r.d[i], 2300 + i, nullptr);
    r.before[i] = snapshot_caches(r.d[i]);
  }
  launch_qk_epilogue_group(g.ptrs, r.params(), nullptr);
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  for (auto& c : g.comms) c.check_error();
  expect_ranks_correct(h, world, r);
}

TEST(Epilogue, BadPositionIsRaisedAndWritesNothingOfThatToken) {
  REQUIRE_GPU();
  bad_value_case(true, 1);
  bad_value_case(true, 2);
  bad_value_case(true, 1, 4, 2, false);
  // Out of range in their 64 bits, not in their low 32: 2^32 + 3 (row 3 of the table, read by
  // its low word) and -1 (0xffffffff), so a kernel that indexes by a position's low word is
  // still held to catching them.
  bad_value_case(true, 2, 50, 17, true, (int64_t{1} << 32) + 3);
  bad_value_case(true, 1, 50, 17, true, (int64_t{1} << 32) + 3);
  bad_value_case(true, 2, 50, 17, true, -1);
}

TEST(Epilogue, BadSlotIsRaisedAndWritesNothingOfThatToken) {
  REQUIRE_GPU();
  bad_value_case(false, 1);
  bad_value_case(false, 4);
  bad_value_case(false, 1, 4, 1, false);
}

TEST(Epilogue, BadValuesLateInABlocksSequenceAreRaised) {
  REQUIRE_GPU();
  bad_value_case(true, 1, 3000, 2990);
  bad_value_case(false, 1, 3000, 2990);
  bad_value_case(false, 2, 3000, 2990);
}

// A host-checkable mistake throws before anything is written.
TEST(Epilogue, BadParamsThrowAndWriteNothing) {
  REQUIRE_GPU();
  const EpilogueHost h = EpilogueHost::random(setup_of(kModels[0], 20, 2400));
  EpilogueGroup g(2);
  EpilogueRanks r = make_ranks(h, 2, 2401);
  std::vector<QkEpilogueParams> p = r.params();
  p[1].rope.rotary_dim = 127;
  expect_error([&] { launch_qk_epilogue_group(g.ptrs, p, nullptr); }, {"rotary_dim"});
  p = r.params();
  p[0].num_kv_heads = 3;  // ranks disagree
  expect_error([&] { launch_qk_epilogue_group(g.ptrs, p, nullptr); }, {"rank slot"});
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  for (int i = 0; i < 2; ++i) {
    const CacheSnapshot now = snapshot_caches(r.d[i]);
    EXPECT_EQ(now.k, r.before[i].k);
    EXPECT_EQ(now.v, r.before[i].v);
  }
}

// The check itself can fail: a gold of the other rotation style, and one stray cache byte, are
// both caught.
TEST(Epilogue, CheckCatchesAWrongRotationAndAStrayCacheWrite) {
  REQUIRE_GPU();
  const EpilogueHost h = EpilogueHost::random(setup_of(kModels[0], 40, 2500));
  EpilogueGroup g(1);
  EpilogueRanks r = make_ranks(h, 1, 2501);
  launch_qk_epilogue_group(g.ptrs, r.params(), nullptr);
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  g.comms[0].check_error();
  EpilogueHost other = h;
  other.ref.style = RopeStyle::kGptj;
  const EpilogueCheck wrong_style =
      check_epilogue_rank(h, ref::epilogue_fp64(other.ref), 1, 0, r.d[0], r.before[0]);
  EXPECT_GT(wrong_style.q_wrong, 0);
  EXPECT_GT(wrong_style.k_wrong, 0);
  // A slot no token maps to (40 tokens, 208 slots) is poked.
  int64_t unused = 0;
  while (std::count(h.slots.begin(), h.slots.end(), unused) != 0) ++unused;
  const uint8_t poke = static_cast<uint8_t>(r.before[0].k[unused * 16 * 128 * 2] ^ 0x5a);
  SWIFTQK_CUDA_TRY(
      cudaMemcpy(r.d[0].k_cache.get() + unused * 16 * 128 * 2, &poke, 1, cudaMemcpyHostToDevice));
  const EpilogueCheck stray =
      check_epilogue_rank(h, ref::epilogue_fp64(h.ref), 1, 0, r.d[0], r.before[0]);
  EXPECT_EQ(stray.q_wrong, 0);
  EXPECT_EQ(stray.cache_changed, 1);
}

}  // namespace
}  // namespace swiftqk::testing
