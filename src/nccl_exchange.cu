// The fallback's own NCCL communicator (nccl_exchange.hpp): split, bounded waits, abort.
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm_state.hpp"
#include "nccl_exchange.hpp"
#include "swiftqk/error.hpp"

namespace swiftqk::detail {

void wait_nccl(ncclComm_t& comm, std::chrono::steady_clock::time_point deadline, double timeout_s,
               const std::string& what) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    SWIFTQK_EXPECTS(r == ncclSuccess,
                    what + ": ncclCommGetAsyncError failed: " + ncclGetErrorString(r));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      ncclCommAbort(comm);
      comm = nullptr;
      SWIFTQK_FAIL(what + ": NCCL reported " + ncclGetErrorString(state));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      ncclCommAbort(comm);
      comm = nullptr;
      SWIFTQK_FAIL(what + ": NCCL did not finish within " + std::to_string(timeout_s) +
                   " s (CommConfig::timeout_s): a rank did not make the same call, or is late");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

ncclComm_t split_nonblocking(ncclComm_t parent, int rank, double timeout_s,
                             const std::string& what) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                             std::chrono::duration<double>(timeout_s));
  const std::string splitting = what + " (splitting the exchange's NCCL communicator)";
  // NCCL writes the new communicator's handle only once the split has completed, which with a
  // non-blocking parent is after ncclCommSplit returned, from NCCL's own thread. So the handle
  // lives on the heap, and every path that gives up before the split has completed leaves it
  // allocated: NCCL may still write it.
  auto* slot = new ncclComm_t(nullptr);
  const ncclResult_t r = ncclCommSplit(parent, 0, rank, slot, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    SWIFTQK_FAIL(what + ": ncclCommSplit failed: " + ncclGetErrorString(r));
  }
  // ncclInProgress: the parent is non-blocking (a split follows its parent's blocking mode), and
  // the split is one of the parent's operations, complete once the parent's state leaves
  // ncclInProgress. A blocking parent's split has completed when ncclCommSplit returns.
  while (r == ncclInProgress) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(parent, &state);
    SWIFTQK_EXPECTS(q == ncclSuccess,
                    splitting + ": ncclCommGetAsyncError failed: " + ncclGetErrorString(q));
    if (state == ncclSuccess) break;
    // The parent is the caller's: it is never aborted here, so a split still running past the
    // deadline is left to finish (or fail) on its own.
    SWIFTQK_EXPECTS(state == ncclInProgress,
                    splitting + ": NCCL reported " + std::string(ncclGetErrorString(state)));
    SWIFTQK_EXPECTS(std::chrono::steady_clock::now() < deadline,
                    splitting + ": NCCL did not finish within " + std::to_string(timeout_s) +
                        " s: a rank did not make the same call, or is late (the split is left "
                        "running, and the caller's communicator is busy until it ends)");
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  ncclComm_t comm = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  SWIFTQK_EXPECTS(comm != nullptr, what + ": ncclCommSplit returned no communicator");
  delete slot;  // the split has completed: NCCL writes it no more
  wait_nccl(comm, deadline, timeout_s, splitting);
  return comm;
}

void record_nccl_failure(CommState& st, uint32_t code, int64_t first_token) {
  volatile FailureRecord* f = st.h_failure;
  if (f != nullptr && f->code == kFailNone) {
    f->rank = st.rank;
    f->peer = -1;
    f->token = first_token;
    f->expected_tag = 0;
    f->seen_tag = 0;
    // The code last: a reader that sees it sees the rest (x86 keeps stores in order; the
    // fence keeps the compiler from reordering them).
    std::atomic_thread_fence(std::memory_order_release);
    f->code = code;
  }
  // Before any abort: the scale kernel behind the all-reduce starts only once the abort has
  // ended the all-reduce's kernel, and then reads 1.
  if (st.h_nccl_abort != nullptr) __atomic_store_n(st.h_nccl_abort, 1, __ATOMIC_SEQ_CST);
}

void record_nccl_timeout(CommState& st, int64_t first_token) {
  record_nccl_failure(st, kFailNcclTimeout, first_token);
}

void abort_nccl_exchange(CommState& st, int64_t first_token) {
  std::lock_guard<std::mutex> lock(st.nccl_mu);
  record_nccl_timeout(st, first_token);
  if (st.nccl_exchange != nullptr) {
    ncclCommAbort(st.nccl_exchange);
    st.nccl_exchange = nullptr;
  }
}

}  // namespace swiftqk::detail
