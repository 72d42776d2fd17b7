// What a Communicator owns. Internal: the kernels' RankArgs are filled from it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "handle_pool.hpp"
#include "kernels/launch_args.hpp"
#include "retained_scratch.hpp"
#include "swiftqk/communicator.hpp"
#include "watchdog.hpp"

namespace swiftqk::detail {

/// Device allocations freed together, possibly on several devices; shared by the ranks of a
/// local group so that no rank frees a workspace its peers still point into.
struct DeviceAllocations {
  std::vector<std::pair<int, void*>> blocks;  // (device, pointer)
  ~DeviceAllocations();
  void* allocate(int device, std::size_t bytes);
};

struct CommState;

/// What the paper's NCCL baselines keep between launches (src/baselines/nccl_baselines.cu), made
/// at their first launch.
struct BaselineState;
struct BaselineStateDeleter {
  void operator()(BaselineState* b) const noexcept;
};

/// The ranks of a group that one process drives alone (create_local_group): with no peer in
/// another process or thread, a reset or close can quiesce every rank itself.
struct LocalGroup {
  std::mutex mu;
  std::vector<CommState*> members;  // live states (addresses stable: each is heap-owned)
};

/// A CUDA event without timing, on `device`; throws swiftqk::Error when CUDA fails.
cudaEvent_t new_event_on(int device);

struct CommState {
  int rank = 0;
  int world = 1;
  int device = 0;
  CommConfig config;

  std::shared_ptr<DeviceAllocations> allocations;  // this rank's (or the whole group's) memory
  uint8_t* local_ws = nullptr;
  std::vector<uint8_t*> peers;    // host copy of the peer table
  uint8_t** d_peers = nullptr;    // device copy, [world]
  std::vector<void*> ipc_opened;  // peer mappings to close
  CallState* d_state = nullptr;
  FailureRecord* d_failure = nullptr;
  FailureRecord* h_failure = nullptr;      // host-mapped, pinned
  FailureRecord* h_failure_dev = nullptr;  // its device alias
  // Every rank counts its collective rounds alike: each probe, reset and close takes its rounds
  // (reserve_rounds) when it starts, so one that throws half-way leaves no rank a round behind.
  uint64_t probe_round = 0;
  int* d_probe_ok = nullptr;    // preallocated: a cudaMalloc during a peer's probe could stall it
  int* h_probe_ok = nullptr;    // pinned
  uint32_t* h_owner = nullptr;  // pinned: a copy of CallState::owner (quiesce)
  cudaStream_t ctl_stream = nullptr;  // non-blocking: barriers, clears and copies of reset/close
  std::shared_ptr<LocalGroup> local_group;  // set for create_local_group's ranks
  int ranks_on_device = 1;                  // ranks of the group on this GPU driven by this process
  bool closed = false;

  // NCCL: the all-reduce path without P2P (src/nccl_allreduce_fallback.cu) and the baselines.
  ncclComm_t nccl = nullptr;  // from from_nccl; not owned: it must outlive this communicator
  bool p2p = true;            // false: fused-kernel launches take the NCCL all-reduce path instead
  // Without P2P (world > 1): the all-reduce path's own communicator, split from `nccl` as
  // non-blocking and owned (src/nccl_exchange.hpp); nullptr once aborted, until reset() splits
  // a new one. nccl_mu guards it between launches and the watchdog's abort.
  ncclComm_t nccl_exchange = nullptr;
  std::mutex nccl_mu;
  int* h_nccl_abort = nullptr;         // pinned, mapped: 1 once the watchdog aborted an all-reduce
  int* d_nccl_abort = nullptr;         // its device alias, read by the scale kernel (NaN when 1)
  std::unique_ptr<Watchdog> watchdog;  // bounds the eager all-reduces of nccl_exchange
  // The begin and end events of each watched all-reduce, given back by the watchdog (created on
  // this rank's device; destroyed at release(), after the watchdog's thread has stopped).
  HandlePool<cudaEvent_t> nccl_events{[this] { return new_event_on(device); },
                                      [](cudaEvent_t e) { cudaEventDestroy(e); }};
  /// Splits nccl_exchange from `nccl` and allocates the abort flag and the watchdog (from_nccl
  /// without P2P; reset() after an abort). Collective over `nccl`, bounded by timeout_s.
  void open_nccl_exchange(const char* what);
  RetainedScratch allreduce_scratch;  // the all-reduce path's [tokens] (q, k) partial sums
  std::unique_ptr<BaselineState, BaselineStateDeleter> baselines;

