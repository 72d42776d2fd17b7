// What the fused-epilogue GPU tests share: a local group of virtual ranks on GPU 0, each rank's
// buffers with a snapshot of its caches, and the check of every rank against the float64 gold.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "epilogue_problem.hpp"

namespace swiftqk::testing {

/// A model's attention geometry as the epilogue tests use it (head_dim 128).
struct EpilogueModel {
  const char* name;
  int64_t q_heads, kv_heads, rotary_dim;
  NormOrder order;
};
/// The DESIGN shapes with their real head counts; MiniMax-M2 rotates 64 of 128.
inline constexpr EpilogueModel kDesignModels[] = {
    {"olmoe", 16, 16, 128, NormOrder::kLlama},
    {"olmo2-13b", 40, 40, 128, NormOrder::kOlmo2},
    {"olmo3-32b", 40, 8, 128, NormOrder::kOlmo2},
    {"minimax-m2", 48, 8, 64, NormOrder::kLlama},
};

inline EpilogueSetup setup_of(const EpilogueModel& m, int64_t tokens, uint64_t seed) {
  EpilogueSetup s;
  s.tokens = tokens;
  s.q_heads = m.q_heads;
  s.kv_heads = m.kv_heads;
  s.rotary_dim = m.rotary_dim;
  s.order = m.order;
  s.seed = seed;
  return s;
}

struct EpilogueGroup {
  std::vector<Communicator> comms;
  std::vector<Communicator*> ptrs;
  explicit EpilogueGroup(int world, const CommConfig& config = {}) {
    comms = Communicator::create_local_group(std::vector<int>(world, 0), config);
    for (auto& c : comms) ptrs.push_back(&c);
  }
};

struct EpilogueRanks {
  std::vector<EpilogueRank> d;
  std::vector<CacheSnapshot> before;
  std::vector<QkEpilogueParams> params() const {
    std::vector<QkEpilogueParams> p;
    for (const auto& r : d) p.push_back(r.params);
    return p;
  }
};

/// Every rank's buffers, outputs and caches poisoned (seed + rank), caches snapshotted.
inline EpilogueRanks make_ranks(const EpilogueHost& h, int world, uint64_t seed) {
  EpilogueRanks r;
  for (int i = 0; i < world; ++i) {
    r.d.push_back(make_epilogue_rank(h, world, i));
    poison_epilogue(r.d.back(), seed + i, nullptr);
    r.before.push_back(snapshot_caches(r.d.back()));
  }
  return r;
}

inline void expect_ranks_correct(const EpilogueHost& h, int world, const EpilogueRanks& r,
                                 const std::vector<int64_t>& bad = {}) {
  const ref::EpilogueExpected gold = ref::epilogue_fp64(h.ref);
  for (int i = 0; i < world; ++i) {
    const EpilogueCheck c = check_epilogue_rank(h, gold, world, i, r.d[i], r.before[i], bad);
    EXPECT_TRUE(c.ok()) << h.s.name() << " TP " << world << " rank " << i << ": Q " << c.q_wrong
                        << ", K " << c.k_wrong << ", V " << c.v_wrong << ", k_out " << c.k_out_wrong
                        << " wrong, " << c.cache_changed
                        << " other cache bytes changed; first: " << c.first_error;
    EXPECT_GT(c.checked, 0);
  }
}

}  // namespace swiftqk::testing
