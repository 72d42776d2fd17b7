// Device side of the partial-sum exchange: system-scope slot accesses, the bounded wait's clock,
// and failure recording. Slot layout and the reuse proof are in docs/design.md.
#pragma once

#include <cstdint>

#include "kernels/launch_args.hpp"
#include "protocol.hpp"

namespace swiftqk::detail {

/// L2 policy of every slot access: evict last. Each call streams all its rows through L2, so
/// without the hint a slot line is likely gone by the time it is written or polled again: a
/// build that only publishes (no collect) writes 22 MB more to DRAM than one without any
/// exchange, for 4 MB of 16-byte partials (virtual TP 8, OLMoE, 4096 tokens, one H200), which
/// fits partial-sector writes of evicted lines. With the hint virtual TP 2-8 at 4096 tokens are
/// faster, and so is TP 2 across two H200s at 16384 tokens (CHANGELOG.md, 622ecfe). The hint
/// changes no value and no ordering; a narrower scope (.gpu instead of .sys) makes no difference.
__device__ __forceinline__ uint64_t slot_cache_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// A slot is two 64-bit words {value bits | tag << 32}. Each word is single-copy atomic, so a
// reader that sees the expected tag in a word also sees that word's value; both words are
// checked because the 16-byte vector access as a whole is not atomic.
__device__ __forceinline__ void store_slot_sys(uint64_t* p, uint64_t w0, uint64_t w1) {
  asm volatile("st.relaxed.sys.global.L2::cache_hint.v2.b64 [%0], {%1, %2}, %3;" ::"l"(p), "l"(w0),
               "l"(w1), "l"(slot_cache_policy())
               : "memory");
}

__device__ __forceinline__ void load_slot_sys(const uint64_t* p, uint64_t& w0, uint64_t& w1) {
  asm volatile("ld.relaxed.sys.global.L2::cache_hint.v2.b64 {%0, %1}, [%2], %3;"
               : "=l"(w0), "=l"(w1)
               : "l"(p), "l"(slot_cache_policy())
               : "memory");
}

__device__ __forceinline__ uint64_t pack_word(float value, uint32_t tag) {
  return static_cast<uint64_t>(__float_as_uint(value)) | (static_cast<uint64_t>(tag) << 32);
}
__device__ __forceinline__ uint32_t word_tag(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
__device__ __forceinline__ float word_value(uint64_t w) {
  return __uint_as_float(static_cast<uint32_t>(w));
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t load_volatile(const uint32_t* p) {
  return *reinterpret_cast<const volatile uint32_t*>(p);
}

__device__ __forceinline__ uint64_t load_volatile64(const uint64_t* p) {
  return *reinterpret_cast<const volatile uint64_t*>(p);
}

/// This rank's fault word (protocol.hpp's fault_offset): nonzero once any rank of the group failed.
__device__ __forceinline__ uint64_t* fault_word(uint8_t* ws, int world, int64_t capacity) {
  return reinterpret_cast<uint64_t*>(ws + fault_offset(world, capacity));
}

/// Whether this rank must stop: some rank of the group (this one included) recorded a failure.
/// One load on the slow path of every wait: a block that gives up marks its own rank's fault word
/// at once (mark_fault), and its record then marks every peer's (record_failure).
__device__ __forceinline__ bool group_failed(const RankArgs& ra, int world, int64_t capacity) {
  return load_volatile64(fault_word(ra.local_ws, world, capacity)) != 0ull;
}

/// Marks this rank's own fault word with 1 + `rank` unless a failure is marked there already, so
/// the word names the first failure this rank saw.
__device__ __forceinline__ void mark_fault(uint8_t* ws, int world, int64_t capacity, int rank) {
  atomicCAS_system(reinterpret_cast<unsigned long long*>(fault_word(ws, world, capacity)), 0ull,
                   static_cast<unsigned long long>(rank) + 1ull);
}

/// What a block noted when it stopped, kept in shared memory (first note wins) and recorded once
/// after the block's loop (record_note): the failure path adds almost no code to the loop.
struct FailNote {
  uint32_t code;  // FailureCode; 0 none
  int32_t peer;
  int64_t token;
  uint32_t expected_tag, seen_tag;
};

/// Notes why this group stops; a timeout also marks this rank's fault word at once, so the rank's
/// other groups and blocks stop at their next wait check instead of waiting out their own timeout.
__device__ inline void note_stop(FailNote* note, const RankArgs& ra, int world, int64_t capacity,
                                 uint32_t code, int peer, int64_t token, uint32_t expected,
                                 uint32_t seen) {
  if (atomicCAS(&note->code, 0u, code) != 0u) return;
  note->peer = peer;
  note->token = token;
  note->expected_tag = expected;
  note->seen_tag = seen;
  if (code != kFailPeer) mark_fault(ra.local_ws, world, capacity, ra.rank);
}

/// Records a failure that every rank finds for itself (first failure of the rank wins) in device
/// memory and in the host-mapped mirror: bad data a token carried (the epilogue), or the NCCL
/// fallback's configuration check. Unlike a failed wait it marks no fault word: every rank,
/// holding the same positions, slots or check floats, finds and records the same.
__device__ inline void record_local_failure(const RankArgs& ra, uint32_t code, int64_t token,
                                            int64_t value, int64_t limit) {
  if (atomicCAS(&ra.failure->code, 0u, code) != 0u) return;
  ra.failure->rank = ra.rank;
  ra.failure->peer = -1;
  ra.failure->token = token;
  ra.failure->value = value;
  ra.failure->limit = limit;
  volatile FailureRecord* h = ra.host_failure;
  h->rank = ra.rank;
  h->peer = -1;
  h->token = token;
  h->expected_tag = 0u;
  h->seen_tag = 0u;
  h->value = value;
  h->limit = limit;
  __threadfence_system();  // details before the code the host polls
  h->code = code;
  __threadfence_system();
}

/// Records the first failure of this rank in device memory and in the host-mapped mirror. A
/// failure of this rank's own (a timeout, two kernels at once) is also marked in every rank's
/// fault word, so that the peers stop at their next wait check or kernel entry, and report it.
__device__ inline void record_failure(const RankArgs& ra, int world, int64_t capacity,
                                      uint32_t code, int peer, int64_t token, uint32_t expected,
                                      uint32_t seen) {
  if (atomicCAS(&ra.failure->code, 0u, code) != 0u) return;
  ra.failure->rank = ra.rank;
  ra.failure->peer = peer;
  ra.failure->token = token;
  ra.failure->expected_tag = expected;
  ra.failure->seen_tag = seen;
  volatile FailureRecord* h = ra.host_failure;
  h->rank = ra.rank;
  h->peer = peer;
  h->token = token;
  h->expected_tag = expected;
  h->seen_tag = seen;
  __threadfence_system();  // details before the code the host polls
  h->code = code;
  __threadfence_system();
  if (code != kFailPeer) {
    // A peer's word takes a plain system-scope store: atomics on a peer's memory need native P2P
    // atomics, which a PCIe link may lack. A peer's word then names the last rank that failed
    // rather than the first; any nonzero value stops it.
    const uint64_t mark = static_cast<uint64_t>(ra.rank) + 1u;
#pragma unroll 1
    for (int j = 0; j < world; ++j) {
      if (j == ra.rank) {
        mark_fault(ra.local_ws, world, capacity, ra.rank);
      } else {
        uint64_t* w = fault_word(ra.peers[j], world, capacity);
        asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(w), "l"(mark) : "memory");
      }
    }
  }
}

/// Records what a block noted (thread 0, after the block's last wait). A stop because of a peer
/// names the rank in the fault word; a stop because this rank's own fault word is marked is left
/// to the block that marked it, which records the cause.
__device__ inline void record_note(const FailNote& note, const RankArgs& ra, int world,
                                   int64_t capacity) {
  const uint32_t code = note.code;
  if (code == 0u) return;
  int peer = note.peer;
  uint32_t seen = note.seen_tag;
  if (code == kFailPeer) {
    if (load_volatile(&ra.failure->code) != 0u) return;
    peer = static_cast<int>(load_volatile64(fault_word(ra.local_ws, world, capacity))) - 1;
    if (peer < 0 || peer == ra.rank) return;
    seen = 0u;
  }
  record_failure(ra, world, capacity, code, peer, note.token, note.expected_tag, seen);
}

}  // namespace swiftqk::detail
