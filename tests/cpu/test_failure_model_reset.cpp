// Failure model scenarios (model/failure_model.hpp) of the collective reset: recovery after a
// late peer, the barriers that keep a late publish out of the cleared workspace, and resets
// with a peer missing or late for a barrier; with a negative control for the barriers.
#include <gmock/gmock.h>
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
using ::testing::HasSubstr;

// A late peer, then every rank resets at once (the late rank's kernel still running when the
// others enter reset). past_entry false: the others time out on call 0 before the late rank
// launches it; its blocks start kStall late and give up at entry. past_entry true: the late
// rank's blocks pass entry first, and its block 0 holds its first publish until another rank
// has given up on that token, then kStall more: the late publish comes while the others already
// wait in reset. The reset's barriers keep it before every other rank's clear.
void LatePeerThenReset(Comm& c, int late, bool past_entry) {
  std::vector<std::shared_ptr<Kernel>> kernels;
  Latch late_entered(2), others_gave_up;
  Clock::time_point late_publish{};
  Call late_call = FailingCall();
  late_call.deadline = kLongDeadline;  // the late rank gives up on the fault word, not a deadline
  late_call.hook = [&](Event e, int block, int64_t token) {
    if (e == Event::kStart && !past_entry) std::this_thread::sleep_for(kStall);
    if (e == Event::kClaimed) late_entered.CountDown();
    if (e == Event::kBeforePublish && past_entry && block == 0 && token == 0) {
      EXPECT_TRUE(others_gave_up.Wait());
      std::this_thread::sleep_for(kStall);
    }
    if (e == Event::kAfterPublish && block == 0 && token == 0) late_publish = Clock::now();
  };
  if (past_entry) {
    kernels.push_back(c.Launch(late, late_call));
    ASSERT_TRUE(late_entered.Wait());
  }
  Call on_time = FailingCall();
  on_time.hook = [&](Event e, int, int64_t) {
    if (e == Event::kGaveUp) others_gave_up.CountDown();
  };
  for (int r = 0; r < c.world(); ++r) {
    if (r != late) kernels.push_back(c.Launch(r, on_time));
  }
  for (std::size_t i = past_entry ? 1 : 0; i < kernels.size(); ++i) kernels[i]->Join();
  // Some rank timed out naming the late one. With more than two ranks the others may have given
  // up on its fault word first, recording nothing (LatePeerPastEntryBeforeTheFailure).
  int timed_out_on_late = 0;
  for (int r = 0; r < c.world(); ++r) {
    timed_out_on_late += c.code(r) == kTimeout && c.peer(r) == late;
  }
  EXPECT_GE(timed_out_on_late, 1);
  if (!past_entry) kernels.push_back(c.Launch(late, late_call));

  const std::vector<ResetOutcome> o = ResetAll(c);
  const Rows rows = CheckAll(c, kernels);
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_GT(rows.nan, 0);
  for (int r = 0; r < c.world(); ++r) {
    EXPECT_TRUE(o[r].ok) << o[r].error;
    if (past_entry && r != late) {
      EXPECT_LT(late_publish, o[r].cleared) << "rank " << r;
    }
  }
  ExpectIdleAndHealthy(c, 0);
}

TEST(FailureModel, ResetThenManyCorrectCalls) {
  const TimeBound bound(Ms(60000));  // about 5 s on two idle cores
  for (bool past_entry : {false, true}) {
    Comm c(2);
    LatePeerThenReset(c, 1, past_entry);
    const Clock::time_point t0 = Clock::now();
    const Rows rows = RunCalls(c, 1000, 1000, 11 + past_entry);
    EXPECT_EQ(rows.nan + rows.wrong, 0) << rows.first_wrong;
    EXPECT_GT(rows.correct, 1000);
    ExpectIdleAndHealthy(c, 1000);
    std::cout << "[ model    ] world 2, late peer " << (past_entry ? "past entry" : "at entry")
              << ", reset, 1000 calls: " << rows.correct << " rows correct, "
              << std::chrono::duration<double>(Clock::now() - t0).count() << " s\n";
  }
  // Four ranks, the last one late past entry; then they drift apart.
  Comm c(4);
  LatePeerThenReset(c, 3, true);
  const Rows rows = RunCalls(c, 1000, 1000, 13);
  EXPECT_EQ(rows.nan + rows.wrong, 0) << rows.first_wrong;
  EXPECT_GT(rows.correct, 2000);
  ExpectIdleAndHealthy(c, 1000);
}

