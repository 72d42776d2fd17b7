// Communicator creation (local group, IPC two-phase, NCCL), the P2P write test and error checks.
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "comm_state.hpp"
#include "config_stamp.hpp"
#include "cuda_check.hpp"
#include "kernels/exchange.cuh"
#include "nccl_exchange.hpp"
#include "protocol.hpp"

namespace swiftqk {

namespace detail {

DeviceGuard::DeviceGuard(int device) {
  SWIFTQK_CUDA_TRY(cudaGetDevice(&previous_));
  if (device != previous_) SWIFTQK_CUDA_TRY(cudaSetDevice(device));
}
DeviceGuard::~DeviceGuard() { cudaSetDevice(previous_); }

// cudaFree needs no current device (the pointer names its own); the caller's current device
// must survive the destruction of a group spanning several GPUs.
DeviceAllocations::~DeviceAllocations() {
  for (auto& block : blocks) cudaFree(block.second);  // destructor: nothing to report to
}

void* DeviceAllocations::allocate(int device, std::size_t bytes) {
  DeviceGuard guard(device);
  void* p = nullptr;
  SWIFTQK_CUDA_TRY(cudaMalloc(&p, bytes));
  blocks.emplace_back(device, p);
  SWIFTQK_CUDA_TRY(cudaMemset(p, 0, bytes));
  return p;
}

// Marks every word of the MiniMax-fused baseline's Lamport buffers empty (-0.0).
__global__ void fill_lamport_empty(uint32_t* p, std::size_t words) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    p[i] = kLamportEmpty;
  }
}

__global__ void probe_kernel(uint8_t* const* peers, uint8_t* local, int rank, int world,
                             std::size_t probe_off, uint64_t round, uint64_t timeout_ns, int* ok);

// On `stream`, synchronised: a device-wide synchronisation here would wait for a peer thread's
// barrier kernel on the same GPU, which waits for this rank.
void mark_lamport_empty(uint8_t* ws, int world, int64_t capacity, cudaStream_t stream) {
  const std::size_t off = lamport_offset(world, capacity);
  const std::size_t words = (workspace_bytes(world, capacity) - off) / 4;
  fill_lamport_empty<<<256, 256, 0, stream>>>(reinterpret_cast<uint32_t*>(ws + off), words);
  SWIFTQK_CUDA_TRY(cudaGetLastError());
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(stream));
}

cudaEvent_t new_event_on(int device) {
  DeviceGuard guard(device);
  cudaEvent_t e = nullptr;
  SWIFTQK_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

CommState::~CommState() { release(); }

// Destruction paths report nothing: there is no caller left to tell.
void CommState::release() {
  if (local_group) {
    std::lock_guard<std::mutex> lock(local_group->mu);
    auto& m = local_group->members;
    m.erase(std::remove(m.begin(), m.end(), this), m.end());
  }
  local_group.reset();
  watchdog.reset();  // its thread first: no expiry may run on what is freed below
  if (nccl_exchange != nullptr) {
    // After quiesce nothing of this rank is in flight on it; the abort frees it without
    // waiting on a peer (a destroy would flush, and a missing peer would hold it).
    ncclCommAbort(nccl_exchange);
    nccl_exchange = nullptr;
  }
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device);
  for (void* p : ipc_opened) cudaIpcCloseMemHandle(p);
  ipc_opened.clear();
  auto free_device = [](auto*& p) {
    if (p) cudaFree(p);
    p = nullptr;
  };
  auto free_host = [](auto*& p) {
    if (p) cudaFreeHost(p);
    p = nullptr;
  };
  free_device(d_peers);
  free_device(d_state);
  free_device(d_failure);
  free_device(d_probe_ok);
  free_host(h_probe_ok);
  free_host(h_owner);
  free_host(h_failure);
  free_host(h_nccl_abort);
  d_nccl_abort = nullptr;
  if (last_done) cudaEventDestroy(last_done);
  last_done = nullptr;
  nccl_events.clear();  // the watchdog, which gives them back, is gone
  allreduce_scratch.release();
  baselines.reset();
  if (ctl_stream) cudaStreamDestroy(ctl_stream);
  ctl_stream = nullptr;
  cudaSetDevice(prev);
  allocations.reset();  // the workspace, once no rank of the allocations is left
  local_ws = nullptr;
}

