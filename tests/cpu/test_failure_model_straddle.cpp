// Failure model scenarios (model/failure_model.hpp) of a second kernel whose blocks straddle
// the end of the kernel that owns the rank; with a negative control for the rejected claim that
// takes a free owner half as its own.
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

// A second kernel B of rank 0 whose blocks straddle the end of the owner A: B's block 0 claims
// while A owns the rank, B's block 1 starts only once A has finished (on the GPU: B's first block
// fits beside A's persistent grid, the next one gets an SM when A's blocks leave). A's blocks
// account only once B's block 0 has claimed, so A owns the rank then. A's release stores {call 1,
// owner 0}, which clears B's bits. B's block 1 then waits for an owner.
//  - late_note false: B's block 0 notes code 2 at once, marking rank 0's fault word; A stops on
//    it (rank 1 is absent) and releases. With `third`, a replay C claims rank 0 after A's end and
//    holds it until B's block 1 has left: B's block 1 sees C. Else it sees owner 0 until its
//    deadline.
//  - late_note true: B's block 0 stalls between its claim and its note until rank 1's call 1
//    has collected a token or left. A and rank 1's call 0 complete; B's block 1 finds W free at
//    call 1; rank 1's call 1 starts once B's block 1 has published (or left).
// B's deadline (its claim wait's and its slot waits') is `deadline`. Returns the rows of rank 0's
// kernels, of rank 1's and of B, and the kernels B and C.
struct StraddleRows {
  Rows rank0, rank1, b;
  std::shared_ptr<Kernel> b_kernel, c_kernel;
};
StraddleRows StraddlingSecondKernel(Comm& c, bool late_note, bool third, Ms deadline) {
  Latch a_claimed(2), a_exited(2), b0_claimed, c_claimed, b1_left, b1_through, peer_collected;
  std::atomic<bool> b1_published{false};
  Call a;  // A stops on rank 0's fault word, or completes with rank 1, never on its deadline
  a.tokens = 2;
  a.id = id_a(0);
  a.hook = [&](Event e, int, int64_t) {
    if (e == Event::kClaimed) a_claimed.CountDown();
    if (e == Event::kBeforeAccount) {  // A owns the rank until B's block 0 has claimed
      EXPECT_TRUE(b0_claimed.Wait());
    }
    if (e == Event::kExit) a_exited.CountDown();
  };
  Call b = a;
  b.data = 100;
  b.id = id_b(0);
  b.deadline = deadline;
  b.hook = [&](Event e, int block, int64_t) {
    if (block == 0 && e == Event::kClaimed) b0_claimed.CountDown();
    if (block == 0 && e == Event::kClaimed && late_note) {
      EXPECT_TRUE(peer_collected.Wait());
    }
    if (block == 1 && e == Event::kStart) {
      EXPECT_TRUE(a_exited.Wait());
      if (third) {
        EXPECT_TRUE(c_claimed.Wait());
      }
    }
    if (block == 1 && (e == Event::kAfterPublish || e == Event::kExit) &&
        !b1_published.exchange(true)) {
      b1_through.CountDown();
    }
    if (block == 1 && e == Event::kExit) b1_left.CountDown();
  };
  std::vector<std::shared_ptr<Kernel>> kernels;
  kernels.push_back(c.Launch(0, a));
  if (late_note) {
    Call peer;
    peer.tokens = 2;
    kernels.push_back(c.Launch(1, peer));
  }
  EXPECT_TRUE(a_claimed.Wait());
  StraddleRows out;
  out.b_kernel = c.Launch(0, b);
  kernels.push_back(out.b_kernel);
  if (third) {
    EXPECT_TRUE(a_exited.Wait());
    Call cc = ReplayOf(FailingCall(2));
    cc.tokens = 2;
    cc.id = id_c(0);
    cc.hook = [&](Event e, int block, int64_t) {
      if (e == Event::kClaimed && block == 0) c_claimed.CountDown();
      if (e == Event::kBeforeAccount) {
        EXPECT_TRUE(b1_left.Wait());
      }
    };
    out.c_kernel = c.Launch(0, cc);
    kernels.push_back(out.c_kernel);
  }
  if (late_note) {
    EXPECT_TRUE(b1_through.Wait());
    kernels[1]->Join();  // stream order: rank 1's call 1 follows its call 0
    Call peer;
    peer.tokens = 2;
    peer.data = 1;
    peer.hook = [&](Event e, int, int64_t) {
      if (e == Event::kAfterCollect || e == Event::kExit) peer_collected.CountDown();
    };
    kernels.push_back(c.Launch(1, peer));
  }
  for (const auto& kn : kernels) (kn->rank == 0 ? out.rank0 : out.rank1) += CheckAll(c, {kn});
  out.b = c.Check(*out.b_kernel);
  return out;
}

