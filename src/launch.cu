// Host side of a QK-norm launch: checks, chunking by workspace capacity, kernel choice, grid.
#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "comm_state.hpp"
#include "cuda_check.hpp"
#include "kernel_table.hpp"
#include "kernels/swiftqk_fused.cuh"
#include "launch_plan.hpp"
#include "swiftqk/communicator.hpp"

namespace swiftqk {

namespace {

using detail::KernelFn;
using detail::LaunchArgs;

// A device attribute, asked once per attribute and device (launches are on the hot path).
int device_attribute(cudaDeviceAttr what, int device) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(static_cast<int>(what), device);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int v = 0;
  SWIFTQK_CUDA_TRY(cudaDeviceGetAttribute(&v, what, device));
  cache[key] = v;
  return v;
}

int sm_count(int device) { return device_attribute(cudaDevAttrMultiProcessorCount, device); }

// A kernel's attributes on a device (the caller has made it current), asked once per kernel and
// device: static shared memory and the PTX version of the code the device runs.
cudaFuncAttributes func_attributes(KernelFn fn, int device) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, cudaFuncAttributes> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(reinterpret_cast<const void*>(fn), device);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  cudaFuncAttributes attr;
  SWIFTQK_CUDA_TRY(cudaFuncGetAttributes(&attr, fn));
  cache[key] = attr;
  return attr;
}

// Whether `fn` may be launched with programmatic dependent launch on `device`: the device must
// be sm_90 or later AND the code it runs must have been compiled for sm_90 or later, since only
// that code holds the kernel's griddepcontrol.wait. (A build for sm_80 alone runs on an H100 or
// H200 as PTX compiled at load time, __CUDA_ARCH__ 800, without the wait: launched with PDL it
// would read its inputs before the previous kernel had written them.)
bool can_launch_pdl(KernelFn fn, int device) {
  return device_attribute(cudaDevAttrComputeCapabilityMajor, device) >= 9 &&
         func_attributes(fn, device).ptxVersion >= 90;
}

// Occupancy, asked once per kernel, block size, shared memory and device. The first time a
// kernel is seen on a device its dynamic shared-memory limit is raised to the device's maximum,
// once, so every later launch of it (any row length) is allowed.
int max_blocks_per_sm(KernelFn fn, int block, std::size_t smem, int device) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, std::size_t, int>, int> cache;
  static std::map<std::pair<const void*, int>, std::size_t> limit;
  std::lock_guard<std::mutex> lock(mu);
  const void* f = reinterpret_cast<const void*>(fn);
  const auto key = std::make_tuple(f, block, smem, device);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto lim = limit.find({f, device});
  if (lim == limit.end()) {
    const std::size_t dynamic_max =
        device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device) -
        func_attributes(fn, device).sharedSizeBytes;
    SWIFTQK_CUDA_TRY(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(dynamic_max)));
    lim = limit.emplace(std::make_pair(f, device), dynamic_max).first;
  }
  SWIFTQK_EXPECTS(smem <= lim->second, "launch: a row needs " + std::to_string(smem) +
                                           " bytes of shared memory; the device allows " +
                                           std::to_string(lim->second));
  int n = 0;
  SWIFTQK_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, block, smem));
  cache[key] = n;
  return n;
}

// SWIFTQK_STAGES and SWIFTQK_DEFER, which override the stages and deferral depth for tuning runs
// (0 = not set).
PipelineDepth forced_pipeline_depth() {
  static const int stages =
      tuning_override("SWIFTQK_STAGES", kMinStages, kMaxStages, "a stage depth");
  static const int defer = tuning_override("SWIFTQK_DEFER", 1, kMaxStages - 1, "a deferral depth");
  return PipelineDepth{stages, defer};
}

// Vectors per thread of staged rows; SWIFTQK_VPT (1, 2, 4 or 8) forces them, for tuning runs.
int forced_vectors_per_thread() {
  static const int forced = [] {
    const int v = tuning_override("SWIFTQK_VPT", 1, kMaxVectorsPerThread, "vectors per thread");
    SWIFTQK_EXPECTS(v == 0 || (v & (v - 1)) == 0, "SWIFTQK_VPT must be 1, 2, 4 or 8");
    return v;
  }();
  return forced;
}