void CommState::allocate_local() {
  SWIFTQK_EXPECTS(
      world >= 1 && world <= kMaxWorld,
      "TP degree must be in [1, " + std::to_string(kMaxWorld) + "], got " + std::to_string(world));
  SWIFTQK_EXPECTS(rank >= 0 && rank < world, "rank " + std::to_string(rank) + " is outside [0, " +
                                                 std::to_string(world) + ")");
  validate_config(config);
  DeviceGuard guard(device);
  if (!allocations) allocations = std::make_shared<DeviceAllocations>();
  SWIFTQK_CUDA_TRY(cudaStreamCreateWithFlags(&ctl_stream, cudaStreamNonBlocking));
  local_ws = static_cast<uint8_t*>(
      allocations->allocate(device, workspace_bytes(world, config.token_capacity)));
  mark_lamport_empty(local_ws, world, config.token_capacity, ctl_stream);
  SWIFTQK_CUDA_TRY(cudaMalloc(&d_state, sizeof(CallState)));
  SWIFTQK_CUDA_TRY(cudaMemset(d_state, 0, sizeof(CallState)));
  SWIFTQK_CUDA_TRY(cudaMalloc(&d_failure, sizeof(FailureRecord)));
  SWIFTQK_CUDA_TRY(cudaMemset(d_failure, 0, sizeof(FailureRecord)));
  SWIFTQK_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&h_failure), sizeof(FailureRecord),
                                 cudaHostAllocMapped));
  std::memset(h_failure, 0, sizeof(FailureRecord));
  SWIFTQK_CUDA_TRY(
      cudaHostGetDevicePointer(reinterpret_cast<void**>(&h_failure_dev), h_failure, 0));
  SWIFTQK_CUDA_TRY(cudaMalloc(&d_peers, sizeof(uint8_t*) * world));
  SWIFTQK_CUDA_TRY(cudaMalloc(&d_probe_ok, sizeof(int)));
  SWIFTQK_CUDA_TRY(cudaMallocHost(&h_probe_ok, sizeof(int)));
  SWIFTQK_CUDA_TRY(cudaMallocHost(&h_owner, sizeof(uint32_t)));
  SWIFTQK_CUDA_TRY(cudaEventCreateWithFlags(&last_done, cudaEventDisableTiming));
}

void CommState::upload_peers() {
  SWIFTQK_EXPECTS(static_cast<int>(peers.size()) == world, "peer table has the wrong size");
  DeviceGuard guard(device);
  SWIFTQK_CUDA_TRY(
      cudaMemcpy(d_peers, peers.data(), sizeof(uint8_t*) * world, cudaMemcpyHostToDevice));
}

bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  SWIFTQK_CUDA_TRY(cudaStreamIsCapturing(stream, &cs));
  return cs != cudaStreamCaptureStatusNone;
}

void CommState::begin_launch(cudaStream_t stream, bool capturing) {
  launched = true;  // a capture counts too: its replays run kernels
  // Under capture nothing runs yet, and querying an event would invalidate a capture in global
  // mode (PyTorch's default): the in-flight check applies to eager launches only.
  if (capturing) return;
  if (has_last && stream != last_stream) {
    const cudaError_t q = cudaEventQuery(last_done);
    if (q == cudaErrorNotReady) {
      SWIFTQK_FAIL("communicator rank " + std::to_string(rank) +
                   ": a launch on another stream is still in flight; one call at a time per "
                   "communicator (synchronise the other stream first)");
    }
    if (q != cudaSuccess) (void)cudaGetLastError();  // e.g. recorded under capture: not knowable
  }
}

// A capture records nothing: an eager launch still in flight stays the one a launch from
// another stream must wait for.
void CommState::end_launch(cudaStream_t stream, bool capturing) {
  if (capturing) return;
  SWIFTQK_CUDA_TRY(cudaEventRecord(last_done, stream));
  last_stream = stream;
  has_last = true;
}

