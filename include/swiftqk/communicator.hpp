// The communicator of one rank of a tensor-parallel group: its exchange workspace, the table of
// its peers' workspaces, its device-resident call counter and its error word.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "swiftqk/comm_config.hpp"
#include "swiftqk/device_failure.hpp"
#include "swiftqk/qk_epilogue_params.hpp"
#include "swiftqk/qk_norm_params.hpp"

typedef struct ncclComm* ncclComm_t;

namespace swiftqk {

namespace detail {
struct CommState;
}

/// @brief One rank's handle. Move-only. Create with create_local_group, IpcBootstrap or
/// from_nccl. At most one call may be in flight per communicator: launches must come from one
/// stream (a switch is refused until the previous launch has completed), and a second kernel of
/// the same communicator running at once (graph replays on two streams) is caught on the device:
/// it fails the communicator instead of mixing partials.
///
/// Failures are sticky, as NCCL's asynchronous errors are: once any rank of the group has
/// recorded a failure (a wait timed out, two kernels ran at once), every later kernel of every
/// rank writes NaN over all its outputs (eager or graph replay) and the host raises
/// swiftqk::Error, naming the rank, the peer and the token, at the next launch or check_error(),
/// until every rank has called reset(). docs/design.md, "Failure semantics".
class Communicator {
 public:
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator();

  /// @brief All ranks of a group driven by this process: devices[r] is rank r's GPU. Distinct
  /// GPUs need peer access (enabled here); equal entries make virtual ranks sharing one GPU.
  static std::vector<Communicator> create_local_group(const std::vector<int>& devices,
                                                      const CommConfig& config = {});

  /// @brief Creates rank `rank` of the group spanned by an initialised NCCL communicator (one
  /// GPU per rank, one process or thread per rank). Collective: every rank must call it. The
  /// IPC handles travel through ncclAllGather on `stream`; then the P2P write test runs. If any
  /// rank cannot map or reach its peers, every rank gets a communicator with p2p() false that
  /// exchanges through NCCL instead, and says so once on stderr.
  static Communicator from_nccl(ncclComm_t nccl, const CommConfig& config, cudaStream_t stream);

  int rank() const;
  int world_size() const;
  /// @brief False when the fused kernel cannot run on this group (from_nccl found no working
  /// P2P, or CommConfig::use_p2p was false): launches of kSwiftQK and kMiniMaxFused then take
  /// the NCCL all-reduce path (kMiniMaxEager's scheme: [T, 2] fp32 partials, one all-reduce).
  bool p2p() const;
  int device() const;
  const CommConfig& config() const;

  /// @brief Throws swiftqk::Error if a device-side wait of an earlier launch failed. Does not
  /// synchronise: it reads host-mapped memory, so a failure shows up once the kernel has hit it.
  void check_error() const;
  /// @brief The failure recorded so far, if any (code 0 when none). No synchronisation.
  DeviceFailure failure() const;
  /// @brief Synchronises `stream`, then check_error(). Blocking.
  void synchronize(cudaStream_t stream) const;
  /// @brief After a failure: makes the group usable again. Collective: every rank calls it,
  /// concurrently (one thread or process per rank). It waits for this rank's kernels (synchronise
  /// the streams of graph replays first), meets every peer at a barrier, clears this rank's slots,
  /// fault word, counters and failure record, and meets them again, so nothing a late peer
  /// published before the reset can be taken after it. Bounded by about 2 x timeout_s; throws
  /// naming a rank that never arrived. A group from create_local_group (one caller drives every
  /// rank) resets as a whole: reset() on any of its ranks synchronises their GPUs and clears all.
  /// Every rank must make the same sequence of reset(), close() and probe_peers() calls: each
  /// takes its barrier rounds when it starts (reset two, the others one), so a rank that resets
  /// on its own more often than its peers stays rounds ahead and no later barrier can meet.
  void reset();

