// Failure model scenarios (model/failure_model.hpp) of a wait that fails: a late peer, the
// timeout's record and how it stops the rank's other blocks and then its peers, and graph replays
// after the failure; with negative controls for the NaN fill, the fault word and the own mark.
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

TEST(FailureModel, LatePeer) {
  const TimeBound bound(Ms(3000));
  Comm c(2);
  // Rank 0 makes call 0 alone: each block publishes its first token and waits for rank 1's.
  auto early = c.Launch(0, FailingCall());
  early->Join();
  EXPECT_EQ(c.code(0), kTimeout);
  EXPECT_EQ(c.peer(0), 1);
  EXPECT_GE(c.token(0), 0);  // a block's first token: 0 or 1
  EXPECT_LT(c.token(0), 2);
  EXPECT_EQ(c.fault(0), 1u);  // rank 0 + 1, in every rank's fault word
  EXPECT_EQ(c.fault(1), 1u);
  // Whichever block times out first marks rank 0's fault word; the other one times out too or
  // stops on that mark. Only one record: the other block's timeout loses the CAS, and its stop on
  // its own rank's mark records nothing.
  EXPECT_GE(early->timed_out.load(), 1);
  EXPECT_EQ(early->gave_up.load(), 2);
  EXPECT_EQ(early->noted(kTimeout) + early->noted(kPeerFailed), 2);
  EXPECT_EQ(early->recorded.load(), 1);
  const Rows early_rows = c.Check(*early);
  EXPECT_EQ(early_rows.nan, 4) << early_rows.first_wrong;

  // Rank 1's record is clean, so its host launches the call: the kernel gives up at entry.
  auto late = c.Launch(1, FailingCall());
  late->Join();
  EXPECT_EQ(late->dead.load(), 2);
  EXPECT_EQ(late->noted(kPeerFailed), 2);
  EXPECT_EQ(late->recorded.load(), 1);
  EXPECT_EQ(c.code(1), kPeerFailed);
  EXPECT_EQ(c.peer(1), 0);
  const Rows late_rows = c.Check(*late);
  EXPECT_EQ(late_rows.nan, 4) << late_rows.first_wrong;

  // Graph replays, which skip the host's check: NaN, on both ranks, every time.
  Rows replays;
  for (int data = 1; data <= 5; ++data) {
    auto a = c.Launch(0, ReplayOf(FailingCall(data)));
    auto b = c.Launch(1, ReplayOf(FailingCall(data)));
    replays += CheckAll(c, {a, b});
    EXPECT_EQ(a->dead.load() + b->dead.load(), 4);
  }
  EXPECT_EQ(replays.nan, 40) << replays.first_wrong;
  EXPECT_EQ(replays.wrong, 0) << replays.first_wrong;

  // The hosts refuse eager launches, naming the rank, the peer and the token.
  expect_error([&] { c.Launch(0, FailingCall(6))->Join(); },
               {"rank 0: timed out waiting for rank 1", "token"});
  expect_error([&] { c.Launch(1, FailingCall(6))->Join(); }, "rank 1: rank 0 failed");

  // Every kernel released the rank and advanced its call, failed or not: no drift.
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(c.owner(r), 0u);
    EXPECT_EQ(c.blocks_done(r), 0u);
    EXPECT_EQ(c.call(r), 6u);
  }
  std::cout << "[ model    ] rank 0 timed out in " << early->elapsed().count()
            << " ms; rank 1's late kernel gave up at entry in " << late->elapsed().count()
            << " ms\n";
}