// The block order of a launch (choose_block_order); SWIFTQK_BLOCK_ORDER forces it for tuning
// runs (1 rank-major, 2 interleaved) when the launch serves several ranks: one rank has one order.
BlockOrder block_order(int ranks, int64_t tokens) {
  static const int forced = tuning_override("SWIFTQK_BLOCK_ORDER", 1, 2, "a block order");
  if (forced != 0 && ranks > 1) {
    return forced == 1 ? BlockOrder::kRankMajor : BlockOrder::kInterleaved;
  }
  return choose_block_order(ranks, tokens);
}

// Threads per block the shape aims at; SWIFTQK_BLOCK_THREADS overrides it, for tuning runs.
int block_threads_target(int world) {
  static const int forced = tuning_override("SWIFTQK_BLOCK_THREADS", 32, 1024, "a thread count");
  if (forced != 0) return forced;
  return world == 1 ? kDefaultBlockThreadsAlone : kDefaultBlockThreads;
}

// One launch of a fused kernel, with the programmatic-serialization attribute when asked (the
// kernel's griddepcontrol.wait then orders it after the previous kernel's memory operations).
void launch_fused(KernelFn fn, dim3 grid, int block, std::size_t smem, cudaStream_t stream,
                  const LaunchArgs& a, bool pdl) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  SWIFTQK_CUDA_TRY(cudaLaunchKernelEx(&cfg, fn, a));
}

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
            p.eps == p0.eps && p.method == p0.method && p.pdl == p0.pdl,
        who + " differs from slot 0 in tokens, full widths, dtype, order, eps, method or pdl");
    SWIFTQK_EXPECTS(s.peers == s0.peers,
                    who + " belongs to another group (its peer table differs from slot 0's)");
    for (std::size_t j = 0; j < i; ++j) {
      SWIFTQK_EXPECTS(
          comms[j]->state().rank != s.rank,
          who + " repeats rank " + std::to_string(s.rank) + " of slot " + std::to_string(j));
    }
  }
}