// The schedule a reset's barriers are there for. Calls of one token, one block. Rank 1's kernel
// of call 0 passes entry, then holds its publish until rank 0 has given up on it, entered reset
// and cleared its workspace; when rank 0 cannot clear before rank 1's kernel ends, rank 1 gives
// up holding kStall after rank 0 entered reset. Rank 0 resets and makes call 1 (the first after
// the reset: device call 0 again, the same tag, bank and token count, hence the same k tag).
// Rank 1 resets and makes call 1 once rank 0 has collected it, or kStall after rank 0 published
// it.
struct LatePublishRows {
  Rows late;   // rank 1's call 0
  Rows after;  // rank 0's call 1
};
LatePublishRows LatePublishAcrossAReset(const Rules& rules) {
  Comm c(2, rules);
  Call one;
  one.tokens = 1;
  one.blocks = 1;
  Latch late_entered, rank0_gave_up, rank0_in_reset, rank0_cleared, rank0_published,
      rank0_collected;
  Call late = one;
  late.hook = [&](Event e, int, int64_t) {
    if (e == Event::kClaimed) late_entered.CountDown();
    if (e == Event::kBeforePublish) {
      EXPECT_TRUE(rank0_gave_up.Wait());
      EXPECT_TRUE(rank0_in_reset.Wait());
      rank0_cleared.Wait(kStall);
    }
  };
  auto k1 = c.Launch(1, late);
  EXPECT_TRUE(late_entered.Wait());
  Call early = one;
  early.deadline = kFailDeadline;
  early.hook = [&](Event e, int, int64_t) {
    if (e == Event::kGaveUp) rank0_gave_up.CountDown();
  };
  auto k0 = c.Launch(0, early);
  k0->Join();
  EXPECT_EQ(c.code(0), kTimeout);

  std::shared_ptr<Kernel> after1;
  ResetOutcome reset1;
  std::thread host1([&] {
    reset1 = c.Reset(1);
    EXPECT_TRUE(rank0_published.Wait());
    rank0_collected.Wait(kStall);
    Call call = one;
    call.data = 1;
    call.deadline = Ms(500);  // without barriers rank 1 may lose rank 0's publish to its clear
    after1 = c.Launch(1, call);
    after1->Join();
  });
  rank0_in_reset.CountDown();
  const ResetOutcome reset0 = c.Reset(0);
  rank0_cleared.CountDown();
  Call call = one;
  call.data = 1;
  call.hook = [&](Event e, int, int64_t) {
    if (e == Event::kAfterPublish) rank0_published.CountDown();
    if (e == Event::kAfterCollect) rank0_collected.CountDown();
  };
  auto after0 = c.Launch(0, call);
  after0->Join();
  host1.join();
  EXPECT_TRUE(reset0.ok && reset1.ok) << reset0.error << reset1.error;
  return {c.Check(*k1), c.Check(*after0)};
}

TEST(FailureModel, ResetBarriersKeepALatePublishOut) {
  // Rank 0 cannot clear before rank 1's kernel has finished, so rank 1's late publish lands
  // before the clear: rank 1 sums rank 0's partial of call 0 (published before rank 0 gave up),
  // and rank 0's call 1 waits for rank 1's real publish.
  const TimeBound bound(Ms(3000));
  const LatePublishRows rows = LatePublishAcrossAReset(Rules{});
  EXPECT_EQ(rows.late.correct, 1) << rows.late.first_wrong;
  EXPECT_EQ(rows.after.correct, 1) << rows.after.first_wrong;
}