void CommState::quiesce() {
  DeviceGuard guard(device);
  if (has_last) SWIFTQK_CUDA_TRY(cudaEventSynchronize(last_done));
  if (world == 1) return;  // a group of one has no owner word in use
  // A kernel's waits are bounded by timeout_s, so whichever kernel still owns the rank ends
  // within about that long after its last wait began. After a failure the owner half may stay
  // set for good (a second kernel's claim, a block that never came: the rank stays claimed until
  // the clear), so then the wait is only that bound.
  const double bound = 2.0 * config.timeout_s + 1.0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(bound);
  for (;;) {
    SWIFTQK_CUDA_TRY(cudaMemcpyAsync(h_owner, &d_state->owner, sizeof(uint32_t),
                                     cudaMemcpyDeviceToHost, ctl_stream));
    SWIFTQK_CUDA_TRY(cudaStreamSynchronize(ctl_stream));
    if (*h_owner == 0u) return;
    if (std::chrono::steady_clock::now() >= deadline) {
      SWIFTQK_EXPECTS(h_failure->code != 0u, "communicator rank " + std::to_string(rank) +
                                                 ": a kernel of this communicator is still "
                                                 "running " +
                                                 std::to_string(bound) + " s later");
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void CommState::launch_probe(cudaStream_t stream, double timeout_s, uint64_t round) {
  *h_probe_ok = 1;
  SWIFTQK_CUDA_TRY(
      cudaMemcpyAsync(d_probe_ok, h_probe_ok, sizeof(int), cudaMemcpyHostToDevice, stream));
  probe_kernel<<<1, 32, 0, stream>>>(d_peers, local_ws, rank, world,
                                     probe_offset(world, config.token_capacity), round,
                                     static_cast<uint64_t>(timeout_s * 1e9), d_probe_ok);
  SWIFTQK_CUDA_TRY(cudaGetLastError());
  SWIFTQK_CUDA_TRY(
      cudaMemcpyAsync(h_probe_ok, d_probe_ok, sizeof(int), cudaMemcpyDeviceToHost, stream));
}

void CommState::barrier(const char* what, uint64_t round) {
  if (world == 1 || !p2p) return;  // no peer writes into this rank's memory
  DeviceGuard guard(device);
  // A peer may first have to wait out its own last kernel (quiesce's bound) before it arrives.
  const double bound = 2.0 * config.timeout_s + 1.0;
  launch_probe(ctl_stream, bound, round);
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(ctl_stream));
  const int ok = *h_probe_ok;
  SWIFTQK_EXPECTS(ok == 1, std::string(what) + ": communicator rank " + std::to_string(rank) +
                               ": rank " + std::to_string(-ok - 1) + " did not reach the " + what +
                               " barrier within " + std::to_string(bound) +
                               " s (every rank of the group must call " + what + ")");
}

void CommState::clear_exchange_state() {
  DeviceGuard guard(device);
  const int64_t cap = config.token_capacity;
  SWIFTQK_CUDA_TRY(cudaMemsetAsync(local_ws, 0, probe_offset(world, cap), ctl_stream));
  SWIFTQK_CUDA_TRY(cudaMemsetAsync(local_ws + fault_offset(world, cap), 0, 8, ctl_stream));
  SWIFTQK_CUDA_TRY(cudaMemsetAsync(d_state, 0, sizeof(CallState), ctl_stream));
  SWIFTQK_CUDA_TRY(cudaMemsetAsync(d_failure, 0, sizeof(FailureRecord), ctl_stream));
  mark_lamport_empty(local_ws, world, cap, ctl_stream);  // synchronises ctl_stream
  std::memset(h_failure, 0, sizeof(FailureRecord));
  has_last = false;
}

void CommState::open_nccl_exchange(const char* what) {
  DeviceGuard guard(device);
  if (h_nccl_abort == nullptr) {
    SWIFTQK_CUDA_TRY(
        cudaHostAlloc(reinterpret_cast<void**>(&h_nccl_abort), sizeof(int), cudaHostAllocMapped));
    SWIFTQK_CUDA_TRY(
        cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_nccl_abort), h_nccl_abort, 0));
  }
  {
    std::lock_guard<std::mutex> lock(nccl_mu);
    if (nccl_exchange != nullptr) ncclCommAbort(nccl_exchange);
    nccl_exchange = nullptr;
  }
  // A peer may first have to wait out its own last call (quiesce's bound) before it splits.
  ncclComm_t comm = split_nonblocking(nccl, rank, 2.0 * config.timeout_s + 1.0, what);
  {
    std::lock_guard<std::mutex> lock(nccl_mu);
    // Cleared only with a communicator to all-reduce on: a split that threw leaves the flag
    // as it was, and reset() then sets it.
    *h_nccl_abort = 0;
    nccl_exchange = comm;
  }
  if (!watchdog) watchdog = std::make_unique<Watchdog>();
}

