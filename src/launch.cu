// Host side of a QK-norm launch: the checks, then the NCCL paths, or the plan
// (make_launch_plan) and one fused kernel launch per chunk of it.
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "baselines/nccl_baselines.hpp"
#include "comm_state.hpp"
#include "cuda_check.hpp"
#include "device_query.hpp"
#include "kernel_table.hpp"
#include "kernels/swiftqk_fused.cuh"
#include "launch_plan.hpp"
#include "nccl_allreduce_fallback.hpp"
#include "swiftqk/communicator.hpp"

namespace swiftqk {

namespace {

using detail::can_launch_pdl;
using detail::KernelFn;
using detail::LaunchArgs;
using detail::max_blocks_per_sm;
using detail::sm_count;

template <typename T>
const T* advance(const void* p, int64_t elems, std::size_t size) {
  return reinterpret_cast<const T*>(static_cast<const uint8_t*>(p) + elems * size);
}

}  // namespace

detail::RankArgs detail::rank_args_for(const detail::CommState& s, const QkNormParams& p,
                                       int64_t first_token) {
  detail::RankArgs r = s.rank_args();
  const std::size_t is = dtype_size(p.in_dtype), os = dtype_size(output_dtype_for(p.in_dtype));
  r.q_in = advance<uint8_t>(p.q.in, first_token * p.q.in_stride, is);
  r.k_in = advance<uint8_t>(p.k.in, first_token * p.k.in_stride, is);
  r.q_out = const_cast<uint8_t*>(advance<uint8_t>(p.q.out, first_token * p.q.out_stride, os));
  r.k_out = const_cast<uint8_t*>(advance<uint8_t>(p.k.out, first_token * p.k.out_stride, os));
  r.q_w = p.q.weight;
  r.k_w = p.k.weight;
  r.q_in_stride = p.q.in_stride;
  r.q_out_stride = p.q.out_stride;
  r.k_in_stride = p.k.in_stride;
  r.k_out_stride = p.k.out_stride;
  r.q_in_scale = p.q.in_scale;
  r.k_in_scale = p.k.in_scale;
  r.rstd_out = p.rstd_out == nullptr ? nullptr : p.rstd_out + 2 * first_token;
  return r;
}

namespace {

// Every rank in one launch must agree on what the kernel treats as launch-wide.
void check_group_agrees(const std::vector<Communicator*>& comms,
                        const std::vector<QkNormParams>& params) {
  const QkNormParams& p0 = params[0];
  const detail::CommState& s0 = comms[0]->state();
  for (std::size_t i = 0; i < comms.size(); ++i) {
    const QkNormParams& p = params[i];
    const detail::CommState& s = comms[i]->state();
    const std::string who = "launch_qk_norm_group: rank slot " + std::to_string(i);
    SWIFTQK_EXPECTS(s.world == s0.world, who + " belongs to a group of another size");
    SWIFTQK_EXPECTS(s.device == s0.device, who +
                                               " is on another GPU; a group launch serves "
                                               "virtual ranks of one GPU");
    SWIFTQK_EXPECTS(s.config.token_capacity == s0.config.token_capacity,
                    who + " has another token_capacity");
    SWIFTQK_EXPECTS(
        p.tokens == p0.tokens && p.q_full_width == p0.q_full_width &&
            p.k_full_width == p0.k_full_width && p.in_dtype == p0.in_dtype && p.order == p0.order &&
            p.eps == p0.eps && p.method == p0.method && p.pdl == p0.pdl && p.tuning == p0.tuning &&
            p.deterministic == p0.deterministic,
        who +
            " differs from slot 0 in tokens, full widths, dtype, order, eps, method, pdl, tuning "
            "or deterministic");
    SWIFTQK_EXPECTS(s.peers == s0.peers,
                    who + " belongs to another group (its peer table differs from slot 0's)");
    for (std::size_t j = 0; j < i; ++j) {
      SWIFTQK_EXPECTS(
          comms[j]->state().rank != s.rank,
          who + " repeats rank " + std::to_string(s.rank) + " of slot " + std::to_string(j));
    }
  }
}

// Everything a launch checks before it plans: the communicators, each rank's parameters (which
// throw and write nothing), earlier failures, and that the ranks agree.
void check_launch(const std::vector<Communicator*>& comms,
                  const std::vector<QkNormParams>& params) {
  SWIFTQK_EXPECTS(!comms.empty(), "launch: no communicator given");
  SWIFTQK_EXPECTS(comms.size() == params.size(), "launch: one QkNormParams per communicator");
  SWIFTQK_EXPECTS(static_cast<int>(comms.size()) <= detail::kMaxRanksPerLaunch,
                  "launch_qk_norm_group: at most " + std::to_string(detail::kMaxRanksPerLaunch) +
                      " ranks per launch");
  for (Communicator* c : comms) {
    SWIFTQK_EXPECTS(c != nullptr, "launch: null communicator");
    SWIFTQK_EXPECTS(!c->closed(),
                    "launch: communicator rank " + std::to_string(c->rank()) + " is closed");
  }
  const int world = comms[0]->world_size();
  for (std::size_t i = 0; i < comms.size(); ++i) {
    validate_params(params[i], world);
    comms[i]->check_error();
  }
  check_group_agrees(comms, params);
}

// The kernel of a chunk: the call fixes the dtype, method, norm order and vector path, the plan
// the vectors per thread and the chunk's orders.
struct KernelPicker {
  DType dtype;
  detail::KernelKey key;
  KernelFn of(const KernelShape& shape, const ChunkOrders& orders) const {
    detail::KernelKey k = key;
    k.vpt = shape.vectors_per_thread;
    k.det_lanes = shape.det_lanes;
    k.slots = orders.slots;
    k.blocks = orders.blocks;
    const KernelFn f = detail::pick_kernel(dtype, k);
    SWIFTQK_EXPECTS(f != nullptr, "launch: no kernel for this dtype and mode");
    return f;
  }
};

// What make_launch_plan asks of a kernel it weighs: its shared memory (the kernel's own formula)
// and its residency on this device.
struct FootprintOnDevice {
  const KernelPicker& kernels;
  int64_t row_vectors;  // vectors (or scalar elements) of one rank's Q and K row
  std::size_t weight_bytes;
  int device;
  KernelFootprint operator()(const KernelCandidate& c) const {
    KernelFootprint f;
    if (c.shape.vectors_per_thread > 0) {
      f.smem_bytes = detail::staged_smem_bytes(row_vectors, c.shape.tokens_per_block, weight_bytes,
                                               c.depth.stages, c.shape.vec_bytes);
    }
    f.blocks_per_sm =
        max_blocks_per_sm(reinterpret_cast<const void*>(kernels.of(c.shape, c.orders)),
                          c.shape.block_threads(), f.smem_bytes, device);
    return f;
  }
};

// The vector access of a group launch (choose_vector_bytes), from the narrowest that a rank's
// rows allow. The call's token count stands for its launches': a call of few tokens is one
// launch, or chunks of fewer tokens still.
int launch_vector_bytes(const std::vector<QkNormParams>& params, int world) {
  const QkNormParams& p0 = params[0];
  int allowed = 16;
  for (const QkNormParams& p : params) allowed = std::min(allowed, vector_bytes_for(p));
  const int in_size = static_cast<int>(dtype_size(p0.in_dtype));
  const int64_t row_bytes = (p0.q_full_width + p0.k_full_width) / world * in_size;
  return choose_vector_bytes(in_size, allowed, world,
                             p0.method == Method::kSwiftQK && !p0.deterministic,
                             p0.tuning.vector_bytes, p0.tokens, row_bytes);
}

// What the policy reads of a group launch.
LaunchRequest request_of(const std::vector<QkNormParams>& params, const detail::CommState& s0,
                         int world) {
  const QkNormParams& p0 = params[0];
  const int vec_bytes = launch_vector_bytes(params, world);
  LaunchRequest r;
  r.world = world;
  r.ranks = static_cast<int>(params.size());
  r.tokens = p0.tokens;
  r.q_full_width = p0.q_full_width;
  r.k_full_width = p0.k_full_width;
  r.vec_elems = vec_bytes > 1 ? static_cast<int>(vec_bytes / dtype_size(p0.in_dtype)) : 1;
  r.vec_bytes = vec_bytes > 1 ? vec_bytes : 16;
  r.out_elem_bytes = static_cast<int>(dtype_size(output_dtype_for(p0.in_dtype)));
  r.token_capacity = s0.config.token_capacity;
  r.sm_count = sm_count(s0.device);
  r.sm_budget = s0.config.sm_budget;
  r.ranks_on_device = s0.ranks_on_device;
  r.tuning = p0.tuning;
  r.deterministic = p0.deterministic;
  return r;
}

// The kernel arguments every chunk shares; each chunk then sets its tokens, hash, grid and ranks.
LaunchArgs launch_args_of(const LaunchPlan& plan, const QkNormParams& p0,
                          const detail::CommState& s0, int world) {
  LaunchArgs a{};
  a.world = world;
  a.group_threads = plan.shape.group_threads;
  a.tokens_per_block = plan.shape.tokens_per_block;
  a.stages = plan.depth.stages;
  a.defer = plan.depth.defer;
  a.order = static_cast<int>(p0.order);
  a.q_width = p0.q_full_width / world;
  a.k_width = p0.k_full_width / world;
  a.capacity = s0.config.token_capacity;
  a.q_inv_full = 1.0f / static_cast<float>(p0.q_full_width);
  a.k_inv_full = 1.0f / static_cast<float>(p0.k_full_width);
  a.eps = p0.eps;
  a.timeout_ns = static_cast<uint64_t>(s0.config.timeout_s * 1e9);  // validated: <= 3.6e12
  a.det_q_slots = plan.det_q_slots;
  return a;
}

// One call of the NCCL paths: a baseline method, or a fused method on a group without P2P.
void launch_nccl_path(Communicator& comm, const QkNormParams& p, cudaStream_t stream) {
  std::unique_lock<std::mutex> lock(comm.state().launch_mutex);
  const bool capturing = detail::stream_capturing(stream);
  comm.state().begin_launch(stream, capturing);
  // Ended also when the call throws after enqueuing (the fallback's final check_error throws
  // once its all-reduce was aborted, behind its kernels).
  Communicator* const one = &comm;
  detail::LaunchEnd end(&one, 1, stream, capturing);
  if (uses_nccl(p.method)) {
    detail::launch_nccl_baseline(comm, p, stream);
  } else {
    detail::launch_nccl_allreduce_fallback(comm, p, stream);
  }
  end.done();
}

void launch_impl(const std::vector<Communicator*>& comms, const std::vector<QkNormParams>& params,
                 cudaStream_t stream) {
  check_launch(comms, params);
  const QkNormParams& p0 = params[0];
  const detail::CommState& s0 = comms[0]->state();
  const int world = s0.world;
  if (p0.tokens == 0) return;  // nothing to exchange; the call counter stays put on every rank
  // A group without working P2P (from_nccl) exchanges the fused methods' partials through NCCL.
  if (uses_nccl(p0.method) || !s0.p2p) {
    SWIFTQK_EXPECTS(comms.size() == 1, "launch: method " + to_string(p0.method) +
                                           " runs one rank per launch (NCCL needs one GPU per "
                                           "rank); use launch_qk_norm");
    return launch_nccl_path(*comms[0], p0, stream);
  }
  SWIFTQK_EXPECTS(p0.tokens <= s0.config.token_capacity || s0.config.chunk_oversize,
                  "launch: " + std::to_string(p0.tokens) + " tokens exceed the workspace's " +
                      std::to_string(s0.config.token_capacity) +
                      " (CommConfig.token_capacity) and chunk_oversize is off");

  detail::DeviceGuard guard(s0.device);
  const LaunchRequest req = request_of(params, s0, world);
  KernelPicker kernels{p0.in_dtype, {}};
  kernels.key.vec_bytes = req.vec_elems > 1 ? req.vec_bytes : 1;
  kernels.key.method = p0.method;
  kernels.key.order = p0.order;
  kernels.key.alone = world == 1;
  kernels.key.deterministic = p0.deterministic;
  const int64_t qw = p0.q_full_width / world, kw = p0.k_full_width / world;
  const FootprintOnDevice footprint{
      kernels, qw / req.vec_elems + kw / req.vec_elems,
      static_cast<std::size_t>(qw + kw) * dtype_size(output_dtype_for(p0.in_dtype)), s0.device};
  // By reference: the callback then holds one pointer and copies nothing.
  const LaunchPlan plan = make_launch_plan(req, std::cref(footprint));

  LaunchArgs a = launch_args_of(plan, p0, s0, world);
  // Every instantiation comes from one build: one of them answers for all.
  const bool pdl =
      p0.pdl &&
      can_launch_pdl(reinterpret_cast<const void*>(kernels.of(plan.shape, plan.chunk(0).orders)),
                     s0.device);
  a.pdl = pdl ? 1 : 0;

  const bool capturing = detail::stream_capturing(stream);
  std::vector<std::unique_lock<std::mutex>> locks;
  for (Communicator* c : comms) {
    locks.emplace_back(c->state().launch_mutex);
    c->state().begin_launch(stream, capturing);
  }
  // A chunk's launch that throws leaves the chunks before it enqueued: the launch ends anyway.
  detail::LaunchEnd end(comms.data(), comms.size(), stream, capturing);
  for (int64_t i = 0; i < plan.chunks; ++i) {
    const ChunkPlan c = plan.chunk(i);
    a.tokens = c.tokens;
    // The chunk's token count is hashed too: a peer called with another token count must not
    // lend its partials to this call's first tokens (every token then times out, naming it).
    // A rank in the deterministic mode never lends its partials to one that is not.
    a.config_hash = config_hash(p0.q_full_width, p0.k_full_width, world, p0.eps,
                                static_cast<int>(p0.order), c.tokens) ^
                    (p0.deterministic ? kDeterministicHashSalt : 0u);
    a.blocks_per_rank = c.grid.blocks_per_rank;
    for (std::size_t r = 0; r < comms.size(); ++r) {
      a.r[r] = detail::rank_args_for(comms[r]->state(), params[r], c.first_token);
    }
    detail::launch_kernel(kernels.of(plan.shape, c.orders), c.grid.grid(),
                          plan.shape.block_threads(), plan.smem_bytes, stream, a, pdl);
  }
  end.done();
}

}  // namespace

void launch_qk_norm(Communicator& comm, const QkNormParams& p, cudaStream_t stream) {
  launch_impl({&comm}, {p}, stream);
}

void launch_qk_norm_group(const std::vector<Communicator*>& comms,
                          const std::vector<QkNormParams>& params, cudaStream_t stream) {
  launch_impl(comms, params, stream);
}

}  // namespace swiftqk
