// The paper's NCCL baselines behind the launch API: All-Gather (vLLM's OLMo2 path), Comm-Overlap
// (the all-gathers of the next chunk overlapped with normalising this one) and MiniMax eager
// (partial sums, ncclAllReduce, apply: the library's own path without P2P). They exist to be
// compared with, not to be used.
#pragma once

#include <cuda_runtime_api.h>

#include "swiftqk/communicator.hpp"

namespace swiftqk::detail {

/// @brief Runs p.method (kAllGather, kCommOverlap or kMiniMaxEager) for one rank, chunked by the
/// workspace capacity; NCCL carries the data when the group has more than one rank (its
/// communicator then comes from from_nccl). p is validated; the caller holds the launch lock.
void launch_nccl_baseline(Communicator& comm, const QkNormParams& p, cudaStream_t stream);

}  // namespace swiftqk::detail
