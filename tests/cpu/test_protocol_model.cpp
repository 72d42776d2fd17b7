// Scenarios of the SwiftQK slot exchange model (model/protocol_model.hpp): the real protocol
// over worlds, deferral depths, packed rows, slot layouts and the counter's wrap, and negative
// controls that break one rule each and must be caught.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <utility>

#include "model/protocol_model.hpp"
#include "protocol.hpp"

namespace swiftqk {
namespace {

using model::Clock;
using model::protocol::expected_exchanges;
using model::protocol::Knobs;
using model::protocol::Outcome;
using model::protocol::run_model;

void ExpectCorrect(const Knobs& k) {
  const Clock::time_point t0 = Clock::now();
  const Outcome o = run_model(k);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  model::expect_correct_run(o, expected_exchanges(k), k.random_delays && k.world > 1);
  EXPECT_EQ(o.max_defer_seen, k.max_defer);  // the deepest depth asked for did run
  EXPECT_EQ(o.max_rows_seen, k.max_rows);    // and the most rows a warp, when packing
  std::cout << "[ model    ] world " << k.world << ", " << k.calls << " calls from 0x" << std::hex
            << k.first_call << std::dec << ": " << o.exchanges << " exchanges, run-ahead "
            << o.run_ahead << ", writes into a lagging rank " << o.writes_into_lagging << ", "
            << secs << " s\n";
}

// ---------------------------------------------------------------- the real protocol

TEST(ProtocolModel, World2) {
  Knobs k;
  k.world = 2;
  k.calls = 2000;
  ExpectCorrect(k);
}

TEST(ProtocolModel, World4) {
  Knobs k;
  k.world = 4;
  k.calls = 2000;
  k.seed = 2;
  ExpectCorrect(k);
}

TEST(ProtocolModel, World8) {
  Knobs k;
  k.world = 8;
  k.calls = 2000;
  k.max_workers = 2;
  k.seed = 3;
  ExpectCorrect(k);
}

// Worlds 2, 4 and 8 with up to max_defer deferred collects and up to max_rows rows a warp, drawn
// per rank and call; then the tightest reuse: one slot per bank, one worker per rank.
void ExpectCorrectWithMixedLayouts(int max_defer, int max_rows, uint64_t seed,
                                   SlotLayout layout = SlotLayout::kTokenMajor) {
  for (int world : {2, 4, 8}) {
    Knobs k;
    k.world = world;
    k.layout = layout;
    k.calls = world == 8 ? 600 : 1200;
    k.max_workers = world == 8 ? 2 : 3;
    k.max_defer = max_defer;
    k.max_rows = max_rows;
    k.seed = seed + world;
    ExpectCorrect(k);
  }
  Knobs k;
  k.world = 4;
  k.layout = layout;
  k.calls = 800;
  k.capacity = 1;
  k.max_workers = 1;
  k.max_defer = max_defer;
  k.max_rows = max_rows;
  k.seed = seed + 9;
  ExpectCorrect(k);
}

TEST(ProtocolModel, DeferredCollectsOfMixedDepths) {
  // The kernel with peers collects token i - D while publishing token i, D = log2(world) by
  // default and whatever SWIFTQK_DEFER says per process: every rank and call here draws its own
  // D in [0, 3], so workers hold up to 3 published, unread tokens while peers of other depths
  // run ahead into the next call. No deadlock, no wrong or stale sum.
  ExpectCorrectWithMixedLayouts(3, 1, 20);
}

TEST(ProtocolModel, PackedRowsOfMixedLayouts) {
  // With peers, short rows go 2 or 4 to a warp when the GPU is full (packed_kernel_shape); a
  // warp then waits for all its rows of D iterations back at once. Each rank and call here draws
  // its own rows per warp (1, 2 or 4) and depth (0-3), so peers run different layouts, as
  // processes on GPUs of different load may; with one slot per bank a packed warp often holds
  // one row and a group past the end. No deadlock, no wrong or stale sum.
  ExpectCorrectWithMixedLayouts(3, 4, 40);
}

TEST(ProtocolModel, PackedRowsWithSourceMajorSlots) {
  // Short rows (choose_slot_layout) order the slots by source: the same protocol on another
  // map of (bank, token, source) to words, so each bank still has its own region and a scrub
  // still reaches every slot of it.
  ExpectCorrectWithMixedLayouts(3, 4, 60, SlotLayout::kSourceMajor);
}

TEST(ProtocolModel, CounterWrapsAt2To30) {
  for (int world : {2, 4}) {
    Knobs k;
    k.world = world;
    k.calls = 400;
    k.first_call = 0x3ffffff0u;
    k.seed = 4 + world;
    ExpectCorrect(k);
  }
}

TEST(ProtocolModel, OneTokenCallsAndOneSlotCapacity) {
  // The tightest reuse: each call writes the same single slot of its bank.
  Knobs k;
  k.world = 4;
  k.calls = 1500;
  k.capacity = 1;
  k.seed = 7;
  ExpectCorrect(k);
}

TEST(ProtocolModel, ScrubCallsMakeReusedTagsSafe) {
  // Tags that repeat every 8 calls (as after the 2^30 wrap, only far sooner) with scrub calls
  // every 4, and tags that repeat every other call with a scrub in every call: a slot left from
  // an earlier use of the same tag is zeroed before that tag comes back, so only a fresh write
  // can match it. Token counts vary per call, so slots past a call's tokens stay stale for many
  // calls and only the scrub up to the capacity removes them.
  for (const auto& [tag_period, scrub_period] : {std::pair{8u, 4u}, std::pair{2u, 1u}}) {
    Knobs k;
    k.world = 4;
    k.calls = 800;
    k.tag_period = tag_period;
    k.scrub_period = scrub_period;
    k.seed = 8 + tag_period;
    ExpectCorrect(k);
  }
}

TEST(ProtocolModel, ScrubCallsCoverEveryReuseOfATag) {
  // The rule behind is_scrub_call, checked over whole call sequences: for every call c0 and the
  // next call c1 > c0 with the same tag (tag period P), some call in [c0, c1) of c0's bank is a
  // scrub call (scrub period S). It holds for every power of two S up to P (the GPU's S is a
  // quarter of P) and fails for S = 2P.
  auto covered = [](uint32_t P, uint32_t S) {
    for (uint32_t c0 = 0; c0 < 4 * P; ++c0) {
      bool ok = false;
      for (uint32_t c = c0; c < c0 + P; c += 2) ok = ok || is_scrub_call(c, S);
      if (!ok) return false;
    }
    return true;
  };
  for (uint32_t P : {2u, 4u, 8u, 64u, 1024u}) {
    for (uint32_t S = 1; S <= P; S *= 2) EXPECT_TRUE(covered(P, S)) << "P " << P << " S " << S;
    EXPECT_FALSE(covered(P, 2 * P)) << "P " << P;
  }
  EXPECT_TRUE(is_scrub_call(kScrubPeriod - 2) && is_scrub_call(kScrubPeriod - 1));
  EXPECT_FALSE(is_scrub_call(0) || is_scrub_call(1) || is_scrub_call(kScrubPeriod));
  EXPECT_TRUE(is_scrub_call(kCallPeriod - 1));  // the last call before the counter wraps
}

// ---------------------------------------------------------------- negative controls

// The schedules the negative controls force, shared with the positive runs below.
Knobs ReaderDawdlesSchedule() {
  // Rank 1 publishes, then sleeps before reading: rank 0 finishes the call and starts the next
  // one while rank 1 still has to read the slot rank 0 wrote.
  Knobs k;
  k.world = 2;
  k.calls = 20;
  k.fixed_tokens = 1;
  k.max_workers = 1;
  k.random_delays = false;
  k.slow_rank = 1;
  k.slow_us = 5000;
  return k;
}

Knobs WriterDawdlesSchedule() {
  // Rank 1 sleeps before each publish: rank 0 reaches a call's wait before rank 1 has written.
  Knobs k = ReaderDawdlesSchedule();
  k.fixed_tokens = 2;
  k.slow_before_publish = true;
  return k;
}

TEST(ProtocolModel, ForcedSchedulesPassWithTheRealProtocol) {
  for (const Knobs& k : {ReaderDawdlesSchedule(), WriterDawdlesSchedule()}) {
    Knobs slow = k;
    slow.max_workers = 2;
    for (const Knobs& x : {k, slow}) model::expect_clean_run(run_model(x), expected_exchanges(x));
  }
  // Under the reader-dawdles schedule rank 0 does write its next call into rank 1's workspace
  // while rank 1 is still reading the previous call.
  const Outcome o = run_model(ReaderDawdlesSchedule());
  EXPECT_GT(o.writes_into_lagging, 0);
}

Outcome RunBroken(Knobs k) {
  k.deadline = std::chrono::milliseconds(200);
  return model::run_negative_control([&k] { return run_model(k); });
}

TEST(ProtocolModelNegative, SingleBankLetsAFastRankOverwriteAnUnreadSlot) {
  // One bank: rank 0's next call overwrites, in rank 1's workspace, the slot rank 1 has not read.
  Knobs k = ReaderDawdlesSchedule();
  k.two_banks = false;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.timeouts, 0);
}

TEST(ProtocolModelNegative, SingleBankWithRepeatedTagsGivesAWrongSum) {
  // With one bank and one tag for every call, the overwritten slot even matches: rank 1 sums
  // rank 0's partial of the next call.
  Knobs k = ReaderDawdlesSchedule();
  k.two_banks = false;
  k.tag_period = 1;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums, 0);
}