RankArgs CommState::rank_args() const {
  RankArgs r{};
  r.peers = d_peers;
  r.local_ws = local_ws;
  r.state = d_state;
  r.failure = d_failure;
  r.host_failure = h_failure_dev;
  r.rank = rank;
  return r;
}

// P2P write test and barrier: thread j writes `round` into peer j's probe word for this rank,
// then every thread waits for peer j's word in the local workspace; *ok becomes -(j + 1) for a
// peer j whose word did not arrive.
__global__ void probe_kernel(uint8_t* const* peers, uint8_t* local, int rank, int world,
                             std::size_t probe_off, uint64_t round, uint64_t timeout_ns, int* ok) {
  const int j = threadIdx.x;
  if (j < world) {
    uint64_t* dst = reinterpret_cast<uint64_t*>(peers[j] + probe_off) + rank;
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(dst), "l"(round) : "memory");
  }
  bool arrived = j >= world;
  const uint64_t start = global_timer_ns();
  const uint64_t* src = reinterpret_cast<const uint64_t*>(local + probe_off) + j;
  while (!arrived) {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(src) : "memory");
    arrived = v == round;
    if (!arrived && global_timer_ns() - start > timeout_ns) break;
  }
  if (!arrived) atomicExch(ok, -(j + 1));
}

}  // namespace detail

using detail::CommState;
using detail::ConfigStamp;
using detail::DeviceGuard;

Communicator::Communicator(std::unique_ptr<CommState> state) : state_(std::move(state)) {}
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&& other) noexcept {
  if (this != &other) {
    close_quietly();
    state_ = std::move(other.state_);
  }
  return *this;
}
Communicator::~Communicator() { close_quietly(); }

void Communicator::close_quietly() noexcept {
  if (!state_ || state_->closed) return;
  try {
    close();
  } catch (const std::exception& e) {  // a destructor has no caller to tell
    std::fprintf(stderr, "swiftqk: %s\n", e.what());
  }
}

bool Communicator::closed() const { return state_->closed; }

void Communicator::close() {
  if (!state_ || state_->closed) return;
  CommState& s = *state_;
  if (s.local_group) {  // every rank is this process's: once its GPU is idle, nobody writes
    DeviceGuard guard(s.device);
    const cudaError_t e = cudaDeviceSynchronize();
    s.closed = true;
    s.release();
    SWIFTQK_CUDA_TRY(e);
    return;
  }
  try {
    const uint64_t round = s.reserve_rounds(1);
    s.quiesce();
    s.barrier("close", round);
  } catch (const Error& e) {
    // A peer may still write into this workspace: keep it allocated, unused, for good.
    static auto* kept = new std::vector<std::shared_ptr<detail::DeviceAllocations>>();
    static std::mutex kept_mu;
    {
      std::lock_guard<std::mutex> lock(kept_mu);
      kept->push_back(std::move(s.allocations));
    }
    s.closed = true;
    s.release();
    SWIFTQK_FAIL(std::string(e.what()) +
                 "; its workspace stays allocated, so that a late peer's writes land in memory "
                 "nothing else uses");
  }
  s.closed = true;
  s.release();
}

void Communicator::close_without_barrier() {
  if (!state_ || state_->closed) return;
  CommState& s = *state_;
  SWIFTQK_EXPECTS(!s.launched,
                  "close_without_barrier: communicator rank " + std::to_string(s.rank) +
                      " has launched, so a peer's kernel may still write into its workspace; "
                      "close() it, on every rank, instead");
  // No kernel of the group ran, and every peer's probe has returned (the caller's word): nothing
  // can write into this workspace, so close() has no peer to wait for.
  s.p2p = false;
  close();
}

