// Scenarios of the MiniMax-fused Lamport exchange model (model/lamport_model.hpp): the real
// protocol over worlds, capacities and token counts that swing, forced schedules, and negative
// controls that break one rule each and must be caught.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <iostream>

#include "model/lamport_model.hpp"
#include "protocol.hpp"

namespace swiftqk {
namespace {

using model::Clock;
using model::lamport::ClearRule;
using model::lamport::Knobs;
using model::lamport::Outcome;
using model::lamport::run_model;
using model::lamport::tokens_of_call;

// Expected number of successful exchanges: every rank sums every token of every call.
int64_t ExpectedExchanges(const Knobs& k) {
  return model::expected_exchanges(k.world, k.calls, k.seed, [&k](int i, uint64_t draw) {
    const int64_t t = tokens_of_call(k, i, draw);
    EXPECT_TRUE(t >= 0 && t <= k.capacity) << "call #" << i << " has " << t << " tokens";
    return t;
  });
}

void ExpectCorrect(const Knobs& k) {
  const Clock::time_point t0 = Clock::now();
  const Outcome o = run_model(k);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  model::expect_correct_run(o, ExpectedExchanges(k), k.random_delays);
  if (k.random_delays) {
    // Besides: ranks wrote into a lagging peer even while its clearing was still landing;
    // clearing landed after publishes; exact zeros of both signs were exchanged.
    if (k.late_clears) {
      EXPECT_GT(o.writes_during_peer_clear, 0);
      EXPECT_GT(o.late_clears, 0);
    }
    EXPECT_GT(o.negative_zeros, 0);
    EXPECT_GT(o.positive_zeros, 0);
  }
  std::cout << "[ model    ] world " << k.world << ", " << k.calls << " calls: " << o.exchanges
            << " exchanges, run-ahead " << o.run_ahead << ", writes into a lagging rank "
            << o.writes_into_lagging << " (" << o.writes_during_peer_clear
            << " while its clearing was landing), late clears " << o.late_clears << ", -0.0/+0.0 "
            << o.negative_zeros << "/" << o.positive_zeros << ", " << secs << " s\n";
}

// ---------------------------------------------------------------- the real protocol

TEST(LamportModel, World2) {
  Knobs k;
  k.world = 2;
  ExpectCorrect(k);
}

TEST(LamportModel, World4) {
  Knobs k;
  k.world = 4;
  k.seed = 2;
  ExpectCorrect(k);
}

TEST(LamportModel, World8) {
  Knobs k;
  k.world = 8;
  k.max_workers = 2;
  k.seed = 3;
  ExpectCorrect(k);
}

TEST(LamportModel, OneSlotCapacity) {
  // The tightest reuse: every call writes the single token slot of its buffer.
  Knobs k;
  k.world = 4;
  k.calls = 1000;
  k.capacity = 1;
  k.seed = 4;
  ExpectCorrect(k);
}

TEST(LamportModel, TokenCountsSwingBetweenOneAndCapacity) {
  // Large calls followed by one-token calls and back: most of a buffer is stale between uses.
  Knobs k;
  k.world = 4;
  k.calls = 600;
  k.capacity = 24;
  k.token_pattern = {24, 1, 0, 1, 24, 3, 1, 0, 0, 17, 24, 2, 1, 1, 24};
  k.seed = 5;
  ExpectCorrect(k);
}

TEST(LamportModel, ClearingInProgramOrder) {
  // No late landing: every worker's clearing precedes its first publish. (A peer then never
  // writes into a rank whose clearing is pending: it needs every worker's partials first.)
  Knobs k;
  k.world = 4;
  k.calls = 600;
  k.late_clears = false;
  k.seed = 6;
  ExpectCorrect(k);
}

// ---------------------------------------------------------------- forced schedules

Knobs ForcedSchedule() {
  Knobs k;
  k.world = 2;
  k.calls = 24;
  k.max_workers = 1;
  k.random_delays = false;
  k.zero_one_in = 0;
  k.token_pattern = {4, 1, 1, 4, 2, 0, 3};
  return k;
}

Knobs SlowPublisherSchedule() {
  // Rank 1 sleeps before each publish: rank 0 polls its slots for rank 1's partials before they
  // are written, so whatever a slot still holds from an earlier use is read as fresh.
  Knobs k = ForcedSchedule();
  k.slow_rank = 1;
  k.slow_us = 2000;
  return k;
}

Knobs LateClearSchedule() {
  // Rank 0's clearing lands 3 ms after its last publish: rank 1 finishes the call meanwhile and
  // starts the next one, writing into rank 0 before rank 0's kernel (with its clearing) is done.
  Knobs k = ForcedSchedule();
  k.token_pattern = {1};
  k.late_rank = 0;
  k.late_us = 3000;
  return k;
}

Knobs TornWriterSchedule() {
  // Rank 1 stores the q word of every slot 2 ms before the k word.
  Knobs k = ForcedSchedule();
  k.token_pattern = {2};
  k.calls = 8;
  k.torn_rank = 1;
  k.torn_us = 2000;
  return k;
}

TEST(LamportModel, ForcedSchedulesPassWithTheRealProtocol) {
  for (const Knobs& k : {SlowPublisherSchedule(), LateClearSchedule(), TornWriterSchedule()}) {
    model::expect_clean_run(run_model(k), ExpectedExchanges(k));
  }
  // Under the late-clear schedule rank 1 does write into rank 0 while rank 0 is still clearing.
  const Outcome o = run_model(LateClearSchedule());
  EXPECT_GT(o.writes_into_lagging, 0);
  EXPECT_GT(o.late_clears, 0);
}

// ---------------------------------------------------------------- negative controls

Outcome RunBroken(Knobs k) {
  k.deadline = std::chrono::milliseconds(300);
  return model::run_negative_control([&k] { return run_model(k); });
}

TEST(LamportModelNegative, NoClearingReadsStaleSlotsAsFresh) {
  // Three calls later a buffer still holds the old partials: rank 0 sums rank 1's partial of
  // call #0 for call #3 before rank 1 has written the new one.
  Knobs k = SlowPublisherSchedule();
  k.clear = ClearRule::kNone;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums, 0);
}

TEST(LamportModelNegative, ClearingTheCurrentBufferIsDetected) {
  // Clearing the buffer this call uses erases what a peer that is already in this call wrote
  // into it (a hang), and leaves the previous buffer dirty for its next use (a stale read).
  Knobs k = SlowPublisherSchedule();
  k.clear = ClearRule::kCurrent;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums + o.timeouts, 0);
}

