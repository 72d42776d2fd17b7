// Host side of a fused QK epilogue launch: the checks, the shape (epilogue_plan.hpp), and one
// kernel launch per chunk of tokens.
#include <algorithm>
#include <string>

#include "comm_state.hpp"
#include "cuda_check.hpp"
#include "device_query.hpp"
#include "epilogue_plan.hpp"
#include "epilogue_table.hpp"
#include "kernels/epilogue_layout.cuh"
#include "launch_plan.hpp"
#include "swiftqk/communicator.hpp"

namespace swiftqk {

namespace {

using detail::EpilogueArgs;
using detail::EpilogueFn;

static_assert(sizeof(EpilogueArgs) <= 4096, "the argument block must fit the kernel parameters");

const uint8_t* at(const void* p, int64_t elems, std::size_t size) {
  return static_cast<const uint8_t*>(p) + elems * static_cast<int64_t>(size);
}

// Every rank of one launch must agree on what the kernel treats as launch-wide.
void check_group_agrees(const std::vector<Communicator*>& comms,
                        const std::vector<QkEpilogueParams>& params) {
  const QkEpilogueParams& p0 = params[0];
  const detail::CommState& s0 = comms[0]->state();
  for (std::size_t i = 0; i < comms.size(); ++i) {
    const QkEpilogueParams& p = params[i];
    const detail::CommState& s = comms[i]->state();
    const std::string who = "launch_qk_epilogue_group: rank slot " + std::to_string(i);
    SWIFTQK_EXPECTS(s.world == s0.world, who + " belongs to a group of another size");
    SWIFTQK_EXPECTS(s.device == s0.device,
                    who + " is on another GPU; a group launch serves virtual ranks of one GPU");
    SWIFTQK_EXPECTS(s.config.token_capacity == s0.config.token_capacity,
                    who + " has another token_capacity");
    SWIFTQK_EXPECTS(s.peers == s0.peers,
                    who + " belongs to another group (its peer table differs from slot 0's)");
    const bool same =
        p.tokens == p0.tokens && p.num_q_heads == p0.num_q_heads &&
        p.num_kv_heads == p0.num_kv_heads && p.head_dim == p0.head_dim && p.dtype == p0.dtype &&
        p.q_out_dtype == p0.q_out_dtype && (p.k_out == nullptr) == (p0.k_out == nullptr) &&
        p.weight_plus_one == p0.weight_plus_one && p.scope == p0.scope && p.order == p0.order &&
        p.eps == p0.eps && p.rope.cache_dtype == p0.rope.cache_dtype &&
        p.rope.max_position == p0.rope.max_position && p.rope.rotary_dim == p0.rope.rotary_dim &&
        p.rope.style == p0.rope.style && p.cache.dtype == p0.cache.dtype &&
        p.cache.num_blocks == p0.cache.num_blocks && p.cache.block_size == p0.cache.block_size &&
        p.cache.block_stride == p0.cache.block_stride &&
        p.cache.slot_stride == p0.cache.slot_stride &&
        p.cache.head_stride == p0.cache.head_stride && p.pdl == p0.pdl && p.tuning == p0.tuning &&
        p.deterministic == p0.deterministic;
    SWIFTQK_EXPECTS(same, who +
                              " differs from slot 0 in tokens, heads, head_dim, dtypes, k_out, "
                              "norm, eps, rope, cache geometry, pdl, tuning or deterministic");
    for (std::size_t j = 0; j < i; ++j) {
      SWIFTQK_EXPECTS(
          comms[j]->state().rank != s.rank,
          who + " repeats rank " + std::to_string(s.rank) + " of slot " + std::to_string(j));
    }
  }
}

void check_launch(const std::vector<Communicator*>& comms,
                  const std::vector<QkEpilogueParams>& params) {
  SWIFTQK_EXPECTS(!comms.empty(), "launch_qk_epilogue: no communicator given");
  SWIFTQK_EXPECTS(comms.size() == params.size(),
                  "launch_qk_epilogue: one QkEpilogueParams per communicator");
  SWIFTQK_EXPECTS(static_cast<int>(comms.size()) <= detail::kMaxRanksPerLaunch,
                  "launch_qk_epilogue_group: at most " +
                      std::to_string(detail::kMaxRanksPerLaunch) + " ranks per launch");
  for (Communicator* c : comms) {
    SWIFTQK_EXPECTS(c != nullptr, "launch_qk_epilogue: null communicator");
    SWIFTQK_EXPECTS(!c->closed(), "launch_qk_epilogue: communicator rank " +
                                      std::to_string(c->rank()) + " is closed");
  }
  const int world = comms[0]->world_size();
  for (std::size_t i = 0; i < comms.size(); ++i) {
    validate_epilogue_params(params[i], world);
    comms[i]->check_error();
  }
  check_group_agrees(comms, params);
}

detail::EpilogueRankArgs rank_args_for(const detail::CommState& s, const QkEpilogueParams& p,
                                       int64_t first) {
  detail::EpilogueRankArgs r{};
  r.x = s.rank_args();
  const std::size_t es = dtype_size(p.dtype), qs = dtype_size(p.q_out_dtype);
  r.x.q_in = at(p.q, first * p.q_stride, es);
  r.x.k_in = at(p.k, first * p.k_stride, es);
  r.x.q_out = const_cast<uint8_t*>(at(p.q_out, first * p.q_out_stride, qs));
  r.x.k_out =
      p.k_out == nullptr ? nullptr : const_cast<uint8_t*>(at(p.k_out, first * p.k_out_stride, es));
  r.x.q_w = p.q_weight;
  r.x.k_w = p.k_weight;
  r.x.q_in_stride = p.q_stride;
  r.x.k_in_stride = p.k_stride;
  r.x.q_out_stride = p.q_out_stride;
  r.x.k_out_stride = p.k_out_stride;
  r.x.q_in_scale = 1.f;
  r.x.k_in_scale = 1.f;
  r.x.rstd_out = nullptr;
  r.v_in = at(p.v, first * p.v_stride, es);
  r.v_stride = p.v_stride;
  r.k_cache = p.cache.k;
  r.v_cache = p.cache.v;
  r.q_scale = p.q_out_scale;
  r.k_scale = p.cache.k_scale;
  r.v_scale = p.cache.v_scale;
  r.positions = p.rope.positions + first;
  r.slots = p.cache.slot_mapping + first;
  r.cos_sin = p.rope.cos_sin_cache;
  return r;
}

void launch_impl(const std::vector<Communicator*>& comms,
                 const std::vector<QkEpilogueParams>& params, cudaStream_t stream) {
  check_launch(comms, params);
  const QkEpilogueParams& p0 = params[0];
  const detail::CommState& s0 = comms[0]->state();
  const int world = s0.world;
  if (p0.tokens == 0) return;
  const bool exchanges = epilogue_exchanges(p0, world);
  SWIFTQK_EXPECTS(!exchanges || s0.p2p,
                  "launch_qk_epilogue: the layerwise epilogue needs P2P between the ranks; this "
                  "group has none (it exchanges through NCCL, which only launch_qk_norm does)");
  const int64_t capacity = s0.config.token_capacity;
  SWIFTQK_EXPECTS(!exchanges || p0.tokens <= capacity || s0.config.chunk_oversize,
                  "launch_qk_epilogue: " + std::to_string(p0.tokens) +
                      " tokens exceed the workspace's " + std::to_string(capacity) +
                      " (CommConfig.token_capacity) and chunk_oversize is off");

  detail::DeviceGuard guard(s0.device);
  int vec = epilogue_vector_elems(p0);
  for (const QkEpilogueParams& p : params) vec = std::min(vec, epilogue_vector_elems(p));
  const std::size_t es = dtype_size(p0.dtype);
  const std::size_t cs_es = p0.rope.cache_dtype == DType::kF32 ? 4 : es;
  const int64_t qw = p0.num_q_heads * p0.head_dim, kw = p0.num_kv_heads * p0.head_dim;
  const detail::EpilogueStageLayout layout =
      detail::epilogue_stage_layout(qw + 2 * kw, es, p0.rope.rotary_dim, cs_es);
  EpilogueShape shape = epilogue_shape(p0, world, vec, layout.bytes());
  for (const QkEpilogueParams& p : params) {
    shape.cs_copy_bytes = std::min(shape.cs_copy_bytes, epilogue_cos_sin_copy_bytes(p));
  }
  const bool headwise = p0.scope == NormScope::kHeadwise;
  const int64_t weight_elems = shape.weights_global ? 0 : headwise ? 2 * p0.head_dim : qw + kw;
  const std::size_t smem = detail::epilogue_smem_bytes(layout, shape.stages, weight_elems, es,
                                                       p0.num_q_heads + p0.num_kv_heads);

  detail::EpilogueKey key;
  key.q_fp8 = p0.q_out_dtype == DType::kF8E4M3;
  key.cache_fp8 = p0.cache.dtype == DType::kF8E4M3;
  key.vector = vec > 1;
  key.alone = !exchanges;
  key.olmo2 = p0.order == NormOrder::kOlmo2;
  // The canonical order (layerwise only; validate_epilogue_params checked TP and widths).
  const bool det = epilogue_canonical_sums(p0);
  key.det = det;
  key.weights_global = shape.weights_global;
  // Alone, a few tokens' launch shares each token between `split` blocks (a multiple of which
  // every rank gets; blocks_per_rank / split tokens are then in flight per rank). Only a call of
  // more than kMaxLaunchTokens tokens alone has a second chunk, too many tokens to split.
  const int sms = detail::sm_count(s0.device);
  const int ranks = static_cast<int>(comms.size());
  const int budget = launch_sm_budget(s0.config.sm_budget, sms, ranks, s0.ranks_on_device);
  const int64_t iph = epilogue_items_per_head(p0, vec), pairs = epilogue_pair_items(p0, vec);
  const int split_first = epilogue_token_split(
      p0, world, vec, std::min(p0.tokens, kMaxLaunchTokens), ranks,
      (p0.num_q_heads + p0.num_kv_heads) * pairs, budget == 0 ? sms : std::min(budget, sms));
  key.split = split_first > 1;
  const EpilogueFn fn = detail::pick_epilogue_kernel(p0.dtype, key);
  SWIFTQK_EXPECTS(fn != nullptr, "launch_qk_epilogue: no kernel for dtype " + to_string(p0.dtype));
  const void* f = reinterpret_cast<const void*>(fn);
  const int per_sm = detail::max_blocks_per_sm(f, shape.threads, smem, s0.device);
  const bool pdl = p0.pdl && detail::can_launch_pdl(f, s0.device);

  EpilogueArgs a{};
  a.world = world;
  a.stages = shape.stages;
  a.defer = shape.defer;
  a.q_heads = static_cast<int>(p0.num_q_heads);
  a.kv_heads = static_cast<int>(p0.num_kv_heads);
  a.head_dim = static_cast<int>(p0.head_dim);
  a.rotary_dim = static_cast<int>(p0.rope.rotary_dim);
  a.neox = p0.rope.style == RopeStyle::kNeox ? 1 : 0;
  a.headwise = headwise ? 1 : 0;
  a.weight_plus_one = p0.weight_plus_one ? 1 : 0;
  a.cs_f32 = p0.rope.cache_dtype == DType::kF32 ? 1 : 0;
  a.cs_copy_bytes = shape.cs_copy_bytes;
  // The kernel divides by head_dim and by the items per head with one multiply, exact while
  // the dividends (elements of a V row, items of a token) times the divisor stay below 2^32.
  SWIFTQK_EXPECTS(kw * p0.head_dim < (int64_t{1} << 32) &&
                      (p0.num_q_heads + p0.num_kv_heads) * iph * iph < (int64_t{1} << 32),
                  "launch_qk_epilogue: " + std::to_string(p0.num_q_heads) + " + " +
                      std::to_string(p0.num_kv_heads) + " heads of " + std::to_string(p0.head_dim) +
                      " are beyond the kernel's index range");
  a.hd_magic = epilogue_div_magic(static_cast<uint32_t>(p0.head_dim));
  const int64_t singles = iph - pairs;
  a.pair_magic = epilogue_div_magic(static_cast<uint32_t>(std::max<int64_t>(1, pairs)));
  a.single_magic = epilogue_div_magic(static_cast<uint32_t>(std::max<int64_t>(1, singles)));
  a.single_shift = static_cast<int>((p0.num_q_heads + p0.num_kv_heads) * pairs % shape.threads);
  // The canonical order: the rank's 16 / world segments of Q and of K, in 16-byte vectors.
  a.det_segments = det ? kCanonicalSegments / world : 0;
  const int64_t det_vec = 16 / static_cast<int64_t>(dtype_size(p0.dtype));
  a.det_q_vecs = det ? static_cast<int>(qw / (a.det_segments * det_vec)) : 0;
  a.det_k_vecs = det ? static_cast<int>(kw / (a.det_segments * det_vec)) : 0;
  a.capacity = capacity;
  a.max_position = p0.rope.max_position;
  a.cache_slots = p0.cache.num_blocks * p0.cache.block_size;
  a.block_size = p0.cache.block_size;
  a.block_stride = p0.cache.block_stride;
  a.slot_stride = p0.cache.slot_stride;
  a.head_stride = p0.cache.head_stride;
  a.q_inv_full = 1.0f / static_cast<float>(qw * world);
  a.k_inv_full = 1.0f / static_cast<float>(kw * world);
  a.eps = p0.eps;
  a.timeout_ns = static_cast<uint64_t>(s0.config.timeout_s * 1e9);  // validated: <= 3.6e12
  a.pdl = pdl ? 1 : 0;

  // With an exchange a chunk holds at most a bank's token slots; token indices are 32-bit.
  const int64_t per_launch = std::min(exchanges ? capacity : kMaxLaunchTokens, kMaxLaunchTokens);
  const int64_t chunks = (p0.tokens + per_launch - 1) / per_launch;

  const bool capturing = detail::stream_capturing(stream);
  std::vector<std::unique_lock<std::mutex>> locks;
  for (Communicator* c : comms) {
    locks.emplace_back(c->state().launch_mutex);
    c->state().begin_launch(stream, capturing);
  }
  // A chunk's launch that throws leaves the chunks before it enqueued: the launch ends anyway.
  detail::LaunchEnd end(comms.data(), comms.size(), stream, capturing);
  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t first = i * per_launch;
    const int64_t tokens = std::min(per_launch, p0.tokens - first);
    int split = split_first;
    GridPlan grid = plan_grid(tokens * split, ranks, 1, per_sm, sms, budget);
    while (split > 1 && grid.blocks_per_rank < split) {
      split /= 2;
      grid = plan_grid(tokens * split, ranks, 1, per_sm, sms, budget);
    }
    grid.blocks_per_rank -= grid.blocks_per_rank % split;
    a.split_log2 = 0;
    while ((1 << a.split_log2) < split) ++a.split_log2;
    a.tokens = tokens;
    a.first_token = first;
    a.blocks_per_rank = grid.blocks_per_rank;
    a.config_hash =
        config_hash(qw * world, kw * world, world, p0.eps, static_cast<int>(p0.order), tokens) ^
        kEpilogueHashSalt ^ (det ? kDeterministicHashSalt : 0u);
    for (std::size_t r = 0; r < comms.size(); ++r) {
      a.r[r] = rank_args_for(comms[r]->state(), params[r], first);
    }
    detail::launch_kernel(fn, dim3(static_cast<unsigned>(grid.blocks_per_rank * ranks)),
                          shape.threads, smem, stream, a, pdl);
  }
  end.done();
}

}  // namespace

void launch_qk_epilogue(Communicator& comm, const QkEpilogueParams& p, cudaStream_t stream) {
  launch_impl({&comm}, {p}, stream);
}

void launch_qk_epilogue_group(const std::vector<Communicator*>& comms,
                              const std::vector<QkEpilogueParams>& params, cudaStream_t stream) {
  launch_impl(comms, params, stream);
}

}  // namespace swiftqk