TEST(FailureModel, LatePeerPastEntryBeforeTheFailure) {
  // Rank 1's blocks pass entry before rank 0 fails; rank 1's block 0 then holds its first
  // publish until rank 0's block 0 has timed out on that token and given up, before publishing
  // token 2. Rank 1 gets token 0 (rank 0 published it before waiting) and gives up on token 2
  // when it finds rank 0's fault in its fault word, which rank 0's record marked.
  const TimeBound bound(Ms(3000));
  Comm c(2);
  Latch entered(2), early_gave_up;
  Call late_call = FailingCall();
  late_call.deadline = kLongDeadline;
  late_call.hook = [&](Event e, int block, int64_t token) {
    if (e == Event::kClaimed) entered.CountDown();
    if (e == Event::kBeforePublish && block == 0 && token == 0) {
      EXPECT_TRUE(early_gave_up.Wait());
    }
  };
  auto late = c.Launch(1, late_call);
  ASSERT_TRUE(entered.Wait());
  Call early_call = FailingCall();
  early_call.hook = [&](Event e, int block, int64_t) {
    if (e == Event::kGaveUp && block == 0) early_gave_up.CountDown();
  };
  auto early = c.Launch(0, early_call);
  early->Join();
  late->Join();
  EXPECT_EQ(c.code(0), kTimeout);
  EXPECT_EQ(c.peer(0), 1);
  EXPECT_EQ(c.token(0), 0);
  const Rows rows = CheckAll(c, {early, late});
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_TRUE(std::isnan(early->q[0]) && std::isnan(early->q[2]));
  EXPECT_FALSE(std::isnan(late->q[0]));  // correct (rows.wrong is 0)
  EXPECT_TRUE(std::isnan(late->q[2]));
  EXPECT_GE(late->gave_up.load(), 1);
  EXPECT_EQ(late->timed_out.load(), 0);
  // A wait that gives up on a fault word naming a peer records code 3 naming it, after the
  // block's loop: rank 1's host refuses its next launch, and a replay gives up at entry.
  EXPECT_EQ(c.code(1), kPeerFailed);
  EXPECT_EQ(c.peer(1), 0);
  EXPECT_EQ(late->recorded.load(), 1);
  expect_error([&] { c.Launch(1, FailingCall(1))->Join(); }, "rank 1: rank 0 failed");
  auto next = c.Launch(1, ReplayOf(FailingCall(1)));
  next->Join();
  EXPECT_EQ(next->dead.load(), 2);
  EXPECT_EQ(next->recorded.load(), 0);  // the record is rank 1's first failure
  EXPECT_EQ(c.Check(*next).nan, 4);
}

// Rank 0 times out on call 0 (ranks 1 and 2 late); then every rank replays graphs captured
// before the failure: ranks 1 and 2 their call 0 and calls 1..9, rank 0 calls 1..9, all ranks
// at once. Returns how long the replays took.
Ms ReplaysAfterATimeout(Comm& c, Ms deadline, Rows& rows, int& dead_blocks, int& blocks) {
  Call first = FailingCall();
  first.deadline = deadline;
  c.Launch(0, first)->Join();
  EXPECT_EQ(c.code(0), kTimeout);
  EXPECT_TRUE(c.peer(0) == 1 || c.peer(0) == 2) << c.Describe(0);  // a rank whose slot was missing
  std::vector<std::vector<std::shared_ptr<Kernel>>> kernels(c.world());
  const Clock::time_point t0 = Clock::now();
  on_every_rank(c.world(), [&](int r) {
    for (int data = r == 0 ? 1 : 0; data < 10; ++data) {
      Call call = ReplayOf(FailingCall(data));
      call.deadline = deadline;
      kernels[r].push_back(c.Launch(r, call));
      kernels[r].back()->Join();
    }
  });
  const Ms took = std::chrono::duration_cast<Ms>(Clock::now() - t0);
  rows = Rows{};
  dead_blocks = blocks = 0;
  for (const auto& ks : kernels) {
    rows += CheckAll(c, ks);
    for (const auto& kn : ks) {
      dead_blocks += kn->dead.load();
      blocks += kn->call.blocks;
    }
  }
  return took;
}

constexpr Ms kReplayDeadline{250};

TEST(FailureModel, ReplayAfterFailure) {
  // The fault word reaches every rank with the failure: each replay gives up at entry, without
  // waiting at all, so 29 replays over three ranks take less than one deadline.
  const TimeBound bound(Ms(3000));
  Comm c(3);
  Rows rows;
  int dead = 0, blocks = 0;
  const Ms took = ReplaysAfterATimeout(c, kReplayDeadline, rows, dead, blocks);
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_EQ(rows.nan, rows.total());
  EXPECT_EQ(dead, blocks);
  EXPECT_LT(took.count(), kReplayDeadline.count());
  for (int r : {1, 2}) {
    EXPECT_EQ(c.code(r), kPeerFailed) << c.Describe(r);
    EXPECT_EQ(c.peer(r), 0);
  }
  for (int r = 0; r < 3; ++r) EXPECT_EQ(c.blocks_done(r), 0u);
  std::cout << "[ model    ] 29 replays after the failure: " << took.count() << " ms, all NaN\n";
}

