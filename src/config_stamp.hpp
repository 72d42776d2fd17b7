// The CommConfig fields every rank of a group must give the same, as a rank carries them in its
// bootstrap handle, and the check that the ranks agree. Host-only and CPU-tested.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "swiftqk/comm_config.hpp"

namespace swiftqk::detail {

/// What a rank's handle says of its CommConfig. Ranks that chunk differently (token_capacity,
/// chunk_oversize) issue different sequences of exchanges, which on the NCCL path are mismatched
/// collectives that never complete; timeout_s bounds reset() and close(), whose barriers every
/// rank must wait out alike; use_p2p must agree by contract (from_nccl).
struct ConfigStamp {
  int64_t token_capacity = 0;
  double timeout_s = 0.0;
  uint32_t chunk_oversize = 0;
  uint32_t use_p2p = 0;
};

ConfigStamp stamp_of(const CommConfig& c);

/// @brief Throws swiftqk::Error, from `who`, naming the first rank whose stamp differs from
/// `mine` and the field, with both values. Every rank of a group that disagrees finds such a
/// rank, so all of them throw before any later collective step.
void check_stamps_agree(const std::vector<ConfigStamp>& stamps, const ConfigStamp& mine,
                        int my_rank, const std::string& who);

}  // namespace swiftqk::detail