TEST(FailureModel, SecondKernelStraddlingTheOwnersEndFailsLoudly) {
  // B's block 1 never takes part: it waits for an owner, sees none until its deadline (a timeout
  // naming its own rank, token -1: block 0 "never came") or sees C, another kernel (code 2), and
  // leaves without publishing or counting. No wrong row; the rank is released and counted right,
  // so replays account normally (dead at entry) until reset.
  const TimeBound bound(Ms(5000));
  for (bool third : {false, true}) {
    Comm c(2);
    const StraddleRows s = StraddlingSecondKernel(c, false, third, kFailDeadline);
    EXPECT_EQ(s.rank0.wrong, 0) << s.rank0.first_wrong;
    EXPECT_EQ(s.b.nan, 2);
    EXPECT_EQ(c.code(0), kConcurrentKernel);  // B's block 0 recorded first
    EXPECT_EQ(s.b_kernel->not_owners.load(), 2);
    EXPECT_EQ(s.b_kernel->claim_timed_out.load(), third ? 0 : 1);
    EXPECT_EQ(s.b_kernel->noted(kConcurrentKernel), third ? 2 : 1);
    if (third) {
      EXPECT_EQ(s.c_kernel->dead.load(), 2);
    }
    EXPECT_EQ(c.owner(0), 0u);
    EXPECT_EQ(c.blocks_done(0), 0u);
    EXPECT_EQ(c.call(0), third ? 2u : 1u);
    auto replay = c.Launch(0, ReplayOf(FailingCall(3)));
    replay->Join();
    EXPECT_EQ(replay->dead.load(), 2);
    EXPECT_EQ(c.Check(*replay).nan, 4);
    EXPECT_EQ(c.blocks_done(0), 0u);
    EXPECT_EQ(c.call(0), third ? 3u : 2u);
    for (const ResetOutcome& o : ResetAll(c)) EXPECT_TRUE(o.ok) << o.error;
    ExpectIdleAndHealthy(c, 0);
  }
}

TEST(FailureModel, SecondKernelStraddlingTheOwnersEndWithALateNoteFailsLoudly) {
  // Nothing is marked while B's block 1 waits: A and rank 1's call 0 complete, correct, and A
  // releases W = {call 1, owner 0}. B's block 1 sees owner 0 until its deadline, notes a timeout
  // naming its own rank and leaves, publishing nothing; its record reaches rank 1, whose call 1
  // gives up at entry. B's block 0's code 2 comes later and loses to that record: rank 0's
  // diagnosis blames its own grid's residency rather than the second kernel.
  const TimeBound bound(Ms(5000));
  Comm c(2);
  const Ms deadline(200);  // B's block 1 must not time out on rank 1 under the rejected claim
  const StraddleRows s = StraddlingSecondKernel(c, true, false, deadline);
  EXPECT_EQ(s.rank0.wrong + s.rank1.wrong, 0) << s.rank0.first_wrong << s.rank1.first_wrong;
  EXPECT_EQ(s.rank0.correct, 2);  // A
  EXPECT_EQ(s.b.nan, 2);
  EXPECT_EQ(s.rank1.correct, 2);  // call 0
  EXPECT_EQ(s.rank1.nan, 2);      // call 1
  EXPECT_EQ(s.b_kernel->claim_timed_out.load(), 1);
  EXPECT_EQ(s.b_kernel->noted(kConcurrentKernel), 1);
  EXPECT_EQ(s.b_kernel->recorded.load(), 1);
  EXPECT_EQ(c.code(0), kTimeout) << c.Describe(0);
  EXPECT_EQ(c.peer(0), 0);
  EXPECT_EQ(c.token(0), -1);
  EXPECT_EQ(c.code(1), kPeerFailed);
  EXPECT_EQ(c.peer(1), 0);
  EXPECT_EQ(c.owner(0), 0u);
  EXPECT_EQ(c.blocks_done(0), 0u);
  EXPECT_EQ(c.call(0), 1u);  // A's call only
  std::cout << "[ model    ] " << c.Describe(0) << "\n";
  for (const ResetOutcome& o : ResetAll(c)) EXPECT_TRUE(o.ok) << o.error;
  const Rows after = RunCalls(c, 100, 1000, 19);
  EXPECT_EQ(after.nan + after.wrong, 0) << after.first_wrong;
  ExpectIdleAndHealthy(c, 100);
}

// ---------------------------------------------------------------- negative controls

TEST(FailureModelNegative, AcceptingAFreeOwnerLetsAStraddlingKernelRun) {
  // The straddle under the rejected claim, where a block other than block 0 takes owner 0 as
  // free. Late note: B's block 1 finds W = {call 1, owner 0}, runs call 1 and publishes B's
  // partial; rank 1's call 1 sums it (a silent wrong row, on the peer), and B's block 1 counts for
  // a kernel that never releases: blocks_done stays 1 with nobody owning the rank. Note at once:
  // B's block 1 is dead at entry but still counts, so blocks_done drifts the same way.
  const TimeBound bound(Ms(5000));
  Rules rules;
  rules.accept_free_owner = true;
  {
    Comm c(2, rules);
    const StraddleRows s = StraddlingSecondKernel(c, true, false, Ms(200));
    EXPECT_GE(s.rank1.wrong, 1);
    EXPECT_EQ(s.b_kernel->owners.load(), 1);
    EXPECT_EQ(c.owner(0), 0u);
    EXPECT_EQ(c.blocks_done(0), 1u);
    std::cout << "[ detected ] " << s.rank1.first_wrong << "; rank 0's blocks_done left at "
              << c.blocks_done(0) << "\n";
  }
  Comm c(2, rules);
  const StraddleRows s = StraddlingSecondKernel(c, false, false, kFailDeadline);
  EXPECT_EQ(s.rank0.wrong, 0) << s.rank0.first_wrong;
  EXPECT_EQ(s.b_kernel->dead.load(), 1);
  EXPECT_EQ(c.owner(0), 0u);
  EXPECT_EQ(c.blocks_done(0), 1u);
}

}  // namespace
}  // namespace swiftqk
