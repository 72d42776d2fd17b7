// A CPU model of the MiniMax-fused baseline's Lamport exchange (src/kernels/lamport_exchange.cuh
// and the kLamport parts of swiftqk_fused_kernel in src/kernels/swiftqk_fused.cuh), with one
// std::thread per rank and short-lived worker threads per call standing in for the rank's blocks.
// Its scenarios (test_lamport_model.cpp) show that three rotating buffers, each cleared by the
// call after the one that used it for the token count that call had, stay correct while ranks
// drift apart and token counts shrink and grow, and, with deliberately broken variants, that the
// model does detect a broken protocol.
//
// What is modelled, as in the kernel:
//  - Each rank owns kLamportBuffers x capacity x world slots laid out by lamport_slot_offset();
//    a slot is four 32-bit words, each its own relaxed atomic. The kernel's 16-byte accesses
//    (st/ld.relaxed.sys.v4.b32, and the uint4 store of the clearing) are not single-copy atomic
//    as a whole, so the model stores and loads the four words one at a time in a random order.
//    Every word starts as kLamportEmpty (-0.0), as mark_lamport_empty() leaves it.
//  - Each rank keeps its device state {lamport_call, lamport_tokens}, starting at {0, 0}. Calls
//    of 0 tokens are skipped on every rank without touching it (launch.cu returns before
//    launching); the token counts come from a seeded generator every rank replays identically.
//  - A call of T tokens runs W = min(drawn, T) workers ("blocks": plan_grid never launches more
//    blocks than tokens). At kernel start every worker refills with -0.0, grid-stride over
//    lamport_tokens x world slots (slot i = b, b + W, ...), this rank's slots of buffer
//    (lamport_call + 2) % 3; then worker b handles tokens b, b + W, ... in increasing order: it
//    computes the rank's (q, k) partials, maps a -0.0 bit pattern to +0.0 (lamport_word), stores
//    {q, k, 0, 0} into slot [lamport_call][t][rank] of EVERY rank (its own included), waits with a
//    deadline until none of the four words of any of the world slots [lamport_call][t][*] of its
//    own workspace is -0.0, and sums q and k in rank order in float. The sum is compared bitwise
//    with an independent evaluation of the same partials.
//  - There is no barrier between one worker's clearing and another worker's tokens (the kernel has
//    no grid barrier). Moreover the clearing stores are weak stores with no fence before the
//    worker's publishes, so nothing orders them before those publishes for observers on other
//    GPUs: the model lets some workers' clearing stores land late, in the middle of or after their
//    token loop, but always before the kernel ends (kernel completion orders them).
//  - When all workers of a rank have been joined (the kernel has finished), the rank sets
//    lamport_tokens = T and lamport_call = (lamport_call + 1) % 3, as the last block does.
//  - A kernel boundary orders everything a rank did in one call before what it does in the next,
//    for observers on other GPUs too: a kernel boundary at the start and at the end of every
//    worker. The slot accesses themselves stay relaxed.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "harness.hpp"
#include "protocol.hpp"

namespace swiftqk::model::lamport {

// Which buffer, and how many tokens of it, a call refills at kernel start.
enum class ClearRule {
  kPrevious,        // the kernel: buffer (call + B - 1) % B, lamport_tokens tokens
  kNone,            // broken: nothing is cleared
  kCurrent,         // broken: buffer call (the one this call uses), lamport_tokens tokens
  kMinTokens,       // broken: the previous buffer, min(T, lamport_tokens) tokens
  kThisCallTokens,  // broken: the previous buffer, T tokens (the host's count, not the device's)
};

struct Knobs {
  int world = 2;
  int calls = 2000;       // host-level calls, including the 0-token ones
  int64_t capacity = 16;  // tokens per call are drawn from [0, capacity]
  int max_workers = 3;    // "blocks" per rank and call, drawn from [1, max_workers], at most T
  uint64_t seed = 1;
  bool random_delays = true;
  int zero_one_in = 24;                // a partial is -0.0 (and +0.0) once in 2 * zero_one_in
  std::vector<int64_t> token_pattern;  // non-empty: call i has token_pattern[i % size] tokens
  // Per token wait; a hang fails instead.
  std::chrono::milliseconds deadline{10000 * kHangBoundScale};
  // Forced schedules (no effect at -1).
  int slow_rank = -1;  // sleeps slow_us before publishing each token
  int slow_us = 0;
  int late_rank = -1;  // its clearing lands after its last token, late_us after it
  int late_us = 0;
  int torn_rank = -1;  // stores the q word first, then sleeps torn_us, then the other words
  int torn_us = 0;
  // Broken variants (negative controls); the defaults are the real protocol.
  int buffers = kLamportBuffers;
  ClearRule clear = ClearRule::kPrevious;
  bool map_negative_zero = true;  // false: a -0.0 partial is stored as is (reads as empty)
  bool check_all_words = true;    // false: the reader checks the q word only
  // Model options.
  bool late_clears = true;  // false: clearing stores land in program order (before the tokens)
};

struct Outcome : Tally {
  int64_t writes_during_peer_clear = 0;  // writes into a lagging rank whose clearing had not all
                                         // landed yet
  int64_t late_clears = 0;               // slots cleared after their worker's first publish
  int64_t negative_zeros = 0;            // -0.0 partials published
  int64_t positive_zeros = 0;            // +0.0 partials published
};

/// Tokens of host-level call i; `draw` is the i-th output of the generator every rank replays.
int64_t tokens_of_call(const Knobs& k, int i, uint64_t draw);

/// Runs every rank's calls to the end (or to the first failure).
Outcome run_model(const Knobs& k);

}  // namespace swiftqk::model::lamport