// ---------------------------------------------------------------- stops and records

// Rank 0 (two blocks, deadline kFailDeadline) waits for rank 1 (one block, a long deadline),
// which holds its first publish. Forced: rank 0's block 1 publishes and starts its wait only once
// block 0 has timed out on token 0, and block 0 records only once block 1 has stopped, so block 1
// can only have been stopped by what block 0's note marked at once (rank 0's own fault word).
// Rank 1 publishes only once rank 0's block 1 has stopped: it sums tokens 0 and 1 (published by
// rank 0 before it waited) and then waits on token 2, which rank 0 never publishes, until rank
// 0's record reaches its fault word.
struct TimeoutSchedule {
  std::shared_ptr<Kernel> early, late;
  Clock::time_point b0_gave_up, b1_gave_up, recorded, peer_gave_up;
};
TimeoutSchedule TimeoutOnOneBlock(Comm& c) {
  Latch b0_gave_up, b1_gave_up;
  Stamp t_b0, t_b1, t_recorded, t_peer;
  Call early = FailingCall();
  early.hook = [&](Event e, int block, int64_t token) {
    if (e == Event::kGaveUp) {
      (block == 0 ? t_b0 : t_b1).Set();
      (block == 0 ? b0_gave_up : b1_gave_up).CountDown();
    }
    if (e == Event::kBeforePublish && block == 1 && token == 1) {
      EXPECT_TRUE(b0_gave_up.Wait());
    }
    if (e == Event::kBeforeRecord && block == 0) {
      EXPECT_TRUE(b1_gave_up.Wait());
      t_recorded.Set();  // before the record marks rank 1's fault word
    }
  };
  Call late = FailingCall();
  late.blocks = 1;
  late.deadline = kLongDeadline;
  late.hook = [&](Event e, int, int64_t token) {
    if (e == Event::kBeforePublish && token == 0) {
      EXPECT_TRUE(b1_gave_up.Wait());
    }
    if (e == Event::kGaveUp) t_peer.Set();
  };
  TimeoutSchedule s;
  s.late = c.Launch(1, late);
  s.early = c.Launch(0, early);
  s.early->Join();
  s.late->Join();
  s.b0_gave_up = t_b0.Get();
  s.b1_gave_up = t_b1.Get();
  s.recorded = t_recorded.Get();
  s.peer_gave_up = t_peer.Get();
  return s;
}

TEST(FailureModel, TimeoutStopsTheRanksOtherBlocksAndThenItsPeers) {
  const TimeBound bound(Ms(3000));
  Comm c(2);
  const TimeoutSchedule s = TimeoutOnOneBlock(c);
  const Rows rows = CheckAll(c, {s.early, s.late});
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_EQ(c.Check(*s.early).nan, 4);
  EXPECT_EQ(c.Check(*s.late).correct, 2);  // tokens 0 and 1
  // Rank 0's block 1 stopped at its wait's first check, on its own rank's fault word: it noted
  // code 3, not a timeout of its own, and recorded nothing (the word names rank 0 itself).
  EXPECT_EQ(s.early->timed_out.load(), 1);
  EXPECT_EQ(s.early->noted(kTimeout), 1);
  EXPECT_EQ(s.early->noted(kPeerFailed), 1);
  EXPECT_EQ(s.early->recorded.load(), 1);
  // The diagnosis: rank 0 names the late peer and the token; rank 1 names rank 0.
  EXPECT_EQ(c.code(0), kTimeout);
  EXPECT_EQ(c.peer(0), 1);
  EXPECT_EQ(c.token(0), 0);
  EXPECT_EQ(c.code(1), kPeerFailed) << c.Describe(1);
  EXPECT_EQ(c.peer(1), 0);
  EXPECT_EQ(s.late->timed_out.load(), 0);
  EXPECT_EQ(s.late->noted(kPeerFailed), 1);
  EXPECT_EQ(s.late->recorded.load(), 1);
  EXPECT_EQ(c.fault(0), 1u);
  EXPECT_EQ(c.fault(1), 1u);
  // Rank 1 stopped on rank 0's record (its fault word is marked by nothing else), well within its
  // own deadline.
  EXPECT_GE(s.peer_gave_up, s.recorded);
  EXPECT_LT(between(s.recorded, s.peer_gave_up).count(), kLongDeadline.count() / 3);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(c.owner(r), 0u);
    EXPECT_EQ(c.blocks_done(r), 0u);
    EXPECT_EQ(c.call(r), 1u);
  }
  std::cout << "[ model    ] rank 0's block 1 stopped "
            << between(s.b0_gave_up, s.b1_gave_up).count() << " ms after block 0's timeout; rank 1 "
            << between(s.recorded, s.peer_gave_up).count() << " ms after rank 0's record\n";
}