  /// @brief Collective teardown (DeepEP's destroy()): waits for this rank's kernels, meets every
  /// peer at a barrier bounded by timeout_s (ranks of create_local_group need none), then unmaps
  /// the peers and frees this rank's memory. Idempotent; the destructor calls it. If a peer
  /// never arrives it throws, and the workspace stays allocated so that the peer's late writes
  /// land in memory nothing else uses. Launches on a closed communicator throw. Its barrier
  /// takes one round, in the same sequence of reset(), close() and probe_peers() calls on every
  /// rank (see reset()).
  void close();
  /// @brief close() without the barrier, for a communicator the group decided not to use (a
  /// rank could not map its peers, or the P2P write test failed, so every rank falls back):
  /// the peers that fall back never come to close()'s barrier, which would wait out its bound.
  /// Only valid while no peer can write into this workspace: no kernel of the group was ever
  /// launched, and every peer's probe_peers() has returned. Throws, closing nothing, if this
  /// communicator has launched (its peers' kernels may still write into it; use close()).
  void close_without_barrier();
  /// @brief True once close() has run.
  bool closed() const;

  /// @brief Runs a real write test: every rank writes a fresh nonce into each peer's workspace
  /// and waits (bounded by timeout_s) to see all peers' nonces. Collective. True if all arrived.
  /// Takes one barrier round (see reset()).
  bool probe_peers(cudaStream_t stream);

  detail::CommState& state();
  const detail::CommState& state() const;

 private:
  friend class IpcBootstrap;
  explicit Communicator(std::unique_ptr<detail::CommState> state);
  void close_quietly() noexcept;
  std::unique_ptr<detail::CommState> state_;
};

/// @brief Two-phase creation for one process per GPU (the DeepEP/vLLM shape): construct, send
/// local_handle() to every rank through any transport, then connect() with all ranks' handles
/// ordered by rank. connect() opens the peers with CUDA IPC.
class IpcBootstrap {
 public:
  IpcBootstrap(int rank, int world_size, int device, const CommConfig& config = {});
  ~IpcBootstrap();
  IpcBootstrap(const IpcBootstrap&) = delete;
  IpcBootstrap& operator=(const IpcBootstrap&) = delete;

  /// @brief This rank's workspace handle and settings, as bytes.
  std::vector<uint8_t> local_handle() const;
  /// @brief Opens every peer's workspace; handles[r] is what rank r's local_handle() returned.
  /// Throws if a handle is malformed or disagrees (world size, capacity, rank order).
  Communicator connect(const std::vector<std::vector<uint8_t>>& handles);

 private:
  friend class Communicator;
  /// This rank alone, no peer mapped (from_nccl's NCCL-only fallback).
  Communicator without_peers();
  std::unique_ptr<detail::CommState> state_;
};

/// @brief Normalises one rank's Q and K shards in one launch on `stream`: each row is divided by
/// the RMS of the whole (all ranks') row and multiplied by the weight. Every rank of the group
/// must make the same sequence of calls with the same tokens and full widths.
/// Validates p first (throws, writes nothing). Works under CUDA-graph capture: all state the
/// kernel depends on lives on the device.
void launch_qk_norm(Communicator& comm, const QkNormParams& p, cudaStream_t stream);

/// @brief One launch for several ranks that share one GPU (virtual ranks): comms[i] with
/// params[i]. The ranks must all be on `stream`'s device.
void launch_qk_norm_group(const std::vector<Communicator*>& comms,
                          const std::vector<QkNormParams>& params, cudaStream_t stream);

/// @brief The fused QK epilogue on `stream`: QK-norm, RoPE, and the writes of Q, and of K and V
/// into the paged KV cache, in one launch (QkEpilogueParams says what each step does and where
/// it rounds). Layerwise, every rank of the group makes the same sequence of calls (plain norm
/// and epilogue calls share the call counter) with the same tokens and heads, as for
/// launch_qk_norm, and the group needs P2P; headwise exchanges nothing. Validates p first
/// (throws, writes nothing). A position or slot out of range is caught on the device: the
/// token's writes are skipped, and the next launch or check_error() throws naming the token and
/// the value (until reset()). Works under CUDA-graph capture.
void launch_qk_epilogue(Communicator& comm, const QkEpilogueParams& p, cudaStream_t stream);

/// @brief The epilogue for several virtual ranks sharing one GPU, in one launch: comms[i] with
/// params[i], all on `stream`'s device.
void launch_qk_epilogue_group(const std::vector<Communicator*>& comms,
                              const std::vector<QkEpilogueParams>& params, cudaStream_t stream);

}  // namespace swiftqk
