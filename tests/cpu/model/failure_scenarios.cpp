#include "failure_scenarios.hpp"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "swiftqk/error.hpp"

namespace swiftqk::model::failure {

Call FailingCall(int data) {
  Call c;
  c.data = data;
  c.tokens = 4;
  c.blocks = 2;
  c.deadline = kFailDeadline;
  return c;
}

Call ReplayOf(Call c) {
  c.replay = true;
  return c;
}

Rows CheckAll(const Comm& c, const std::vector<std::shared_ptr<Kernel>>& kernels) {
  Rows rows;
  for (const auto& kn : kernels) {
    kn->Join();
    rows += c.Check(*kn);
  }
  return rows;
}

std::vector<ResetOutcome> ResetAll(Comm& c, Ms barrier_deadline) {
  std::vector<ResetOutcome> o(c.world());
  on_every_rank(c.world(), [&](int r) { o[r] = c.Reset(r, barrier_deadline); });
  return o;
}

void ExpectIdleAndHealthy(const Comm& c, uint32_t call) {
  for (int r = 0; r < c.world(); ++r) {
    EXPECT_EQ(c.code(r), 0u) << "rank " << r << ": " << c.Describe(r);
    EXPECT_EQ(c.fault(r), 0u) << "rank " << r;
    EXPECT_EQ(c.owner(r), 0u) << "rank " << r;
    EXPECT_EQ(c.blocks_done(r), 0u) << "rank " << r;
    EXPECT_EQ(c.call(r), call) << "rank " << r;
  }
}

Rows RunCalls(Comm& c, int calls, int first_data, uint64_t seed) {
  std::vector<Rows> rows(c.world());
  on_every_rank(c.world(), [&](int r) {
    std::mt19937_64 host_rng(seed);
    std::mt19937_64 rank_rng(splitmix64(seed * 977 + static_cast<uint64_t>(r)));
    for (int i = 0; i < calls; ++i) {
      Call call;
      call.data = first_data + i;
      call.tokens = 1 + static_cast<int64_t>(host_rng() % kCapacity);
      call.blocks = 1 + static_cast<int>(rank_rng() % 3);
      call.defer = static_cast<int>(rank_rng() % 3);
      call.jitter = true;
      try {
        auto kn = c.Launch(r, call);
        kn->Join();
        rows[r] += c.Check(*kn);
      } catch (const Error& e) {
        Rows refused;
        refused.wrong = call.tokens;
        refused.first_wrong = std::string("refused: ") + e.what();
        rows[r] += refused;
        return;
      }
      maybe_delay(rank_rng, 16, 300);
    }
  });
  Rows all;
  for (const Rows& x : rows) all += x;
  return all;
}

}  // namespace swiftqk::model::failure
