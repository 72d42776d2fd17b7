// One kernel at a time per communicator: the rank's claim at a kernel's entry, what each block
// with peers makes of it, and the release by the rank's last block (docs/design.md, "Failure
// semantics").
#pragma once

#include <cstdint>

#include "kernels/exchange.cuh"
#include "kernels/launch_args.hpp"
#include "protocol.hpp"

namespace swiftqk::detail {

/// The rank's claim word: CallState's {call, owner} pair as one 64-bit word.
__device__ __forceinline__ unsigned long long* claim_word(CallState* s) {
  return reinterpret_cast<unsigned long long*>(&s->call);
}
__device__ __forceinline__ unsigned long long claim_of(uint32_t call, uint32_t owner) {
  return static_cast<unsigned long long>(call) | (static_cast<unsigned long long>(owner) << 32);
}
/// This kernel's owner id, from the low 16 bits n of %gridid (which differs between launches,
/// graph replays included): {n, ~n}, 16 bits set in every id, so no id's bits contain another's
/// and the OR of two ids is never an id. A second kernel's claim therefore always leaves the
/// owner half unlike either kernel's id (a plain id such as 0x1001 would cover 0x1000).
__device__ __forceinline__ uint32_t grid_owner_id() {
  uint64_t id;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(id));
  const uint32_t n = static_cast<uint32_t>(id) & 0xffffu;
  return (n << 16) | (n ^ 0xffffu);
}

/// What a block with peers found at entry (BlockEntry in docs/design.md, "Failure semantics").
enum BlockEntry : int {
  kEntryRun = 0,       // this kernel owns the rank and the group is healthy
  kEntryDead = 1,      // owner, but the rank or a peer has failed: poison, account, exit
  kEntryNotOwner = 2,  // another kernel of this communicator is running: poison, exit
};

/// Thread 0 of each block with peers, after the block's first copies are issued: checks the
/// rank's claim (block 0 made it at entry: claim_seen is what its atomicOr returned; the other
/// blocks wait, bounded, to see it) and the fault word read at entry, and returns the block's
/// BlockEntry, with the call number of the claim in *call. A failure is noted in *note.
template <class Args>
__device__ __forceinline__ int claim_rank_at_entry(const Args& a, const RankArgs& ra, int lblock,
                                                   unsigned long long claim_seen,
                                                   bool failed_at_entry, FailNote* note,
                                                   uint32_t* call) {
  // One kernel at a time per communicator. Block 0 claimed the rank: it must have been free.
  // The other blocks take part only once they see the rank owned by this kernel exactly (they
  // wait, bounded, for block 0's claim to land); any other owner is a second kernel running at
  // once. So every block that exchanges does so while this kernel owns the rank, and the owner
  // releases it only after all its blocks have finished: two kernels' exchanges never overlap.
  // A second kernel's claim leaves its bits in the owner half, which the first one then never
  // matches: the rank stays claimed, and every later kernel fails, until reset(). (Every block
  // claiming for itself needs no wait, but a block of a second kernel that starts after the
  // owner's release would then find the rank free and take part although its block 0 failed:
  // the CPU model's AcceptingAFreeOwnerLetsAStraddlingKernelRun.)
  const uint32_t id = grid_owner_id();
  bool foreign = false;
  if (lblock == 0) {
    foreign = static_cast<uint32_t>(claim_seen >> 32) != 0u;
  } else {
    const uint64_t start = global_timer_ns();
    for (;;) {
      claim_seen = *reinterpret_cast<volatile unsigned long long*>(claim_word(ra.state));
      if ((claim_seen >> 32) != 0ull || global_timer_ns() - start > a.timeout_ns) break;
    }
    foreign = static_cast<uint32_t>(claim_seen >> 32) != id;
  }
  int entry = kEntryRun;
  if ((claim_seen >> 32) == 0ull && lblock != 0) {  // block 0 never came: not resident
    note_stop(note, ra, a.world, a.capacity, kFailTimeout, ra.rank, -1, 0u, 0u);
    entry = kEntryNotOwner;
  } else if (foreign) {
    note_stop(note, ra, a.world, a.capacity, kFailConcurrent, -1, -1,
              tag_for_call(static_cast<uint32_t>(claim_seen)), 0u);
    entry = kEntryNotOwner;
  } else if (failed_at_entry) {
    note_stop(note, ra, a.world, a.capacity, kFailPeer, -1, -1,
              tag_for_call(static_cast<uint32_t>(claim_seen)), 0u);
    entry = kEntryDead;
  }
  *call = static_cast<uint32_t>(claim_seen);
  return entry;
}

/// Thread 0, after every thread of the block is done: counts the block as finished and returns
/// true in the rank's last block to finish, which has reset the count and must then release the
/// rank (release_rank). A rank of one block is its own last block: it leaves the count at its
/// rest value 0 and skips the atomic, whose round trip would delay the release and the kernel's
/// end (launches of a few tokens run one block a rank).
template <class Args>
__device__ __forceinline__ bool last_block_of_rank(const Args& a, const RankArgs& ra) {
  if (a.blocks_per_rank == 1) return true;
  const uint32_t prev = atomicAdd(&ra.state->blocks_done, 1u);
  if (prev != static_cast<uint32_t>(a.blocks_per_rank) - 1u) return false;
  ra.state->blocks_done = 0u;
  return true;
}

/// Frees the rank for the next kernel and sets its call counter, in one 64-bit store.
__device__ __forceinline__ void release_rank(const RankArgs& ra, uint32_t call_after) {
  *reinterpret_cast<volatile unsigned long long*>(claim_word(ra.state)) = claim_of(call_after, 0u);
}

}  // namespace swiftqk::detail