int Communicator::rank() const { return state_->rank; }
int Communicator::world_size() const { return state_->world; }
bool Communicator::p2p() const { return state_->p2p; }
int Communicator::device() const { return state_->device; }
const CommConfig& Communicator::config() const { return state_->config; }
detail::CommState& Communicator::state() { return *state_; }
const detail::CommState& Communicator::state() const { return *state_; }

DeviceFailure Communicator::failure() const {
  const volatile detail::FailureRecord* h = state_->h_failure;
  DeviceFailure f;
  if (h == nullptr) return f;  // closed
  f.code = h->code;
  if (f.code == 0) return f;
  f.rank = h->rank;
  f.peer = h->peer;
  f.token = h->token;
  f.expected_tag = h->expected_tag;
  f.seen_tag = h->seen_tag;
  f.value = h->value;
  f.limit = h->limit;
  return f;
}

void Communicator::check_error() const {
  const DeviceFailure f = failure();
  if (f.code == 0) return;
  SWIFTQK_FAIL((f.code == 4 || f.code == 5 ? "SwiftQK epilogue found bad input: "
                                           : "SwiftQK exchange failed: ") +
               f.describe());
}

void Communicator::synchronize(cudaStream_t stream) const {
  DeviceGuard guard(state_->device);
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(stream));
  check_error();
}

void Communicator::reset() {
  CommState& s = *state_;
  SWIFTQK_EXPECTS(!s.closed, "reset: communicator rank " + std::to_string(s.rank) + " is closed");
  if (s.local_group) {
    // One process drives every rank: once each GPU is idle no kernel of the group runs, and no
    // other process or thread can write into the workspaces, so the whole group is cleared.
    std::lock_guard<std::mutex> lock(s.local_group->mu);
    for (CommState* m : s.local_group->members) {
      DeviceGuard guard(m->device);
      SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
    }
    for (CommState* m : s.local_group->members) m->clear_exchange_state();
    return;
  }
  if (!s.p2p && s.world > 1) {
    // Without P2P no peer writes into this rank's memory: once this rank's last call has
    // finished (an aborted all-reduce's kernel has ended), the record is cleared and every rank
    // splits a new exchange communicator from the caller's (collective, bounded by timeout_s: a
    // rank that does not reset makes it throw), whether or not its own was aborted, so that all
    // ranks' communicators match.
    s.quiesce();
    s.clear_exchange_state();
    try {
      s.open_nccl_exchange("reset");
    } catch (const Error& e) {
      // The old exchange communicator is aborted and no new one was split: the rank stays
      // failed (check_error() raises, a graph replay's scale writes NaN) rather than looking
      // healthy with nothing to all-reduce on.
      {
        std::lock_guard<std::mutex> lock(s.nccl_mu);
        detail::record_nccl_failure(s, detail::kFailNcclNoExchange, -1);
      }
      SWIFTQK_FAIL(std::string(e.what()) +
                   "; this rank has no NCCL communicator for its all-reduces: call reset() again "
                   "on every rank");
    }
    return;
  }
  // Quiesce, barrier, clear, barrier: after the first barrier no rank's kernel is running, so
  // nothing published before the reset can land after the clear; after the second, no rank
  // publishes the next call into a peer that has not cleared yet. The rounds are taken first:
  // a reset that throws (a peer missing at a barrier) still takes both, so after a failed reset
  // on some ranks, the next reset on every rank meets at the same rounds.
  const uint64_t round = s.reserve_rounds(2);
  s.quiesce();
  s.barrier("reset", round);
  s.clear_exchange_state();
  s.barrier("reset", round + 1);
}

bool Communicator::probe_peers(cudaStream_t stream) {
  CommState& s = *state_;
  SWIFTQK_EXPECTS(!s.closed,
                  "probe_peers: communicator rank " + std::to_string(s.rank) + " is closed");
  DeviceGuard guard(s.device);
  // Nothing here may synchronise the device: peers' probe kernels are spinning meanwhile.
  s.launch_probe(stream, s.config.timeout_s, s.reserve_rounds(1));
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(stream));
  return *s.h_probe_ok == 1;
}