TEST(LamportModelNegative, ClearingOnlyMinOfBothTokenCountsLeavesStaleSlots) {
  // 4 tokens, then 1: call #1 clears only token 0 of call #0's buffer, call #3 (4 tokens) reads
  // tokens 1..3 of it stale.
  Knobs k = SlowPublisherSchedule();
  k.clear = ClearRule::kMinTokens;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums, 0);
}

TEST(LamportModelNegative, ClearingThisCallsTokenCountLeavesStaleSlots) {
  // The host's T of the current call instead of the device's lamport_tokens: same stale slots
  // after a shrink (and why the count is kept on the device, for graph replays).
  Knobs k = SlowPublisherSchedule();
  k.clear = ClearRule::kThisCallTokens;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums, 0);
}

TEST(LamportModelNegative, TwoBuffersLetALateClearEraseAPeersNextCall) {
  // With two buffers the previous buffer is also the next one. A peer may be in the next call
  // as soon as it has all of this call's partials, while this rank's clearing (no fence before
  // its publishes) is still landing: the clearing erases the peer's next-call slot and this rank
  // waits for it forever. Three buffers keep the next call out of the buffer being cleared.
  // (Only a late-landing clear exposes this: in program order, with no block without tokens,
  // every worker has cleared before the peer can have all of this call's partials.)
  Knobs k = LateClearSchedule();
  k.buffers = 2;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.timeouts, 0);
  EXPECT_EQ(o.wrong_sums, 0);
}

TEST(LamportModelNegative, TwoBuffersFailUnderRandomSchedules) {
  // The same with the random late landing of the real-protocol runs.
  Knobs k;
  k.world = 4;
  k.calls = 2000;
  k.buffers = 2;
  k.seed = 9;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.timeouts + o.wrong_sums, 0);
}

TEST(LamportModelNegative, UnmappedNegativeZeroReadsAsEmpty) {
  // A partial of exactly -0.0 stored as is looks like an empty word: its readers time out.
  Knobs k;
  k.world = 2;
  k.calls = 200;
  k.zero_one_in = 4;
  k.map_negative_zero = false;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.timeouts, 0);
  EXPECT_EQ(o.wrong_sums, 0);
}

TEST(LamportModelNegative, CheckingOnlyTheQWordReadsATornSlot) {
  // The 16-byte store is not single-copy atomic: a reader that checks one word sees rank 1's q
  // before its k and sums the -0.0 still in the k word.
  Knobs k = TornWriterSchedule();
  k.check_all_words = false;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums, 0);
}

}  // namespace
}  // namespace swiftqk