  // One call in flight per communicator (see Communicator's doc).
  std::mutex launch_mutex;
  cudaStream_t last_stream = nullptr;
  bool has_last = false;
  cudaEvent_t last_done = nullptr;
  bool launched = false;  // a launch has begun on this communicator (close_without_barrier)

  CommState() = default;
  CommState(const CommState&) = delete;
  CommState& operator=(const CommState&) = delete;
  ~CommState();

  /// Frees everything this rank owns (idempotent); its workspace goes with the last rank of the
  /// allocations. The caller has made sure no peer can still write into it.
  void release();
  /// Waits, bounded by about twice timeout_s, until this rank's kernels have finished: the last
  /// eager launch, and whatever kernel still owns the rank (CallState::owner).
  void quiesce();
  /// A bounded barrier over the group at probe round `round` (every rank's probe word carries
  /// it): throws naming the first rank that did not arrive, for `what` ("reset", "close").
  void barrier(const char* what, uint64_t round);
  /// Clears this rank's slots, fault word, Lamport buffers, counters and failure record.
  void clear_exchange_state();

  /// Allocates the workspace (zeroed), counters and failure words on `device`.
  void allocate_local();
  /// Uploads `peers` to the device table.
  void upload_peers();
  /// Checks and records the stream of a new launch (throws on a second call in flight);
  /// `capturing`: the stream is being captured into a graph (stream_capturing).
  void begin_launch(cudaStream_t stream, bool capturing);
  /// The first of the next n probe rounds, taken for one collective operation.
  uint64_t reserve_rounds(int n) {
    const uint64_t first = probe_round + 1;
    probe_round += static_cast<uint64_t>(n);
    return first;
  }
  /// Launches probe round `round` on `stream`, waiting up to timeout_s for every peer (no
  /// synchronisation); *h_probe_ok reads 1 once it has finished if every peer's word arrived,
  /// else -(missing rank + 1).
  void launch_probe(cudaStream_t stream, double timeout_s, uint64_t round);
  void end_launch(cudaStream_t stream, bool capturing);
  RankArgs rank_args() const;
};

/// The end of one launch (CommState::end_launch) on each of its communicators, recorded also
/// when the launch throws: whatever it enqueued before the throw (an NCCL fallback call whose
/// all-reduce was aborted has enqueued its kernels when its final check throws) is then the
/// launch that reset()'s quiesce waits for and that a launch from another stream finds in
/// flight, not the one before it. Made once every communicator's begin_launch has passed, and
/// destroyed before their launch_mutex locks are released.
class LaunchEnd {
 public:
  LaunchEnd(Communicator* const* comms, std::size_t count, cudaStream_t stream, bool capturing)
      : comms_(comms), count_(count), stream_(stream), capturing_(capturing) {}
  LaunchEnd(const LaunchEnd&) = delete;
  LaunchEnd& operator=(const LaunchEnd&) = delete;
  /// The launch returns: records its end on every communicator (throws if CUDA cannot).
  void done() {
    for (; ended_ < count_; ++ended_) comms_[ended_]->state().end_launch(stream_, capturing_);
  }
  ~LaunchEnd() {
    // The launch threw: its own error is the one the caller gets, so a failure to record the
    // end is dropped here.
    for (; ended_ < count_; ++ended_) {
      try {
        comms_[ended_]->state().end_launch(stream_, capturing_);
      } catch (...) {
      }
    }
  }

 private:
  Communicator* const* comms_;
  std::size_t count_;
  cudaStream_t stream_;
  bool capturing_;
  std::size_t ended_ = 0;
};

/// True while `stream` is being captured into a CUDA graph.
bool stream_capturing(cudaStream_t stream);

/// The kernel arguments of rank s for params p, starting at token first_token (launch.cu).
RankArgs rank_args_for(const CommState& s, const QkNormParams& p, int64_t first_token);

/// Sets the current device for a scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();

 private:
  int previous_ = 0;
};

}  // namespace swiftqk::detail
