// The by-value argument block of one fused launch, shared by host dispatch and the kernels.
#pragma once

#include <cstddef>
#include <cstdint>

namespace swiftqk::detail {

/// Virtual ranks one launch can serve (kept small so the block fits the 4 KB kernel parameter
/// space; __grid_constant__ keeps it out of local memory).
constexpr int kMaxRanksPerLaunch = 16;
/// Largest tensor-parallel group: one lane of the polling warp watches each rank's slot.
constexpr int kMaxWorld = 32;

/// What a failure records (first failure wins); the same layout in device memory and in
/// host-mapped memory. Codes: FailureCode.
struct FailureRecord {
  uint32_t code;
  int32_t rank;
  int32_t peer;
  uint32_t expected_tag;
  int64_t token;
  uint32_t seen_tag;
  uint32_t pad;
  int64_t value;  // kFailBadPosition, kFailBadSlot: what the token carried
  int64_t limit;  // and the bound it broke
};

/// Why a rank stopped (FailureRecord::code, DeviceFailure::code).
enum FailureCode : uint32_t {
  kFailNone = 0,
  kFailTimeout = 1,     // a wait for a peer's partials expired
  kFailConcurrent = 2,  // a second kernel of this communicator ran at the same time
  kFailPeer = 3,        // a peer recorded a failure (the group's fault word named it)
  // Bad data the epilogue kernel found (the token's writes are skipped; the group stays healthy,
  // since every rank holds the same positions and slots and finds the same):
  kFailBadPosition = 4,  // a position outside [0, max_position)
  kFailBadSlot = 5,      // a KV-cache slot outside [0, num_blocks * block_size), not -1
  // Recorded by the host, not a kernel: the NCCL fallback's all-reduce of a chunk did not finish
  // within timeout_s (the watchdog aborted the fallback's NCCL communicator).
  kFailNcclTimeout = 6,
  // The NCCL fallback's per-call check: the ranks' configuration hashes of this call differ.
  kFailConfigMismatch = 7,
  // Recorded by the host: the NCCL fallback has no exchange communicator, because reset() could
  // not split a new one (the old one is aborted by then); reset() must run again on every rank.
  kFailNcclNoExchange = 8,
};

/// Device-resident per-rank counters. With peers block 0 of a kernel claims the rank with an
/// atomicOr of its owner id into `owner`, which returns the call number and the previous owner
/// in one 64-bit word (a second kernel of the same communicator running at once finds another
/// owner and fails instead of mixing its partials with the first's; rank_claim.cuh); the last
/// block to finish releases the rank and advances the call in one 64-bit store, so graph replays
/// always find the current call number on the device. A group of one exchanges nothing and
/// leaves them alone.
struct alignas(8) CallState {
  uint32_t call;   // low half of the claim word
  uint32_t owner;  // high half: the owners' ids ORed ({n, ~n} of %gridid's low 16 bits), 0 = free
  uint32_t blocks_done;
  uint32_t probe_round;
  uint32_t lamport_call;    // MiniMax-fused baseline: buffer of the next call, 0..2
  uint32_t lamport_tokens;  // tokens of the last MiniMax-fused call (cleared by the next one)
  uint32_t pad[2];
};
static_assert(offsetof(CallState, owner) == 4, "call and owner form one 64-bit word");

/// One rank's share of a launch.
struct RankArgs {
  const void* q_in;
  void* q_out;
  const void* q_w;
  const void* k_in;
  void* k_out;
  const void* k_w;
  int64_t q_in_stride, q_out_stride, k_in_stride, k_out_stride;
  float q_in_scale, k_in_scale;
  float* rstd_out;
  uint8_t* const* peers;  // device table [world] of workspace bases, peers[rank] is local
  uint8_t* local_ws;
  CallState* state;
  FailureRecord* failure;       // device memory, first failure wins
  FailureRecord* host_failure;  // host-mapped mirror the host reads without synchronising
  int rank;
};

struct LaunchArgs {
  RankArgs r[kMaxRanksPerLaunch];
  int world;            // ranks in the group
  int blocks_per_rank;  // blockIdx.x / blocks_per_rank picks r[]
  int group_threads;    // threads per token row
  int tokens_per_block;
  int stages;                    // rows staged per group (kMinStages..kMaxStages), vector path
  int defer;                     // deferral depth with peers, at most stages - 1
  int order;                     // NormOrder
  int64_t tokens;                // rows in this launch (one chunk)
  int64_t q_width, k_width;      // local widths in elements
  int64_t capacity;              // token slots per bank
  float q_inv_full, k_inv_full;  // 1 / full width
  float eps;
  uint32_t config_hash;
  uint64_t timeout_ns;
  int pdl;  // launched with programmatic dependent launch: trigger the dependents
  // Deterministic mode (protocol.hpp, kCanonicalSegments): the staged slots of each thread that
  // hold Q vectors, from its first slot up (K's go from its last slot down).
  int det_q_slots;
};

}  // namespace swiftqk::detail
