// The communicator of one rank of a tensor-parallel group: its exchange workspace, the table of
// its peers' workspaces, its device-resident call counter and its error word.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "swiftqk/device_failure.hpp"
#include "swiftqk/qk_norm_params.hpp"

typedef struct ncclComm* ncclComm_t;

namespace swiftqk {

/// @brief Settings every rank of a group must give alike.
struct CommConfig {
  int64_t token_capacity = 16384;  ///< tokens one kernel launch exchanges; larger T is chunked
  bool chunk_oversize = true;      ///< false: a launch of more than token_capacity tokens fails
  double timeout_s = 5.0;          ///< a device-side wait longer than this fails the call
  int sm_budget = 0;               ///< SMs the persistent kernel may fill; 0 = all of them
  /// from_nccl only: false keeps the exchange on NCCL (the all-reduce path) even where P2P works
  /// (for A/B runs and debugging); every rank must give the same value.
  bool use_p2p = true;
};

namespace detail {
struct CommState;
}

/// @brief One rank's handle. Move-only. Create with create_local_group, IpcBootstrap or
/// from_nccl. At most one call may be in flight per communicator: launches must come from one
/// stream (a switch is refused until the previous launch has completed).
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
  /// @brief After a failure: clears this rank's slots, counter and error word. Every rank must
  /// reset, with a barrier between the resets and the next launch (no kernel may be running).
  void reset();

  /// @brief Runs a real write test: every rank writes a fresh nonce into each peer's workspace
  /// and waits (bounded by timeout_s) to see all peers' nonces. Collective. True if all arrived.
  bool probe_peers(cudaStream_t stream);

  detail::CommState& state();
  const detail::CommState& state() const;

 private:
  friend class IpcBootstrap;
  explicit Communicator(std::unique_ptr<detail::CommState> state);
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

}  // namespace swiftqk