namespace {
// Lets GPU `from` map GPU `to`'s memory (ranks of one process on distinct GPUs).
void enable_peer_access(int from, int to, const char* who) {
  int can = 0;
  SWIFTQK_CUDA_TRY(cudaDeviceCanAccessPeer(&can, from, to));
  SWIFTQK_EXPECTS(can, std::string(who) + ": GPU " + std::to_string(from) + " cannot access GPU " +
                           std::to_string(to) +
                           " (no P2P); use one process per GPU with the NCCL fallback");
  DeviceGuard guard(from);
  const cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
  } else {
    SWIFTQK_CUDA_TRY(e);
  }
}

// Identifies this process in handles: CUDA IPC cannot open memory of the calling process, so a
// peer in the same process (one thread per GPU, e.g. from_nccl in threads) is reached through
// its plain device address instead.
uint64_t process_nonce() {
  static const uint64_t nonce = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (static_cast<uint64_t>(getpid()) << 16) ^
           static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }();
  return nonce;
}
}  // namespace

std::vector<Communicator> Communicator::create_local_group(const std::vector<int>& devices,
                                                           const CommConfig& config) {
  const int world = static_cast<int>(devices.size());
  SWIFTQK_EXPECTS(world >= 1, "create_local_group: no devices given");
  int count = 0;
  SWIFTQK_CUDA_TRY(cudaGetDeviceCount(&count));
  for (int d : devices) {
    SWIFTQK_EXPECTS(d >= 0 && d < count, "create_local_group: device " + std::to_string(d) +
                                             " does not exist (" + std::to_string(count) +
                                             " visible)");
  }
  // Distinct GPUs of one process reach each other through peer access.
  for (int a : devices) {
    for (int b : devices) {
      if (a == b) continue;
      enable_peer_access(a, b, "create_local_group");
    }
  }
  auto allocations = std::make_shared<detail::DeviceAllocations>();
  auto local = std::make_shared<detail::LocalGroup>();
  std::vector<std::unique_ptr<CommState>> states;
  std::vector<uint8_t*> table;
  for (int r = 0; r < world; ++r) {
    auto s = std::make_unique<CommState>();
    s->rank = r;
    s->world = world;
    s->device = devices[r];
    s->config = config;
    s->allocations = allocations;
    s->ranks_on_device = static_cast<int>(std::count(devices.begin(), devices.end(), devices[r]));
    s->allocate_local();
    s->local_group = local;
    local->members.push_back(s.get());
    table.push_back(s->local_ws);
    states.push_back(std::move(s));
  }
  std::vector<Communicator> comms;
  for (auto& s : states) {
    s->peers = table;
    s->upload_peers();
    comms.emplace_back(Communicator(std::move(s)));
  }
  return comms;
}

// ---- IPC two-phase bootstrap ----

namespace {
constexpr uint32_t kHandleMagic = 0x5157534bu;  // "KSWQ"
constexpr uint32_t kHandleVersion = 3;

struct HandleBlob {
  uint32_t magic;
  uint32_t version;
  int32_t rank;
  int32_t world;
  ConfigStamp stamp;  // what every rank's CommConfig must agree on
  uint64_t workspace_bytes;
  uint64_t process;  // process_nonce() of the creating process
  uint64_t address;  // the workspace's device address there
  int32_t device;    // and its GPU there
  int32_t reserved;
  cudaIpcMemHandle_t handle;
};
// The handles of a group of `world`, ordered by rank, each checked for what it must be; then the
// ranks' configurations must agree (every rank that disagrees throws, before any later step).
std::vector<HandleBlob> parse_handles(const std::vector<std::vector<uint8_t>>& handles, int world,
                                      int my_rank, const CommConfig& config,
                                      const std::string& who) {
  SWIFTQK_EXPECTS(static_cast<int>(handles.size()) == world,
                  who + ": got " + std::to_string(handles.size()) + " handles for a group of " +
                      std::to_string(world));
  std::vector<HandleBlob> blobs(handles.size());
  std::vector<ConfigStamp> stamps;
  for (int r = 0; r < world; ++r) {
    const std::string h = who + ": handle " + std::to_string(r);
    SWIFTQK_EXPECTS(handles[r].size() == sizeof(HandleBlob), h + " has the wrong size");
    HandleBlob& b = blobs[r];
    std::memcpy(&b, handles[r].data(), sizeof b);
    SWIFTQK_EXPECTS(b.magic == kHandleMagic && b.version == kHandleVersion,
                    h + " is not a SwiftQK handle of this version");
    SWIFTQK_EXPECTS(b.rank == r, h + " belongs to rank " + std::to_string(b.rank) +
                                     " (handles must be ordered by rank)");
    SWIFTQK_EXPECTS(b.world == world, h + " is for a group of " + std::to_string(b.world) +
                                          " ranks, this one has " + std::to_string(world));
    stamps.push_back(b.stamp);
  }
  detail::check_stamps_agree(stamps, detail::stamp_of(config), my_rank, who);
  return blobs;
}
}  // namespace