// ---------------------------------------------------------------- negative controls

TEST(FailureModelNegative, WithoutNaNFillAFailedWaitLeavesThePlausibleInput) {
  // The late-peer schedule: rank 0's rows keep the in-place input, finite and wrong.
  const TimeBound bound(Ms(3000));
  Rules rules;
  rules.nan_fill = false;
  Comm c(2, rules);
  auto early = c.Launch(0, FailingCall());
  early->Join();
  EXPECT_EQ(c.code(0), kTimeout);
  const Rows rows = c.Check(*early);
  EXPECT_EQ(rows.wrong, 4);
  for (int64_t t = 0; t < 4; ++t) EXPECT_TRUE(std::isfinite(early->q[t]));
  std::cout << "[ detected ] " << rows.first_wrong << "\n";
}

TEST(FailureModelNegative, WithoutTheFaultWordLatePeersWaitOutTheirDeadline) {
  // No wrong row without the fault word, but no quick failure either: ranks 1 and 2 run their
  // late call 0 as if nothing had happened, take rank 0's first tokens (published before it
  // gave up), and wait a full deadline for the rest. They then blame rank 0 with a timeout of
  // their own rather than reporting its failure. A wait reads no record, only the fault word, so
  // nothing stops the later replays either: out of step with rank 0, they wait out deadlines too.
  const TimeBound bound(Ms(5000));
  const Ms deadline(100);
  Rules rules;
  rules.fault_word = false;
  Comm c(3, rules);
  Rows rows;
  int dead = 0, blocks = 0;
  const Ms took = ReplaysAfterATimeout(c, deadline, rows, dead, blocks);
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_GE(took.count(), deadline.count());
  EXPECT_LT(dead, blocks);
  for (int r : {1, 2}) {
    EXPECT_EQ(c.code(r), kTimeout) << c.Describe(r);
    EXPECT_EQ(c.peer(r), 0);
  }
  std::cout << "[ detected ] replays took " << took.count() << " ms (deadline " << deadline.count()
            << " ms); " << c.Describe(1) << "\n";
}

TEST(FailureModelNegative, WithoutTheOwnMarkTheRanksOtherBlocksWaitOutTheirDeadline) {
  // The timeout schedule with a note that marks nothing: rank 0's block 1 has no fault word to
  // see until block 0 records (held until block 1 has stopped), so it waits its whole deadline and
  // times out on its own. On the GPU the hold is the block-wide barrier before the record: a
  // group that timed out waits there for its block's other groups.
  const TimeBound bound(Ms(3000));
  Rules rules;
  rules.own_mark = false;
  Comm c(2, rules);
  const TimeoutSchedule s = TimeoutOnOneBlock(c);
  const Rows rows = CheckAll(c, {s.early, s.late});
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_EQ(s.early->timed_out.load(), 2);
  EXPECT_EQ(s.early->noted(kPeerFailed), 0);
  EXPECT_GE(between(s.b0_gave_up, s.b1_gave_up).count(), kFailDeadline.count());
  std::cout << "[ detected ] rank 0's block 1 stopped "
            << between(s.b0_gave_up, s.b1_gave_up).count() << " ms after block 0's timeout\n";
}

}  // namespace
}  // namespace swiftqk