TEST(ProtocolModelNegative, NoScrubWithRepeatedTagsReadsAStaleSlot) {
  // Tags repeat every other call and nothing is scrubbed: a reader two calls later finds the
  // slow rank's old partial under the matching tag and sums it.
  Knobs k = WriterDawdlesSchedule();
  k.scrub = false;
  k.tag_period = 2;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums, 0);
}

TEST(ProtocolModelNegative, ScrubsRarerThanTheTagPeriodReadAStaleSlot) {
  // Tags repeat every other call, scrubs come in two calls of every four: the calls after an
  // unscrubbed one read its partials as theirs.
  Knobs k = WriterDawdlesSchedule();
  k.tag_period = 2;
  k.scrub_period = 4;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums, 0);
  k.scrub_period = 2;  // the same schedule with scrubs as often as the tags repeat is correct
  model::expect_clean_run(run_model(k), expected_exchanges(k));
}

TEST(ProtocolModelNegative, ScrubOfOnlyTheCallsTokensLeavesStaleSlots) {
  // A scrub that zeroes only the slots of the call's own tokens leaves those of an earlier,
  // longer call: when a later call with the same tag reaches that token first, the slow writer's
  // stale partial is taken.
  Knobs k = WriterDawdlesSchedule();
  k.fixed_tokens = -1;  // token counts drawn per call from [0, capacity]
  k.capacity = 6;
  k.calls = 80;
  k.slow_us = 1000;
  k.tag_period = 8;
  k.scrub_period = 4;
  k.scrub_to_capacity = false;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.wrong_sums, 0);
  k.scrub_to_capacity = true;  // the same schedule with the whole bank scrubbed is correct
  model::expect_clean_run(run_model(k), expected_exchanges(k));
}