void launch_impl(const std::vector<Communicator*>& comms, const std::vector<QkNormParams>& params,
                 cudaStream_t stream) {
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
  const QkNormParams& p0 = params[0];
  const detail::CommState& s0 = comms[0]->state();
  const int ranks = static_cast<int>(comms.size());
  if (p0.tokens == 0) return;  // nothing to exchange; the call counter stays put on every rank
  // A group without working P2P (from_nccl) exchanges the fused methods' partials through NCCL.
  const bool nccl_fallback = !s0.p2p && !uses_nccl(p0.method);
  if (uses_nccl(p0.method) || nccl_fallback) {
    SWIFTQK_EXPECTS(comms.size() == 1, "launch: method " + to_string(p0.method) +
                                           " runs one rank per launch (NCCL needs one GPU per "
                                           "rank); use launch_qk_norm");
    QkNormParams p = p0;
    if (nccl_fallback) p.method = Method::kMiniMaxEager;
    std::unique_lock<std::mutex> lock(comms[0]->state().launch_mutex);
    const bool capturing = detail::stream_capturing(stream);
    comms[0]->state().begin_launch(stream, capturing);
    detail::launch_nccl_baseline(*comms[0], p, stream);
    comms[0]->state().end_launch(stream, capturing);
    return;
  }

  const int64_t cap = s0.config.token_capacity;
  SWIFTQK_EXPECTS(p0.tokens <= cap || s0.config.chunk_oversize,
                  "launch: " + std::to_string(p0.tokens) + " tokens exceed the workspace's " +
                      std::to_string(cap) +
                      " (CommConfig.token_capacity) and chunk_oversize is off");

  bool vector_path = true;
  for (const QkNormParams& p : params) vector_path = vector_path && vector_bytes_for(p) == 16;
  const int vec = vector_path ? static_cast<int>(16 / dtype_size(p0.in_dtype)) : 1;
  const int64_t qw = p0.q_full_width / world, kw = p0.k_full_width / world;
  const int64_t per_launch = std::min(cap, kMaxLaunchTokens);
  const int block_target = block_threads_target(world);
  const int forced_vpt = forced_vectors_per_thread();

  detail::DeviceGuard guard(s0.device);
  const int sms = sm_count(s0.device);
  // Ranks of a local group launched apart (each on its own stream) must all fit the GPU at once:
  // a launch serving fewer of them than share this GPU takes its share of the budget.
  const int budget = [&] {
    const int on_device = s0.ranks_on_device;
    if (ranks >= on_device) return s0.config.sm_budget;
    const int base = s0.config.sm_budget == 0 ? sms : std::min(s0.config.sm_budget, sms);
    return std::max(1, base * ranks / on_device);
  }();
  // Every launch but the last covers per_launch tokens: the first one's count picks the depth.
  const int64_t launch_tokens = std::min(per_launch, p0.tokens);
  // A chunk's slot order and block order. The slot order, like the hash, follows the chunk's
  // token count: every rank derives it from the hashed values alone (choose_slot_layout).
  // Virtual ranks' blocks interleave from kInterleaveMinTokens tokens (choose_block_order).
  struct Orders {
    SlotLayout slots;
    BlockOrder blocks;
  };
  auto orders_of = [&](int64_t chunk) {
    return Orders{choose_slot_layout(world, p0.q_full_width, p0.k_full_width, chunk),
                  block_order(ranks, chunk)};
  };
  // The chunks are launch_tokens long but the last, so at most two pairs of orders occur.
  const int64_t last_chunk = p0.tokens - (p0.tokens - 1) / per_launch * per_launch;
  const Orders used[2] = {orders_of(launch_tokens), orders_of(last_chunk)};
  // A layout with its pipeline, kernels (one per pair of orders the chunks use, picked per
  // chunk), shared memory and residency.
  struct Layout {
    PipelineDepth depth;
    KernelShape shape;
    KernelFn fn[2][2];  // [SlotLayout][BlockOrder], those of `used`
    std::size_t smem;
    int occ;
    KernelFn& of(const Orders& o) {
      return fn[static_cast<int>(o.slots)][static_cast<int>(o.blocks)];
    }
  };
  auto layout_of = [&](const PipelineDepth& depth, const KernelShape& shape) {
    Layout l{depth, shape, {}, 0, 0};
    for (const Orders& o : used) {
      detail::KernelKey key;
      key.vector_path = vector_path;
      key.vpt = shape.vectors_per_thread;
      key.method = p0.method;
      key.order = p0.order;
      key.alone = world == 1;
      key.slots = o.slots;
      key.blocks = o.blocks;
      KernelFn& f = l.of(o);
      f = detail::pick_kernel(p0.in_dtype, key);
      SWIFTQK_EXPECTS(f != nullptr, "launch: unknown dtype");
    }
    if (shape.vectors_per_thread > 0) {
      l.smem = detail::staged_smem_bytes(qw / vec + kw / vec, shape.tokens_per_block,
                                         (qw + kw) * dtype_size(output_dtype_for(p0.in_dtype)),
                                         depth.stages);
    }
    // The grid must fit the residency of each kernel the chunks take (instantiations of one
    // kernel; asking also sets each one's shared-memory limit before its first launch). Usually
    // there is one: the occupancy cache is asked once per layout, not once per kernel.
    l.occ = max_blocks_per_sm(l.of(used[0]), shape.block_threads(), l.smem, s0.device);
    if (l.of(used[1]) != l.of(used[0])) {
      l.occ = std::min(l.occ,
                       max_blocks_per_sm(l.of(used[1]), shape.block_threads(), l.smem, s0.device));
    }
    return l;
  };
  // Short rows go several to a warp when the GPU is full anyway (the unpacked grid of the first
  // launch is capped by residency); with fewer rows, one row a warp spreads them over more SMs.
  // The packed blocks hold more rows, so fewer fit an SM: under a small SM budget every rank
  // must still get one.
  auto layout_for = [&](const PipelineDepth& depth) {
    Layout lay =
        layout_of(depth, choose_kernel_shape(qw, kw, vec, block_target, world, forced_vpt));
    const KernelShape packed = packed_kernel_shape(qw, kw, vec, block_target, world);
    if (forced_vpt == 0 && packed.vectors_per_thread > 0 &&
        grid_is_full(launch_tokens, ranks, lay.shape.tokens_per_block, lay.occ, sms, budget)) {
      const Layout p = layout_of(depth, packed);
      if (resident_blocks(p.occ, sms, budget) >= ranks) lay = p;
    }
    return lay;
  };
  const PipelineDepth forced = forced_pipeline_depth();
  const bool tuning = forced.stages != 0 || forced.defer != 0;
  // Up to kFewTokensMax tokens at TP 4-8, 3 stages with D = 1 (docs/design.md, "Launch shape").
  const PipelineDepth few =
      tuning ? PipelineDepth{0, 0} : few_token_pipeline_depth(world, launch_tokens);
  Layout lay =
      layout_for(few.stages != 0 ? few : choose_pipeline_depth(world, forced.stages, forced.defer));
  // Otherwise, few tokens at TP >= 8: a shallower ring that fits more groups on the GPU can be
  // worth more than the row loading ahead (docs/design.md, "Launch shape").
  const PipelineDepth shallow = shallow_pipeline_depth(world, launch_tokens);
  if (!tuning && few.stages == 0 && shallow.stages != 0) {
    const Layout s = layout_for(shallow);
    auto resident_groups = [&](const Layout& l) {
      return resident_blocks(l.occ, sms, budget) * l.shape.tokens_per_block;
    };
    if (take_shallow_pipeline(launch_tokens, resident_groups(lay), resident_groups(s))) lay = s;
  }
  const PipelineDepth depth = lay.depth;
  const int stages = depth.stages;
  const KernelShape& shape = lay.shape;
  const std::size_t smem = lay.smem;
  const int occ = lay.occ;

  const bool capturing = detail::stream_capturing(stream);
  std::vector<std::unique_lock<std::mutex>> locks;
  for (Communicator* c : comms) {
    locks.emplace_back(c->state().launch_mutex);
    c->state().begin_launch(stream, capturing);
  }

  LaunchArgs a{};
  a.world = world;
  a.group_threads = shape.group_threads;
  a.tokens_per_block = shape.tokens_per_block;
  a.stages = stages;
  a.defer = depth.defer;
  a.order = static_cast<int>(p0.order);
  a.q_width = qw;
  a.k_width = kw;
  a.capacity = cap;
  a.q_inv_full = 1.0f / static_cast<float>(p0.q_full_width);
  a.k_inv_full = 1.0f / static_cast<float>(p0.k_full_width);
  a.eps = p0.eps;
  a.timeout_ns = static_cast<uint64_t>(s0.config.timeout_s * 1e9);  // validated: <= 3.6e12
  // Every instantiation comes from one build: one of them answers for all.
  const bool pdl = p0.pdl && can_launch_pdl(lay.of(used[0]), s0.device);
  a.pdl = pdl ? 1 : 0;

  for (int64_t first = 0; first < p0.tokens; first += per_launch) {
    const int64_t chunk = std::min(per_launch, p0.tokens - first);
    const GridPlan g = plan_grid(chunk, ranks, shape.tokens_per_block, occ, sms, budget);
    a.tokens = chunk;
    // The chunk's token count is hashed too: a peer called with another token count must not
    // lend its partials to this call's first tokens (every token then times out, naming it).
    a.config_hash = config_hash(p0.q_full_width, p0.k_full_width, world, p0.eps,
                                static_cast<int>(p0.order), chunk);
    a.blocks_per_rank = g.blocks_per_rank;
    for (int i = 0; i < ranks; ++i)
      a.r[i] = detail::rank_args_for(comms[i]->state(), params[i], first);
    launch_fused(lay.of(orders_of(chunk)), g.grid(), shape.block_threads(), smem, stream, a, pdl);
  }
  for (Communicator* c : comms) c->state().end_launch(stream, capturing);
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
