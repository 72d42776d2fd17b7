// What a failed device-side wait recorded, and its description for the error a host call throws.
// Plain data, no CUDA: the description is tested on machines without a GPU.
#pragma once

#include <cstdint>
#include <string>

namespace swiftqk {

/// @brief What a failed device-side wait recorded (copied from host-mapped memory, no sync).
struct DeviceFailure {
  /// 0 none; 1 a wait timed out; 2 a second kernel of the communicator ran at the same time;
  /// 3 a peer recorded a failure (peer names it); 4 an epilogue token's position was outside
  /// [0, max_position); 5 an epilogue token's KV-cache slot was outside [0, slots) and not -1;
  /// 6 the NCCL fallback's all-reduce from `token` on did not finish within timeout_s (recorded
  /// by the host's watchdog); 7 the NCCL fallback's ranks made a call with different
  /// configurations; 8 the NCCL fallback's reset() could not split a new NCCL communicator
  /// (recorded by the host; reset() must run again on every rank)
  uint32_t code = 0;
  int32_t rank = -1;          ///< rank that recorded it
  int32_t peer = -1;          ///< code 1: rank whose partial never arrived; code 3: the failed peer
  int64_t token = -1;         ///< code 1: token (within the launch chunk) it waited for
  uint32_t expected_tag = 0;  ///< tag the waiting rank expected (0: MiniMax-fused, untagged)
  /// Tag of the slot's q word when the wait gave up: 0 if nothing was written there since the
  /// workspace was zeroed or scrubbed, the expected tag if only the k word (which also carries
  /// the configuration hash) disagreed, else the tag of an earlier call.
  uint32_t seen_tag = 0;
  /// Codes 4 and 5: the position or slot the token carried; `limit` the bound it broke
  /// (max_position, or num_blocks * block_size).
  int64_t value = 0;
  int64_t limit = 0;
  /// @brief One sentence naming the ranks and token, and what the slot's contents say happened.
  std::string describe() const;
};

}  // namespace swiftqk