IpcBootstrap::IpcBootstrap(int rank, int world_size, int device, const CommConfig& config)
    : state_(std::make_unique<CommState>()) {
  state_->rank = rank;
  state_->world = world_size;
  state_->device = device;
  state_->config = config;
  state_->allocate_local();
}

IpcBootstrap::~IpcBootstrap() = default;

std::vector<uint8_t> IpcBootstrap::local_handle() const {
  SWIFTQK_EXPECTS(state_ != nullptr, "IpcBootstrap: already connected");
  HandleBlob b{};
  b.magic = kHandleMagic;
  b.version = kHandleVersion;
  b.rank = state_->rank;
  b.world = state_->world;
  b.stamp = detail::stamp_of(state_->config);
  b.workspace_bytes = workspace_bytes(state_->world, state_->config.token_capacity);
  b.process = process_nonce();
  b.address = reinterpret_cast<uint64_t>(state_->local_ws);
  b.device = state_->device;
  DeviceGuard guard(state_->device);
  SWIFTQK_CUDA_TRY(cudaIpcGetMemHandle(&b.handle, state_->local_ws));
  std::vector<uint8_t> bytes(sizeof b);
  std::memcpy(bytes.data(), &b, sizeof b);
  return bytes;
}

Communicator IpcBootstrap::connect(const std::vector<std::vector<uint8_t>>& handles) {
  SWIFTQK_EXPECTS(state_ != nullptr, "IpcBootstrap: already connected");
  CommState& s = *state_;
  const std::vector<HandleBlob> blobs =
      parse_handles(handles, s.world, s.rank, s.config, "IpcBootstrap::connect");
  DeviceGuard guard(s.device);
  s.peers.assign(s.world, nullptr);
  for (int r = 0; r < s.world; ++r) {
    const HandleBlob& b = blobs[r];
    if (r == s.rank) {
      s.peers[r] = s.local_ws;
      continue;
    }
    if (b.process == process_nonce() && b.device == s.device) ++s.ranks_on_device;
    if (b.process == process_nonce()) {  // a rank of this process: no IPC mapping needed
      if (b.device != s.device) enable_peer_access(s.device, b.device, "IpcBootstrap::connect");
      s.peers[r] = reinterpret_cast<uint8_t*>(b.address);
      continue;
    }
    void* p = nullptr;
    SWIFTQK_CUDA_TRY(cudaIpcOpenMemHandle(&p, b.handle, cudaIpcMemLazyEnablePeerAccess));
    s.ipc_opened.push_back(p);
    s.peers[r] = static_cast<uint8_t*>(p);
  }
  s.upload_peers();
  return Communicator(std::move(state_));
}

Communicator IpcBootstrap::without_peers() {
  SWIFTQK_EXPECTS(state_ != nullptr, "IpcBootstrap: already connected");
  CommState& s = *state_;
  s.peers.assign(s.world, nullptr);
  s.peers[s.rank] = s.local_ws;
  s.upload_peers();
  return Communicator(std::move(state_));
}

// ---- NCCL bootstrap ----