TEST(ProtocolModelNegative, PackedWarpCollectingBeforeAllItsRowsArePublishedHangs) {
  // The kernel publishes every group's row before the warp-wide collect. A warp that collected
  // after publishing only its first row would, without deferral, wait on its own second row:
  // the bounded wait catches it.
  Knobs k;
  k.world = 2;
  k.calls = 40;
  k.max_rows = 2;
  k.collect_before_all_published = true;
  k.seed = 13;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.timeouts, 0);
  EXPECT_EQ(o.wrong_sums, 0);
}

TEST(ProtocolModelNegative, RankThatSkipsACallIsDetected) {
  Knobs k;
  k.world = 4;
  k.calls = 200;
  k.skip_rank = 2;
  k.skip_at = 20;
  k.seed = 11;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.timeouts, 0);
  EXPECT_EQ(o.wrong_sums, 0);
}

TEST(ProtocolModelNegative, RankWithAnotherConfigIsDetected) {
  // Same call tags, different eps: the k-word tag differs, so nobody accepts the slot.
  Knobs k;
  k.world = 2;
  k.calls = 20;
  k.other_config_rank = 1;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.timeouts, 0);
  EXPECT_EQ(o.exchanges, 0);
}

TEST(ProtocolModelNegative, RankWithAnotherTokenCountIsDetected) {
  // The token count is part of the k-tag hash: no slot of a call with another token count is
  // ever accepted, so no rank sums partials of a different call's data.
  Knobs k;
  k.world = 2;
  k.calls = 20;
  k.fixed_tokens = 6;
  k.other_tokens_rank = 1;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.timeouts, 0);
  EXPECT_EQ(o.exchanges, 0);
}

TEST(ProtocolModelNegative, WithoutTheTokenCountInTheHashMismatchedCallsExchange) {
  // Control: leave the token count out of the hash and the rank with fewer tokens accepts the
  // other's first partials (on the GPU those belong to different data: a silent wrong answer).
  Knobs k;
  k.world = 2;
  k.calls = 20;
  k.fixed_tokens = 6;
  k.other_tokens_rank = 1;
  k.hash_tokens = false;
  const Outcome o = RunBroken(k);
  EXPECT_GT(o.exchanges, 0);
}

}  // namespace
}  // namespace swiftqk
