// The NCCL communicator that a group without P2P exchanges its partial sums on: split from the
// caller's communicator as non-blocking, owned by the SwiftQK communicator, so that its waits
// are bounded and a watchdog may abort it (a peer that never joins would otherwise hang the
// all-reduce, and every later call on the stream, for ever).
#pragma once

#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace swiftqk::detail {

struct CommState;

/// @brief Polls comm's asynchronous state until its last call has finished (not
/// ncclInProgress). Throws naming `what` if NCCL reports an error; past `deadline` it aborts comm
/// (setting comm to nullptr) and throws naming the bound.
void wait_nccl(ncclComm_t& comm, std::chrono::steady_clock::time_point deadline, double timeout_s,
               const std::string& what);

/// @brief A non-blocking communicator of the same ranks as `parent` (ncclCommSplit, collective
/// over parent), ready within timeout_s or aborted with an error naming `what`. The split takes
/// the parent's blocking mode: with a non-blocking parent its completion is polled on the
/// parent, bounded by timeout_s; with a blocking one ncclCommSplit itself waits for every rank,
/// without a bound.
ncclComm_t split_nonblocking(ncclComm_t parent, int rank, double timeout_s,
                             const std::string& what);

/// @brief Records `code` (a FailureCode) for the chunk from `first_token` (-1: none) in st's
/// host-mapped failure record (if none is there yet) and sets the abort flag the scale kernel
/// reads (it then writes NaN). The caller holds st.nccl_mu.
void record_nccl_failure(CommState& st, uint32_t code, int64_t first_token);

/// @brief record_nccl_failure with code kFailNcclTimeout.
void record_nccl_timeout(CommState& st, int64_t first_token);

/// @brief The watchdog's action when an eager all-reduce from `first_token` on has not finished
/// within timeout_s: records code kFailNcclTimeout in the host-mapped failure record (if none is
/// there yet), sets the abort flag that the scale kernel reads (it then writes NaN), then aborts
/// the exchange communicator, which ends its kernel. Takes st.nccl_mu.
void abort_nccl_exchange(CommState& st, int64_t first_token);

}  // namespace swiftqk::detail
