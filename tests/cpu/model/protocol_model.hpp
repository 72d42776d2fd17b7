// A CPU model of the kernel's partial-sum exchange (src/kernels/exchange_lanes.cuh's
// publish_partials and collect_partials, and rank_claim.cuh's call-counter advance), with one
// std::thread per rank and short-lived worker threads per call standing in for the rank's blocks.
// Its scenarios (test_protocol_model.cpp) show that reusing the two slot banks across
// consecutive calls is safe while ranks drift apart, including across the wrap of the 30-bit
// call counter and with tags that repeat far sooner than on the GPU (so that the scrub calls are
// what keeps a stale slot from matching), and, with deliberately broken variants, that the model
// does detect a broken protocol.
//
// What is modelled, as in the kernel:
//  - Each rank owns a workspace of kSlotBanks x capacity x world slots laid out by slot_offset();
//    a slot is two 64-bit words {value bits | tag << 32} accessed with relaxed atomics (the
//    kernel's st/ld.relaxed.sys of single-copy-atomic 64-bit words).
//  - Each rank keeps its own call counter from first_call; call c uses tag_for_call(c),
//    ktag = tag ^ config_hash(...) and bank_for_call(c). Calls of 0 tokens are skipped on every
//    rank without touching the counter (launch.cu returns before launching).
//  - A call's tokens are split over W workers ("blocks") as the kernel does: worker b handles
//    tokens b, b + W, ... in increasing order. Per token a worker publishes the rank's (q, k)
//    partials into slot [bank][t][rank] of EVERY rank (itself included); then, D tokens later
//    (the kernel's deferral depth, drawn per rank and call from [0, max_defer] so that ranks with
//    different depths meet too; the rest at the end), it waits with a deadline for all world
//    slots [bank][t][*] of its own workspace to carry (tag, ktag) and sums them in rank order
//    0..world-1 in float. Consumed slots keep their contents.
//  - In scrub calls (is_scrub_call) each worker, after its last collect, zeroes the slots of its
//    own token sequence up to the capacity in the call's bank (scrub_own_slots).
//  - When all workers of a rank have been joined (the kernel has finished), the counter advances
//    with next_call(). W is drawn per rank and call: ranks need not agree on it.
//  - A kernel launch boundary orders everything a rank did in call c before what it does in call
//    c + 1, for observers on other GPUs too. The model states this with a kernel boundary at the
//    start and at the end of every worker; the slot accesses themselves stay relaxed.
#pragma once

#include <chrono>
#include <cstdint>

#include "harness.hpp"
#include "protocol.hpp"

namespace swiftqk::model::protocol {

struct Knobs {
  int world = 2;
  int calls = 2000;       // host-level calls, including the 0-token ones
  int64_t capacity = 12;  // slots per bank; tokens per call are drawn from [0, capacity]
  int max_workers = 3;    // "blocks" per rank and call, drawn from [1, max_workers]
  int max_defer = 0;      // deferral depth per rank and call, drawn from [0, max_defer]
  SlotLayout layout = SlotLayout::kTokenMajor;  // the order of every workspace's slots
  int max_rows = 1;         // rows a worker handles per iteration (packed groups sharing a
                            // warp), drawn per rank and call from the powers of two <= max_rows
  uint32_t first_call = 0;  // initial value of every rank's device call counter
  uint64_t seed = 1;
  bool random_delays = true;
  // Per token wait; a hang fails instead.
  std::chrono::milliseconds deadline{10000 * kHangBoundScale};
  // Broken variants (negative controls); the defaults are the real protocol.
  int fixed_tokens = -1;                 // >= 0: every call has this many tokens
  bool two_banks = true;                 // false: every call uses bank 0
  bool scrub = true;                     // false: no scrub calls
  bool scrub_to_capacity = true;         // false: a scrub zeroes only the call's tokens' slots
  uint32_t scrub_period = kScrubPeriod;  // scrub calls are the last two of every period
  uint32_t tag_period = 0;     // > 0: tag = tag_for_call(call % tag_period), i.e. tags are reused
  int skip_rank = -1;          // this rank advances its counter an extra time ...
  int skip_at = -1;            // ... before its first call with tokens at or after skip_at
  int other_config_rank = -1;  // this rank hashes another eps into its k tags
  int other_tokens_rank = -1;  // this rank is called with one token fewer (or more) each time
  bool hash_tokens = true;     // false: the token count left out of the k-tag hash (a control)
  int slow_rank = -1;          // this rank sleeps slow_us ...
  int slow_us = 0;
  bool slow_before_publish = false;           // ... before publishing a token (else before reading)
  bool collect_before_all_published = false;  // a packed warp collects after its first row only
};

struct Outcome : Tally {
  int max_defer_seen = 0;  // the deepest deferral any rank used
  int max_rows_seen = 1;   // the most rows a worker handled at once
};

/// Runs every rank's calls to the end (or to the first failure).
Outcome run_model(const Knobs& k);

/// Exchanges the run makes when nothing fails: every rank sums every token of every call.
int64_t expected_exchanges(const Knobs& k);

}  // namespace swiftqk::model::protocol