TEST(FailureModel, ResetWithMissingPeer) {
  // Rank 0 times out on call 0; ranks 1 and 2 give up at entry; rank 3 never calls reset.
  const TimeBound bound(Ms(3000));
  Comm c(4);
  c.Launch(0, FailingCall())->Join();
  for (int r : {1, 2}) c.Launch(r, FailingCall())->Join();
  const Ms barrier(100);
  std::vector<ResetOutcome> o(3);
  on_every_rank(3, [&](int r) { o[r] = c.Reset(r, barrier); });  // ranks 0-2
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(o[r].ok);
    EXPECT_EQ(o[r].missing, 3);
    EXPECT_THAT(o[r].error, HasSubstr("rank 3"));
    EXPECT_GE(o[r].elapsed.count(), barrier.count());
    EXPECT_LT(o[r].elapsed.count(), barrier.count() + 500);
  }
  // The first barrier failed, so nothing was cleared: the communicator is still failed.
  EXPECT_EQ(c.code(0), kTimeout);
  for (int r : {1, 2}) EXPECT_EQ(c.code(r), kPeerFailed);
  expect_error([&] { c.Launch(0, FailingCall(1))->Join(); }, "rank 0: timed out waiting for rank");
  std::vector<std::shared_ptr<Kernel>> replays;
  for (int r = 0; r < 4; ++r) replays.push_back(c.Launch(r, ReplayOf(FailingCall(1))));
  const Rows rows = CheckAll(c, replays);
  EXPECT_EQ(rows.nan, 16) << rows.first_wrong;
  std::cout << "[ model    ] reset without rank 3 failed after " << o[0].elapsed.count()
            << " ms: " << o[0].error << "\n";
}

TEST(FailureModel, ResetWithAPeerLateForTheBarrier) {
  // Rank 0 gives up on the first barrier before rank 1 arrives there. Rank 1 then finds rank 0's
  // arrival, passes, clears, and fails at the second barrier, naming rank 0: one reset failed
  // with nothing cleared, the other failed after clearing. Rank 1's record is clean, so its host
  // launches again; the kernel times out on rank 0, which is still failed. Loud, never wrong, and
  // the next collective reset recovers both.
  const TimeBound bound(Ms(5000));
  Comm c(2);
  c.Launch(0, FailingCall())->Join();
  c.Launch(1, FailingCall())->Join();
  const Ms barrier(100);
  const ResetOutcome o0 = c.Reset(0, barrier);
  const ResetOutcome o1 = c.Reset(1, barrier);
  EXPECT_FALSE(o0.ok);
  EXPECT_EQ(o0.missing, 1);
  EXPECT_THAT(o0.error, HasSubstr("before clearing"));
  EXPECT_EQ(o0.cleared, Clock::time_point{});
  EXPECT_EQ(c.code(0), kTimeout);
  EXPECT_FALSE(o1.ok);
  EXPECT_EQ(o1.missing, 0);
  EXPECT_THAT(o1.error, HasSubstr("after clearing"));
  EXPECT_EQ(c.code(1), 0u);
  EXPECT_EQ(c.fault(1), 0u);

  auto again = c.Launch(1, FailingCall(1));  // the host's check passes
  auto replay = c.Launch(0, ReplayOf(FailingCall(1)));
  const Rows rows = CheckAll(c, {again, replay});
  EXPECT_EQ(rows.wrong, 0) << rows.first_wrong;
  EXPECT_EQ(rows.nan, 8);
  EXPECT_EQ(c.code(1), kTimeout);
  EXPECT_EQ(c.peer(1), 0);

  for (const ResetOutcome& o : ResetAll(c)) EXPECT_TRUE(o.ok) << o.error;
  const Rows after = RunCalls(c, 100, 1000, 23);
  EXPECT_EQ(after.nan + after.wrong, 0) << after.first_wrong;
  ExpectIdleAndHealthy(c, 100);
}

// ---------------------------------------------------------------- negative controls

TEST(FailureModelNegative, ResetWithoutBarriersAcceptsALatePublish) {
  // Rank 0 clears while rank 1's kernel of call 0 still runs; its publish lands in the cleared
  // workspace under the tag that the first call after the reset uses again, and rank 0 sums it.
  const TimeBound bound(Ms(3000));
  Rules rules;
  rules.reset_barriers = false;
  const Rows rows = LatePublishAcrossAReset(rules).after;
  EXPECT_EQ(rows.wrong, 1);
  std::cout << "[ detected ] " << rows.first_wrong << "\n";
}

}  // namespace
}  // namespace swiftqk
