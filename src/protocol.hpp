// What the host and the kernels, and every rank of a group, must agree on: the layout of a
// rank's exchange workspace (slots, probe words, fault word, Lamport buffers), the slot order, call
// tags and banks, scrub calls, the configuration hash, which rank a block serves, and the depth of
// the stage ring. Pure arithmetic, no CUDA calls: the kernels use it as is and CI tests it on the
// CPU (tests/cpu/test_protocol.cpp; the CPU models of the exchange build on it).
#pragma once

#include <cstddef>
#include <cstdint>

#include "swiftqk/launch_tuning.hpp"  // kMinStages, kMaxStages: the ring's depth

namespace swiftqk {

/// @brief How a launch that serves several (virtual) ranks assigns its blocks to them. Blocks
/// start in index order, so with the ranks' blocks contiguous (kRankMajor) the last rank's start
/// last, and every group of the first ranks waits for its late peers at every collect; with the
/// ranks interleaved (kInterleaved: block b serves rank b mod ranks) the peer blocks of the same
/// tokens start together, as they would on separate GPUs. One rank per launch (one process per
/// GPU): both orders are the same. A template parameter of the kernel (choose_block_order in
/// launch_plan.hpp picks it).
enum class BlockOrder : int { kRankMajor = 0, kInterleaved = 1 };

/// @brief Which rank, and which of that rank's blocks, block b of a launch serves (one division:
/// the kernel calls it too).
struct BlockRole {
  int rank;
  int block;  ///< 0 .. blocks_per_rank - 1
};
constexpr BlockRole block_role(int b, int ranks, int blocks_per_rank, BlockOrder order) {
  const int div = order == BlockOrder::kRankMajor ? blocks_per_rank : ranks;
  const int q = b / div;
  const int r = b - q * div;
  return order == BlockOrder::kRankMajor ? BlockRole{q, r} : BlockRole{r, q};
}

/// @brief One exchange slot: a rank's (q, k) partial sums of squares for one token, each in a
/// 64-bit word whose high half is a tag, so a reader never needs a separate flag.
constexpr std::size_t kSlotBytes = 16;
/// Calls alternate between two slot banks; a bank is rewritten two calls later (docs/design.md
/// proves this cannot overtake a slow reader).
constexpr int kSlotBanks = 2;

/// @brief The order of a bank's slots in every workspace of a group.
/// - kTokenMajor, [bank][token][src_rank]: a token's N slots are contiguous, so a reader's poll
///   of one token is one line (up to TP 8).
/// - kSourceMajor, [bank][src_rank][token]: a source's consecutive tokens are adjacent, so a warp
///   that holds several short rows (the packed layout) publishes whole sectors to each peer, and
///   a block's consecutive tokens fill lines; a reader then polls N lines per token.
/// Both fill the same region of a bank (capacity x world slots), so a scrub call clears what a
/// call of either layout left there.
enum class SlotLayout : int { kTokenMajor = 0, kSourceMajor = 1 };

/// Source-major slots are chosen for rows of at most kSourceMajorMaxRowElements elements a rank
/// (1 KB in 2-byte types: the packed rows, launch_plan.hpp), at TP 8 to 16, from
/// kSourceMajorMinTokens tokens a launch. With virtual ranks on one H200 it is faster for OLMoE
/// at TP 8 and, by far, for the four short-row models at TP 16, where a token's 16 token-major
/// slots span two lines; below 256 tokens it is slightly slower, at TP 2 and 4 short rows gain
/// nothing, and rows of a warp or more lose: hence the three bounds (CHANGELOG.md, 26ff664).
constexpr int64_t kSourceMajorMaxRowElements = 512;
constexpr int kSourceMajorMinWorld = 8;
constexpr int kSourceMajorMaxWorld = 16;
constexpr int64_t kSourceMajorMinTokens = 256;

/// @brief The slot order of one launch: a function of values every rank hashes into its tags
/// (config_hash: the full widths, the world and the launch's token count), so ranks that agree
/// on their tags agree on the layout. It counts elements, not 16-byte vectors, because ranks
/// need not share a dtype.
constexpr SlotLayout choose_slot_layout(int world, int64_t q_full_width, int64_t k_full_width,
                                        int64_t tokens) {
  return world >= kSourceMajorMinWorld && world <= kSourceMajorMaxWorld &&
                 (q_full_width + k_full_width) / world <= kSourceMajorMaxRowElements &&
                 tokens >= kSourceMajorMinTokens
             ? SlotLayout::kSourceMajor
             : SlotLayout::kTokenMajor;
}

/// @brief Bytes of one bank: capacity x world slots, in either layout.
constexpr std::size_t slot_bank_bytes(int world, int64_t capacity) {
  return static_cast<std::size_t>(capacity) * world * kSlotBytes;
}
/// @brief Bytes from a slot to the same source's slot of the next token.
constexpr std::size_t slot_token_stride(int world, SlotLayout layout) {
  return (layout == SlotLayout::kTokenMajor ? static_cast<std::size_t>(world) : 1u) * kSlotBytes;
}
/// @brief Byte offset of the slot written by src_rank for token in bank, inside the reader's
/// workspace; the kernel calls it too, with the layout a template parameter (one instantiation per
/// order), so each order compiles to its own closed form and the token-major kernel is the same
/// code as one that knows no other order (with the order a run-time value, the token-major path
/// is 0.02-0.08 us slower at one token: docs/design.md, "Slot order").
constexpr std::size_t slot_offset(int world, int64_t capacity, int bank, int64_t token,
                                  int src_rank, SlotLayout layout) {
  return layout == SlotLayout::kTokenMajor
             ? ((static_cast<std::size_t>(bank) * capacity + token) * world + src_rank) * kSlotBytes
             : ((static_cast<std::size_t>(bank) * world + src_rank) * capacity + token) *
                   kSlotBytes;
}
/// @brief Byte offset of the P2P probe words ([world] x 8 bytes) after the slots.
constexpr std::size_t probe_offset(int world, int64_t capacity) {
  return slot_offset(world, capacity, kSlotBanks, 0, 0, SlotLayout::kTokenMajor);
}
/// @brief Byte offset of the fault word (8 bytes, after the probe words): 0 while the group is
/// healthy, else 1 + the rank that recorded a failure. Any rank that fails writes it into every
/// rank's workspace, so every peer's next wait check, and its next kernel at entry, sees it.
constexpr std::size_t fault_offset(int world, int64_t capacity) {
  return probe_offset(world, capacity) + 8 * static_cast<std::size_t>(world);
}
/// The MiniMax-fused baseline's Lamport buffers: 3 x [capacity][world] slots of 16 bytes after
/// the fault word; every 32-bit word holds -0.0 (0x80000000) while empty.
constexpr int kLamportBuffers = 3;
constexpr uint32_t kLamportEmpty = 0x80000000u;
/// @brief Byte offset of the Lamport buffers (16-byte aligned, after the fault word).
constexpr std::size_t lamport_offset(int world, int64_t capacity) {
  return (fault_offset(world, capacity) + 8 + 15) / 16 * 16;
}
/// @brief Byte offset of src_rank's slot of token in Lamport buffer buf.
constexpr std::size_t lamport_slot_offset(int world, int64_t capacity, int buf, int64_t token,
                                          int src_rank) {
  return lamport_offset(world, capacity) +
         ((static_cast<std::size_t>(buf) * capacity + token) * world + src_rank) * kSlotBytes;
}
/// @brief Bytes of one rank's exchange workspace for world ranks and `capacity` tokens a launch.
constexpr std::size_t workspace_bytes(int world, int64_t capacity) {
  return lamport_slot_offset(world, capacity, kLamportBuffers, 0, 0);
}

/// @brief The tag of call number `call` (the device counter before it is advanced): never 0,
/// which is what a zeroed slot holds, and calls wrap at 2^30 so bank = call & 1 alternates forever.
constexpr uint32_t kCallPeriod = 1u << 30;
constexpr uint32_t tag_for_call(uint32_t call) { return (call & (kCallPeriod - 1u)) + 1u; }
constexpr int bank_for_call(uint32_t call) { return static_cast<int>(call & 1u); }
constexpr uint32_t next_call(uint32_t call) { return (call + 1u) & (kCallPeriod - 1u); }

/// @brief Consumed slots are not cleared one by one (a store per slot costs about 1 us at virtual
/// TP 2 on 4096 tokens; CHANGELOG.md, 57727c0). Instead, calls whose number is one of the
/// last two before a multiple of kScrubPeriod ("scrub calls") zero the whole bank they used, all
/// `capacity` tokens, at the end of the kernel. A value left in a slot by call c0 could only be
/// taken for a later call c1 of the same tag, i.e. kCallPeriod calls later; every kScrubPeriod
/// calls there is a scrub call of each parity, so a scrub of c0's bank comes between them (any
/// kScrubPeriod up to kCallPeriod would do; docs/design.md, "Tags, banks, and why slot reuse is
/// safe").
/// `period` is a parameter only for the CPU model, which shrinks both periods.
constexpr uint32_t kScrubPeriod = 1u << 28;
constexpr bool is_scrub_call(uint32_t call, uint32_t period = kScrubPeriod) {
  return period <= 2u || (call & (period - 1u)) >= period - 2u;  // periods 1, 2: every call
}
static_assert(kScrubPeriod % 2 == 0 && kCallPeriod % kScrubPeriod == 0,
              "each parity must be scrubbed between two uses of one tag");

/// @brief Tag of the k word: the call tag xor a hash of what every rank must agree on (full
/// widths, world size, eps, order, and the launch chunk's token count). Its top bit is set, so it
/// never equals 0 or a call tag.
uint32_t config_hash(int64_t q_full_width, int64_t k_full_width, int world, float eps, int order,
                     int64_t tokens);

/// The NCCL fallback's check that every rank made the same call (src/nccl_allreduce_fallback.cu):
/// each of the 4 bytes of the call's config_hash goes out as x = byte + 1 and x * x
/// (kConfigCheckFloats floats after the partial sums), all-reduced with them. A rank finds
/// sum(x) = N x and sum(x^2) = N x^2 for every byte of its own only if every rank's byte equals
/// its own (the bytes' variance is then 0; the sums alone would take 1 and 3 for 2 and 2). The
/// sums are integers below 2^24 for up to kMaxWorld ranks, so fp32 adds them exactly in any
/// order. CPU-tested.
constexpr int kConfigCheckFloats = 8;
constexpr float config_check_value(uint32_t hash, int i) {
  const float x = static_cast<float>(((hash >> (8 * (i / 2))) & 0xffu) + 1u);
  return i % 2 == 0 ? x : x * x;
}
/// True if `summed` (the all-reduced check floats of a group of `world`) says every rank sent
/// config_check_value(hash, i).
constexpr bool config_check_agrees(uint32_t hash, int world, const float* summed) {
  for (int i = 0; i < kConfigCheckFloats; ++i) {
    if (summed[i] != static_cast<float>(world) * config_check_value(hash, i)) return false;
  }
  return true;
}

/// XORed into config_hash by ranks in the deterministic mode (bit 31 clear: the hash keeps it
/// set), so a rank in the mode never lends its partials to one that is not.
constexpr uint32_t kDeterministicHashSalt = 0x2c9e4a75u;
/// XORed into config_hash by the fused QK epilogue (bit 31 clear), so an epilogue call never
/// takes a plain norm call's partials, nor lends it its own.
constexpr uint32_t kEpilogueHashSalt = 0x51a7e0c3u;

/// The deterministic mode's canonical order: each full row of Q and of K is split into
/// kCanonicalSegments equal segments; a segment's 16-byte vectors go to kCanonicalLanes lanes
/// (lane j takes vectors j, j + 32, ...), each lane adds its vectors' sums in order, and the
/// lanes' totals meet in a butterfly; the segments meet in a pairwise tree in index order, whose
/// lower levels are a rank's own segments and whose upper levels are the ranks.
constexpr int kCanonicalSegments = 16;
constexpr int kCanonicalLanes = 32;

}  // namespace swiftqk
