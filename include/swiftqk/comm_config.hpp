// The settings of a communicator, and their check. Plain data, no CUDA: CPU-tested.
#pragma once

#include <cstdint>

namespace swiftqk {

/// Range of CommConfig::timeout_s, in seconds.
constexpr double kMinTimeoutS = 1e-3;
constexpr double kMaxTimeoutS = 3600.0;

/// @brief Settings every rank of a group must give alike.
struct CommConfig {
  int64_t token_capacity = 16384;  ///< tokens one kernel launch exchanges; larger T is chunked
  bool chunk_oversize = true;      ///< false: a launch of more than token_capacity tokens fails
  /// A device-side wait longer than this fails the call (finite, in [kMinTimeoutS,
  /// kMaxTimeoutS]); it also bounds reset() and close().
  double timeout_s = 5.0;
  /// SMs the persistent kernel may fill; 0 = all of them. Leave room here for kernels that run
  /// beside SwiftQK's and spin or hold SMs (another communicator on this GPU, a long NCCL kernel
  /// on another stream): SwiftQK's waits count on all its blocks being resident. A launch that
  /// serves fewer of a local group's ranks on this GPU than the group has there (each virtual
  /// rank launched on its own stream) takes that share of the budget, so that all of them fit.
  int sm_budget = 0;
  /// from_nccl only: false keeps the exchange on NCCL (the all-reduce path) even where P2P works
  /// (for A/B runs and debugging); every rank must give the same value.
  bool use_p2p = true;
};

/// @brief Throws swiftqk::Error naming the first bad setting of c (capacity, timeout, SM budget).
void validate_config(const CommConfig& c);

}  // namespace swiftqk
