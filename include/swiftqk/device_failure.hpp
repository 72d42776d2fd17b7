// What a failed device-side wait recorded, and its description for the error a host call throws.
// Plain data, no CUDA: the description is tested on machines without a GPU.
#pragma once

#include <cstdint>
#include <string>

namespace swiftqk {

/// @brief What a failed device-side wait recorded (copied from host-mapped memory, no sync).
struct DeviceFailure {
  uint32_t code = 0;          ///< 0 none, 1 timeout
  int32_t rank = -1;          ///< rank that waited
  int32_t peer = -1;          ///< rank whose partial never arrived
  int64_t token = -1;         ///< token (within the launch chunk) it waited for
  uint32_t expected_tag = 0;  ///< tag the waiting rank expected (0: MiniMax-fused, untagged)
  /// Tag of the slot's q word when the wait gave up: 0 if nothing was written there since the
  /// workspace was zeroed or scrubbed, the expected tag if only the k word (which also carries
  /// the configuration hash) disagreed, else the tag of an earlier call.
  uint32_t seen_tag = 0;
  /// @brief One sentence naming the ranks and token, and what the slot's contents say happened.
  std::string describe() const;
};

}  // namespace swiftqk