Communicator Communicator::from_nccl(ncclComm_t nccl, const CommConfig& config,
                                     cudaStream_t stream) {
  SWIFTQK_EXPECTS(nccl != nullptr, "from_nccl: the NCCL communicator is null");
  int rank = 0, world = 0, device = 0;
  SWIFTQK_NCCL_TRY(ncclCommUserRank(nccl, &rank));
  SWIFTQK_NCCL_TRY(ncclCommCount(nccl, &world));
  SWIFTQK_NCCL_TRY(ncclCommCuDevice(nccl, &device));
  IpcBootstrap boot(rank, world, device, config);
  const std::vector<uint8_t> mine = boot.local_handle();
  const std::size_t n = mine.size();
  DeviceGuard guard(device);
  uint8_t* d_buf = nullptr;
  SWIFTQK_CUDA_TRY(cudaMalloc(&d_buf, n * (world + 1)));
  SWIFTQK_CUDA_TRY(cudaMemcpyAsync(d_buf, mine.data(), n, cudaMemcpyHostToDevice, stream));
  SWIFTQK_NCCL_TRY(ncclAllGather(d_buf, d_buf + n, n, ncclUint8, nccl, stream));
  std::vector<uint8_t> all(n * world);
  SWIFTQK_CUDA_TRY(
      cudaMemcpyAsync(all.data(), d_buf + n, n * world, cudaMemcpyDeviceToHost, stream));
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(stream));
  SWIFTQK_CUDA_TRY(cudaFree(d_buf));
  std::vector<std::vector<uint8_t>> handles(world);
  for (int r = 0; r < world; ++r) handles[r].assign(all.begin() + r * n, all.begin() + (r + 1) * n);
  // Ranks that disagree on their configuration throw here, all of them, whether or not P2P
  // follows: on the NCCL path they would issue mismatched all-reduces that never complete.
  parse_handles(handles, world, rank, config, "from_nccl");

  // Every rank learns whether every rank could map its peers, then whether every write arrived:
  // the group takes the fused kernel only if all of them can.
  int* d_flag = nullptr;
  SWIFTQK_CUDA_TRY(cudaMalloc(&d_flag, sizeof(int)));
  auto all_agree = [&](bool mine) {
    const int v = mine ? 1 : 0;
    int agreed = 0;
    SWIFTQK_CUDA_TRY(cudaMemcpyAsync(d_flag, &v, sizeof(int), cudaMemcpyHostToDevice, stream));
    SWIFTQK_NCCL_TRY(ncclAllReduce(d_flag, d_flag, 1, ncclInt32, ncclMin, nccl, stream));
    SWIFTQK_CUDA_TRY(cudaMemcpyAsync(&agreed, d_flag, sizeof(int), cudaMemcpyDeviceToHost, stream));
    SWIFTQK_CUDA_TRY(cudaStreamSynchronize(stream));
    return agreed == 1;
  };
  std::string reason;
  std::optional<Communicator> opened;
  if (config.use_p2p) {
    try {
      opened.emplace(boot.connect(handles));
    } catch (const Error& e) {  // e.g. no P2P between these GPUs, or IPC not permitted
      reason = std::string("its peers could not be mapped (") + e.what() + ")";
    }
  } else {
    reason = "CommConfig::use_p2p is false";
  }
  bool p2p = all_agree(opened.has_value());  // also the barrier: all peers mapped before writes
  if (p2p) {
    const bool arrived = opened->probe_peers(stream);
    if (!arrived) reason = "the P2P write test timed out: peer writes did not arrive";
    p2p = all_agree(arrived);
  }
  SWIFTQK_CUDA_TRY(cudaFree(d_flag));
  if (!p2p && reason.empty()) reason = "another rank could not reach its peers";
  Communicator comm = opened ? std::move(*opened) : boot.without_peers();
  comm.state().nccl = nccl;
  comm.state().p2p = p2p;
  // Every rank takes the fallback alike (all_agree), so every rank splits.
  if (!p2p && world > 1) comm.state().open_nccl_exchange("from_nccl");
  if (!p2p) {
    std::fprintf(stderr,
                 "swiftqk: rank %d of %d: %s; the fused kernel cannot run on this group, so "
                 "launches exchange their partial sums through NCCL (one all-reduce)\n",
                 rank, world, reason.c_str());
  }
  return comm;
}

}  // namespace swiftqk
