// Failure model scenarios (model/failure_model.hpp) of the owner claim: two kernels of one
// rank at once, a second kernel before the owner's later block, and launch ids whose bits cover
// the owner's; with negative controls for the claim itself and for plain launch ids.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.hpp"
#include "model/failure_scenarios.hpp"

namespace swiftqk {
namespace {

using namespace model;
using namespace model::failure;
using testing::expect_error;

// Rank 0 runs kernels A (data 0) and B (data 100) at once, rank 1 its call 0 (data 0); two
// tokens, two blocks each, and the n-th pair of ids id_a, id_b. Forced: A's blocks pass their
// claim first; B's blocks publish (if they do) only after A's have; A's blocks account only once
// B's have left, so that A still owns the rank while B runs. peer_after_b: rank 1 starts once
// each of B's blocks has published or left; else it starts with A.
Rows TwoKernelsOnRank0(Comm& c, bool peer_after_b, int n = 0,
                       std::shared_ptr<Kernel>* b_kernel = nullptr) {
  Latch a_claimed(2), a_published(2), b_through(2), b_left(2);
  std::atomic<bool> b_published[2] = {{false}, {false}};
  Call a;
  a.tokens = 2;
  a.id = id_a(n);
  a.hook = [&](Event e, int, int64_t) {
    if (e == Event::kClaimed) a_claimed.CountDown();
    if (e == Event::kAfterPublish) a_published.CountDown();
    if (e == Event::kBeforeAccount) {
      EXPECT_TRUE(b_left.Wait());
    }
  };
  Call b = a;
  b.data = 100;
  b.id = id_b(n);
  b.hook = [&](Event e, int block, int64_t) {
    if (e == Event::kBeforePublish) {
      EXPECT_TRUE(a_published.Wait());
    }
    if (e == Event::kAfterPublish && !b_published[block].exchange(true)) b_through.CountDown();
    if (e == Event::kExit) {
      if (!b_published[block].exchange(true)) b_through.CountDown();
      b_left.CountDown();
    }
  };
  Call peer;
  peer.tokens = 2;
  std::vector<std::shared_ptr<Kernel>> kernels;
  kernels.push_back(c.Launch(0, a));
  if (!peer_after_b) kernels.push_back(c.Launch(1, peer));
  EXPECT_TRUE(a_claimed.Wait());
  kernels.push_back(c.Launch(0, b));
  if (b_kernel != nullptr) *b_kernel = kernels.back();
  if (peer_after_b) {
    EXPECT_TRUE(b_through.Wait());
    kernels.push_back(c.Launch(1, peer));
  }
  return CheckAll(c, kernels);
}

TEST(FailureModel, TwoConcurrentKernelsOnOneRank) {
  const TimeBound bound(Ms(10000));
  Comm c(2);
  // B's block 0 finds A owning rank 0 and B's block 1 finds A | B (or A, had it read W before B's
  // block 0's OR): both note code 2, marking rank 0's fault word, and leave. A's blocks stop on
  // that mark; rank 1, starting after B's record, gives up at entry on rank 0's fault.
  std::shared_ptr<Kernel> b;
  const Rows rows = TwoKernelsOnRank0(c, true, 0, &b);
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_EQ(rows.nan, 6);
  EXPECT_EQ(b->not_owners.load(), 2);
  EXPECT_EQ(b->noted(kConcurrentKernel), 2);
  EXPECT_EQ(b->recorded.load(), 1);
  EXPECT_EQ(c.code(0), kConcurrentKernel);
  EXPECT_EQ(c.code(1), kPeerFailed);
  EXPECT_EQ(c.peer(1), 0);
  for (int r = 0; r < 2; ++r) {  // A advanced rank 0's call once and cleared B's bits; B not at all
    EXPECT_EQ(c.owner(r), 0u);
    EXPECT_EQ(c.blocks_done(r), 0u);
    EXPECT_EQ(c.call(r), 1u);
  }
  for (const ResetOutcome& o : ResetAll(c)) EXPECT_TRUE(o.ok) << o.error;
  ExpectIdleAndHealthy(c, 0);

  // Rank 1 running alongside: rows are correct where A and rank 1 finished before B's note and
  // record reached them, NaN elsewhere, never wrong.
  Rows mixed;
  for (int rep = 1; rep <= 20; ++rep) {
    mixed += TwoKernelsOnRank0(c, false, rep);
    EXPECT_EQ(c.code(0), kConcurrentKernel);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(c.owner(r), 0u);
      EXPECT_EQ(c.blocks_done(r), 0u);
    }
    for (const ResetOutcome& o : ResetAll(c)) EXPECT_TRUE(o.ok) << o.error;
  }
  EXPECT_EQ(mixed.wrong, 0) << mixed.first_wrong;
  const Rows after = RunCalls(c, 200, 1000, 17);
  EXPECT_EQ(after.nan + after.wrong, 0) << after.first_wrong;
  ExpectIdleAndHealthy(c, 200);
  std::cout << "[ model    ] two kernels beside a running peer, 20 times: " << mixed.correct
            << " rows correct, " << mixed.nan << " NaN, " << mixed.wrong << " wrong\n";
}

TEST(FailureModel, SecondKernelBeforeTheOwnersLaterBlockLeavesTheRankClaimedUntilReset) {
  // A's block 1 starts only once B's block 0 has ORed B's id into W (on the GPU: A's grid is not
  // all resident yet). It reads A | B, which is not A: it notes code 2 and does not count, so A
  // never releases the rank. W keeps {call 0, A | B} and blocks_done 1 after every kernel has
  // finished; every later kernel of rank 0 finds an owner and fails loudly, replays included,
  // until reset, whose quiesce waits out its bound (the owner half never clears; the rank's code
  // is set) and then clears.
  const TimeBound bound(Ms(5000));
  Comm c(2);
  Latch a0_claimed, b0_claimed;
  Call a;
  a.tokens = 2;
  a.id = id_a(0);
  a.hook = [&](Event e, int block, int64_t) {
    if (e == Event::kClaimed && block == 0) a0_claimed.CountDown();
    if (e == Event::kStart && block == 1) {
      EXPECT_TRUE(b0_claimed.Wait());
    }
  };
  Call b = a;
  b.data = 100;
  b.id = id_b(0);
  b.hook = [&](Event e, int block, int64_t) {
    if (e == Event::kClaimed && block == 0) b0_claimed.CountDown();
  };
  Call peer;
  peer.tokens = 2;
  auto ka = c.Launch(0, a);
  auto kp = c.Launch(1, peer);
  EXPECT_TRUE(a0_claimed.Wait());
  auto kb = c.Launch(0, b);
  const Rows rows = CheckAll(c, {ka, kb, kp});
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_EQ(ka->owners.load(), 1);
  EXPECT_EQ(ka->not_owners.load(), 1);
  EXPECT_EQ(kb->not_owners.load(), 2);
  EXPECT_EQ(c.code(0), kConcurrentKernel);
  const uint32_t both = c.OwnerId(id_a(0)) | c.OwnerId(id_b(0));
  EXPECT_EQ(c.owner(0), both);
  EXPECT_EQ(c.blocks_done(0), 1u);
  EXPECT_EQ(c.call(0), 0u);
  EXPECT_EQ(c.code(1), kPeerFailed);  // rank 1's block 1 waited for rank 0's token 1
  EXPECT_EQ(c.peer(1), 0);

  expect_error([&] { c.Launch(0, FailingCall(1))->Join(); },
               "rank 0: another kernel of this communicator ran at the same time");
  for (int data = 1; data <= 3; ++data) {
    auto replay = c.Launch(0, ReplayOf(FailingCall(data)));
    replay->Join();
    EXPECT_EQ(replay->not_owners.load(), 2);
    EXPECT_EQ(replay->recorded.load(), 0);  // the record keeps the first failure
    EXPECT_EQ(c.Check(*replay).nan, 4);
  }
  // Each replay's block 0 ORed its id in as well.
  EXPECT_EQ(c.owner(0) & both, both);
  EXPECT_EQ(c.blocks_done(0), 1u);

  const std::vector<ResetOutcome> o = ResetAll(c);
  for (const ResetOutcome& x : o) EXPECT_TRUE(x.ok) << x.error;
  EXPECT_GE(o[0].quiesced.count(), kQuiesceBound.count());
  EXPECT_LT(o[1].quiesced.count(), kQuiesceBound.count());
  ExpectIdleAndHealthy(c, 0);
  const Rows after = RunCalls(c, 50, 1000, 29);
  EXPECT_EQ(after.nan + after.wrong, 0) << after.first_wrong;
  ExpectIdleAndHealthy(c, 50);
}

// ---------------------------------------------------------------- a gap in the claim

// Rank 0 runs A and B at once, where B's id contains every bit of A's (an even id and the next
// one: 0x1000 and 0x1001), so B's block 0 turns W's owner half into A | B = B. Rank 1 runs call 0.
// Two tokens, two blocks each. Forced: A's blocks pass their claim first and publish; B's block 1
// starts once B's block 0 has claimed and publishes only after A's blocks have; rank 1 starts
// once B's block 1 has published or left; B's block 0 stalls between its claim and its note until
// rank 1's block 1 and B's block 1 have each collected a token or left.
struct CoverRun {
  Rows rank0, rank1, b;
  std::shared_ptr<Kernel> a_kernel, b_kernel, peer_kernel;
};
CoverRun SecondKernelWhoseIdCoversTheOwners(Comm& c) {
  Latch a_claimed(2), a_published(2), b0_claimed, b1_through, collected(2);
  std::atomic<bool> b1_published{false}, b1_collected{false}, peer_collected{false};
  Call a;
  a.tokens = 2;
  a.id = 0x1000;
  a.hook = [&](Event e, int, int64_t) {
    if (e == Event::kClaimed) a_claimed.CountDown();
    if (e == Event::kAfterPublish) a_published.CountDown();
  };
  Call b = a;
  b.data = 100;
  b.id = 0x1001;
  b.hook = [&](Event e, int block, int64_t) {
    if (block == 0 && e == Event::kClaimed) {
      b0_claimed.CountDown();
      EXPECT_TRUE(collected.Wait());
    }
    if (block == 1 && e == Event::kStart) {
      EXPECT_TRUE(b0_claimed.Wait());
    }
    if (block == 1 && e == Event::kBeforePublish) {
      EXPECT_TRUE(a_published.Wait());
    }
    if (block == 1 && (e == Event::kAfterPublish || e == Event::kExit) &&
        !b1_published.exchange(true)) {
      b1_through.CountDown();
    }
    if (block == 1 && (e == Event::kAfterCollect || e == Event::kExit) &&
        !b1_collected.exchange(true)) {
      collected.CountDown();
    }
  };
  Call peer;
  peer.tokens = 2;
  peer.hook = [&](Event e, int block, int64_t) {
    if (block == 1 && (e == Event::kAfterCollect || e == Event::kExit) &&
        !peer_collected.exchange(true)) {
      collected.CountDown();
    }
  };
  CoverRun run;
  run.a_kernel = c.Launch(0, a);
  EXPECT_TRUE(a_claimed.Wait());
  run.b_kernel = c.Launch(0, b);
  EXPECT_TRUE(b1_through.Wait());
  run.peer_kernel = c.Launch(1, peer);
  run.rank0 = CheckAll(c, {run.a_kernel, run.b_kernel});
  run.rank1 = CheckAll(c, {run.peer_kernel});
  run.b = c.Check(*run.b_kernel);
  return run;
}

TEST(FailureModel, ASecondKernelWhoseLaunchIdCoversTheOwnersFailsLoudly) {
  // The same launch ids and schedule with the kernel's owner ids (constant weight): A | B is not
  // B, so B's block 1 leaves with code 2, marking rank 0's fault word (A stops on it) and,
  // through its record, rank 1's (which then gives up at entry). The rank is released and
  // counted right.
  const TimeBound bound(Ms(5000));
  Comm c(2);
  const CoverRun run = SecondKernelWhoseIdCoversTheOwners(c);
  EXPECT_EQ(run.rank0.wrong + run.rank1.wrong, 0) << run.rank0.first_wrong << run.rank1.first_wrong;
  EXPECT_EQ(run.b_kernel->not_owners.load(), 2);
  EXPECT_EQ(run.peer_kernel->dead.load(), 2);
  EXPECT_EQ(c.code(0), kConcurrentKernel);
  EXPECT_EQ(c.code(1), kPeerFailed);
  EXPECT_EQ(c.owner(0), 0u);
  EXPECT_EQ(c.blocks_done(0), 0u);
  EXPECT_EQ(c.call(0), 1u);
  for (const ResetOutcome& o : ResetAll(c)) EXPECT_TRUE(o.ok) << o.error;
  const Rows after = RunCalls(c, 100, 1000, 31);
  EXPECT_EQ(after.nan + after.wrong, 0) << after.first_wrong;
  ExpectIdleAndHealthy(c, 100);
}

// ---------------------------------------------------------------- negative controls

TEST(FailureModelNegative, WithoutTheOwnerClaimTwoKernelsMixPartials) {
  // Both kernels read call 0 and publish under its tag: B's partials overwrite A's in rank 1's
  // workspace and rank 1 sums them; B sums rank 1's partials of A's call. The call counter rises
  // by one for the two kernels.
  const TimeBound bound(Ms(3000));
  Rules rules;
  rules.claim = false;
  Comm c(2, rules);
  const Rows rows = TwoKernelsOnRank0(c, true);
  EXPECT_GE(rows.wrong, 2);
  EXPECT_EQ(c.code(0) + c.code(1), 0u);  // and nobody noticed
  EXPECT_EQ(c.call(0), 1u);
  std::cout << "[ detected ] " << rows.wrong << " wrong rows, " << rows.first_wrong << "\n";
}

TEST(FailureModelNegative, WithoutTheOwnerClaimBlocksDoneDrifts) {
  // Kernels A (two blocks) and B (three blocks) of rank 0 share blocks_done. Accounting in the
  // order A0, B0, B1, A1, B2: B1 brings it to B's count (3) and zeroes it, A1 and B2 leave 2
  // behind. Every later kernel of two blocks then counts past 1 without ever hitting it: rank
  // 0's call counter stops.
  const TimeBound bound(Ms(5000));
  Rules rules;
  rules.claim = false;
  Comm c(2, rules);
  Turns turns;
  auto in_turn = [&](int n) {
    return [&turns, n](Event e, int, int64_t) {
      if (e == Event::kBeforeAccount) {
        EXPECT_TRUE(turns.WaitFor(n));
      }
      if (e == Event::kAfterAccount) turns.Next();
    };
  };
  const int a_turn[2] = {0, 3}, b_turn[3] = {1, 2, 4};
  Call a;
  a.tokens = 2;
  a.hook = [&](Event e, int block, int64_t t) { in_turn(a_turn[block])(e, block, t); };
  Call b = a;
  b.blocks = 3;
  b.hook = [&](Event e, int block, int64_t t) { in_turn(b_turn[block])(e, block, t); };
  Call peer;
  peer.tokens = 2;
  CheckAll(c, {c.Launch(0, a), c.Launch(0, b), c.Launch(1, peer)});
  EXPECT_EQ(c.blocks_done(0), 2u);
  EXPECT_EQ(c.call(0), 1u);
  // The next call completes on both ranks, but rank 0's counter does not move.
  Call next = peer;
  next.data = 1;
  CheckAll(c, {c.Launch(0, next), c.Launch(1, next)});
  EXPECT_EQ(c.blocks_done(0), 4u);
  EXPECT_EQ(c.call(0), 1u);
  EXPECT_EQ(c.call(1), 2u);
}

TEST(FailureModelNegative, WithPlainIdsASecondKernelWhoseIdCoversTheOwnersTakesPart) {
  // With launch ids as they come, B's id 0x1001 covers A's 0x1000, so A | B is B: B's block 1
  // sees exactly its own id, takes part in A's call 0 with nothing marked yet (it read the fault
  // word at the top), and publishes B's partial of token 1 under call 0's tag over A's. Rank 1
  // sums it: a silent wrong row on the peer, whose block completes before any failure reaches
  // it; B's own row 1 is wrong too. Three blocks count for A's two. The failure is recorded
  // (code 2, by B's block 0) only after the wrong rows are out.
  const TimeBound bound(Ms(5000));
  Rules rules;
  rules.plain_ids = true;
  Comm c(2, rules);
  const CoverRun run = SecondKernelWhoseIdCoversTheOwners(c);
  EXPECT_EQ(run.rank1.wrong, 1) << run.rank1.first_wrong;
  EXPECT_EQ(run.b.wrong, 1) << run.b.first_wrong;
  EXPECT_EQ(run.a_kernel->owners.load() + run.b_kernel->owners.load(), 3);
  EXPECT_GE(run.peer_kernel->completed.load(), 1);
  EXPECT_EQ(c.code(0), kConcurrentKernel);
  EXPECT_EQ(c.fault(1), 1u);
  std::cout << "[ detected ] " << run.rank1.first_wrong << "; " << run.b.first_wrong << "\n";
}

}  // namespace
}  // namespace swiftqk
