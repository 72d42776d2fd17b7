// The launch policy (launch_plan.hpp).
#include "launch_plan.hpp"

#include <algorithm>
#include <initializer_list>
#include <string>

#include "swiftqk/error.hpp"

namespace swiftqk {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int round_up_32(int64_t v) { return static_cast<int>(ceil_div(v, 32) * 32); }

int pow2_at_least(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Groups of shape s a block of about block_threads holds: at most kMaxGroupsPerBlock groups wider
// than a warp (their per-group shared state), and a staged ring within kMaxStagedRingBytes at
// the deepest ring.
int groups_per_block(const KernelShape& s, int64_t n, int block_threads) {
  int64_t groups = std::max(1, std::min(block_threads, 1024) / s.group_threads);
  if (s.group_threads > 32) groups = std::min<int64_t>(groups, kMaxGroupsPerBlock);
  if (s.vectors_per_thread > 0) {
    groups = std::min(groups,
                      std::max<int64_t>(1, kMaxStagedRingBytes / (kMaxStages * s.vec_bytes * n)));
  }
  return static_cast<int>(groups);
}

// The fewest threads that hold a row of n vectors at vpt each: a power of two from min_group up
// to one warp, else whole warps.
int group_for(int64_t n, int vpt, int min_group) {
  const int64_t lanes = ceil_div(n, vpt);
  if (lanes <= 32) return std::max(min_group, pow2_at_least(lanes));
  return round_up_32(lanes);
}
}  // namespace

int64_t staged_row_bytes_limit(int world, int stages, int weight_bytes_per_row_byte) {
  SWIFTQK_EXPECTS(world >= 1 && stages >= 1 && weight_bytes_per_row_byte >= 1,
                  "staged_row_bytes_limit: world, stages and the weight ratio must be positive");
  const int64_t alone_smem = kMaxStagedRowBytesAlone * (stages + weight_bytes_per_row_byte);
  if (world == 1 && stages <= 2 && alone_smem <= kMaxStagedSmemBytes) {
    return kMaxStagedRowBytesAlone;
  }
  return kMaxStagedRowBytes;
}

KernelShape choose_kernel_shape(int64_t q_width, int64_t k_width, int vec_elems, int block_threads,
                                int world, int forced_vpt, int vec_bytes, int64_t staged_limit,
                                int64_t launch_tokens) {
  SWIFTQK_EXPECTS(vec_elems >= 1 && q_width % vec_elems == 0 && k_width % vec_elems == 0,
                  "choose_kernel_shape: widths must be multiples of the vector size");
  SWIFTQK_EXPECTS(block_threads >= 32 && block_threads <= 1024,
                  "choose_kernel_shape: block_threads must be in [32, 1024]");
  SWIFTQK_EXPECTS(world >= 1, "choose_kernel_shape: world must be >= 1");
  SWIFTQK_EXPECTS(vec_elems == 1 || vec_bytes == 16 || vec_bytes == 8 || vec_bytes == 4,
                  "choose_kernel_shape: vectors are of 16, 8 or 4 bytes");
  SWIFTQK_EXPECTS(
      forced_vpt == 0 || forced_vpt == 1 || forced_vpt == 2 || forced_vpt == 4 || forced_vpt == 8,
      "choose_kernel_shape: forced vectors per thread must be 0, 1, 2, 4 or 8");
  const int64_t n = q_width / vec_elems + k_width / vec_elems;
  SWIFTQK_EXPECTS(n > 0, "choose_kernel_shape: empty rows");
  // A group narrower than a warp gives each rank's slot one of its lanes.
  const int min_group = std::min(32, std::max(kMinGroupThreads, pow2_at_least(world)));
  KernelShape s;
  s.vec_elems = vec_elems;
  s.vec_bytes = vec_elems == 1 ? 16 : vec_bytes;
  SWIFTQK_EXPECTS(staged_limit >= kMaxStagedRowBytes && staged_limit <= kMaxStagedRowBytesAlone,
                  "choose_kernel_shape: the staged row limit must be in [kMaxStagedRowBytes, "
                  "kMaxStagedRowBytesAlone]");
  // Staged rows take 4 vectors a thread in at most 1024 threads (or the forced count below).
  if (vec_elems == 1 || n * vec_bytes > staged_limit || n > 1024 * 4) {
    // Streaming: each thread walks its vectors twice; ~8 per thread keeps the group small.
    s.vectors_per_thread = 0;
    s.group_threads = std::min(1024, std::max(32, round_up_32(ceil_div(n, 8))));
  } else if (forced_vpt != 0) {
    SWIFTQK_EXPECTS(ceil_div(n, forced_vpt) <= 1024,
                    "choose_kernel_shape: " + std::to_string(forced_vpt) +
                        " vectors per thread would need more than 1024 threads for a row of " +
                        std::to_string(n) + " vectors");
    s.vectors_per_thread = forced_vpt;
    s.group_threads = group_for(n, forced_vpt, min_group);
  } else if (n <= 32 * 4) {
    // Narrow rows (high TP degree): one warp per token, up to 4 vectors each, and several
    // tokens per block so a block still moves a useful amount of data.
    s.group_threads = 32;
    s.vectors_per_thread = n <= 32 ? 1 : (n <= 64 ? 2 : 4);
  } else {
    // Four vectors per thread; the group grows with the row, in whole warps, so few threads
    // idle. Eight a thread, in launches of many tokens (in launches of 1-16 tokens fp8 alone
    // measured 0.5-1.3 us slower at eight, not located, hence the bound):
    // - fp8 rows alone (8 elements an 8-byte vector) where four would need groups of more than
    //   kFp8AloneMaxGroupAtFour threads, up to kFp8EightMaxGroupAtFour: a thread then stages 64
    //   bytes a token, as a 16-bit row's four 16-byte vectors do; wider rows lose at eight;
    // - with peers, rows of 8- or 4-byte vectors of up to kNarrowEightMaxVectors: groups of one
    //   or two warps instead of up to four, so fewer warps meet at each token's barrier.
    const int64_t at_four = ceil_div(n, 4);
    const bool fp8_alone = world == 1 && vec_elems == 8 && vec_bytes == 8;
    const bool many = launch_tokens >= kEightVectorsMinTokens;
    const bool fp8_eight =
        fp8_alone && at_four > kFp8AloneMaxGroupAtFour && at_four <= kFp8EightMaxGroupAtFour;
    const bool narrow_eight = world > 1 && vec_bytes < 16 && n <= kNarrowEightMaxVectors;
    s.vectors_per_thread = many && (fp8_eight || narrow_eight) ? 8 : 4;
    s.group_threads = round_up_32(ceil_div(n, s.vectors_per_thread));
  }
  s.tokens_per_block = groups_per_block(s, n, block_threads);
  return s;
}

KernelShape packed_kernel_shape(int64_t q_width, int64_t k_width, int vec_elems, int block_threads,
                                int world, int vec_bytes) {
  KernelShape none;
  none.vectors_per_thread = 0;
  if (world < 2 || world > 16 || vec_elems < 2) return none;  // a 16-lane group serves 16 ranks
  // Rows this short are always staged (vec_elems > 1); choose_kernel_shape checks the widths.
  if (q_width / vec_elems + k_width / vec_elems > kMaxPackedVectors) return none;
  return choose_kernel_shape(q_width, k_width, vec_elems, block_threads, world, 4, vec_bytes);
}

int choose_vector_bytes(int in_size, int allowed, int world, bool has_narrow, int forced,
                        int64_t tokens, int64_t row_bytes) {
  SWIFTQK_EXPECTS(in_size == 1 || in_size == 2 || in_size == 4,
                  "choose_vector_bytes: elements are of 1, 2 or 4 bytes");
  SWIFTQK_EXPECTS(allowed == 16 || allowed == 8 || allowed == 4 || allowed == in_size,
                  "choose_vector_bytes: rows allow 16, 8, 4 or element-size accesses");
  SWIFTQK_EXPECTS(forced == 0 || forced == 16 || forced == 8 || forced == 4 || forced == 1,
                  "choose_vector_bytes: a forced width is 16, 8, 4 or 1");
  SWIFTQK_EXPECTS(world >= 1, "choose_vector_bytes: world must be >= 1");
  SWIFTQK_EXPECTS(tokens >= 0 && row_bytes >= 0,
                  "choose_vector_bytes: tokens and row bytes must be >= 0");
  const bool few_tokens_wide_row =
      tokens >= 1 && tokens <= kFp8FewTokensMax && row_bytes > kFp8FewTokensMinRowBytes;
  const bool fp8_eight = in_size == 1 && has_narrow && (world == 1 || few_tokens_wide_row);
  const int want = forced != 0 ? forced : (fp8_eight ? 8 : 16);
  if (want >= 16 && allowed >= 16) return 16;
  if (!has_narrow) return 1;
  if (want >= 8 && allowed >= 8) return 8;
  // A 4-byte vector holds two or more elements of 1- and 2-byte types only.
  if (want >= 4 && allowed >= 4 && in_size <= 2) return 4;
  return 1;
}

PipelineDepth choose_pipeline_depth(int world, int forced_stages, int forced_defer) {
  SWIFTQK_EXPECTS(world >= 1, "choose_pipeline_depth: world must be >= 1");
  SWIFTQK_EXPECTS(
      forced_stages == 0 || (forced_stages >= kMinStages && forced_stages <= kMaxStages),
      "choose_pipeline_depth: stages must be 0 or in [kMinStages, kMaxStages]");
  SWIFTQK_EXPECTS(forced_defer >= 0 && forced_defer < kMaxStages,
                  "choose_pipeline_depth: defer must be in [0, kMaxStages - 1]");
  PipelineDepth d;
  if (world == 1) {
    d.stages = forced_stages != 0 ? forced_stages : 2;
    return d;  // nothing to wait for, nothing deferred
  }
  int log2_world = 0;
  while ((2 << log2_world) <= world) ++log2_world;
  d.defer = forced_defer != 0 ? forced_defer : std::min(log2_world, kMaxStages - 2);
  d.stages = forced_stages != 0 ? forced_stages : std::min(kMaxStages, d.defer + 2);
  d.defer = std::min(d.defer, d.stages - 1);
  return d;
}

PipelineDepth shallow_pipeline_depth(int world, int64_t tokens) {
  SWIFTQK_EXPECTS(world >= 1 && tokens >= 0,
                  "shallow_pipeline_depth: world must be >= 1 and tokens >= 0");
  PipelineDepth none{0, 0};
  if (world < 8 || tokens > kShallowMaxTokens) return none;
  return PipelineDepth{3, 2};
}

PipelineDepth few_token_pipeline_depth(int world, int64_t tokens) {
  SWIFTQK_EXPECTS(world >= 1 && tokens >= 0,
                  "few_token_pipeline_depth: world must be >= 1 and tokens >= 0");
  if (world < 4 || world > kFewTokensMaxWorld || tokens > kFewTokensMax) return PipelineDepth{0, 0};
  return PipelineDepth{3, 1};
}

bool take_shallow_pipeline(int64_t tokens, int64_t default_groups, int64_t shallow_groups) {
  SWIFTQK_EXPECTS(tokens >= 0 && default_groups >= 0 && shallow_groups >= 0,
                  "take_shallow_pipeline: tokens and groups must be >= 0");
  if (tokens > kShallowMaxTokens || shallow_groups <= default_groups) return false;
  return tokens <= kShallowAnyGainTokens || shallow_groups >= 2 * default_groups;
}

int64_t resident_blocks(int max_blocks_per_sm, int sm_count, int sm_budget) {
  const int sms = sm_budget == 0 ? sm_count : std::min(sm_budget, sm_count);
  return static_cast<int64_t>(std::max(0, max_blocks_per_sm)) * std::max(0, sms);
}

GridPlan plan_grid(int64_t tokens, int ranks, int tokens_per_block, int max_blocks_per_sm,
                   int sm_count, int sm_budget) {
  SWIFTQK_EXPECTS(ranks >= 1 && tokens_per_block >= 1 && sm_count >= 1,
                  "plan_grid: ranks, tokens_per_block and sm_count must be positive");
  SWIFTQK_EXPECTS(sm_budget >= 0, "plan_grid: sm_budget must be >= 0 (0 = all SMs)");
  SWIFTQK_EXPECTS(max_blocks_per_sm >= 1,
                  "plan_grid: the kernel cannot be resident on an SM (occupancy 0)");
  const int64_t resident = resident_blocks(max_blocks_per_sm, sm_count, sm_budget);
  const int64_t per_rank_cap = resident / ranks;
  SWIFTQK_EXPECTS(per_rank_cap >= 1, "plan_grid: " + std::to_string(ranks) +
                                         " ranks in one launch need at least one resident block "
                                         "each, but only " +
                                         std::to_string(resident) + " fit in the SM budget");
  GridPlan g;
  g.ranks = ranks;
  const int64_t wanted = std::max<int64_t>(1, ceil_div(tokens, tokens_per_block));
  g.blocks_per_rank = static_cast<int>(std::min(wanted, per_rank_cap));
  return g;
}

bool grid_is_full(int64_t tokens, int ranks, int tokens_per_block, int max_blocks_per_sm,
                  int sm_count, int sm_budget) {
  const GridPlan g =
      plan_grid(tokens, ranks, tokens_per_block, max_blocks_per_sm, sm_count, sm_budget);
  return g.blocks_per_rank < ceil_div(tokens, tokens_per_block);
}

void check_canonical_split(int64_t q_width, int64_t k_width, int vec_elems, int world) {
  SWIFTQK_EXPECTS(world >= 1 && world <= kCanonicalSegments && (world & (world - 1)) == 0,
                  "deterministic mode: TP degree " + std::to_string(world) +
                      " must be a power of two up to " + std::to_string(kCanonicalSegments));
  const int segments = kCanonicalSegments / world;
  const int64_t unit = static_cast<int64_t>(segments) * vec_elems;
  SWIFTQK_EXPECTS(
      vec_elems > 1 && q_width > 0 && k_width > 0 && q_width % unit == 0 && k_width % unit == 0,
      "deterministic mode: local widths " + std::to_string(q_width) + " and " +
          std::to_string(k_width) + " must be multiples of " + std::to_string(unit) + " (" +
          std::to_string(segments) + " segments of " + std::to_string(vec_elems) +
          "-element vectors)");
}

DeterministicShape deterministic_kernel_shape(int64_t q_width, int64_t k_width, int vec_elems,
                                              int world, int block_threads, int forced_vpt,
                                              int64_t tokens) {
  check_canonical_split(q_width, k_width, vec_elems, world);
  const int segments = kCanonicalSegments / world;  // per rank, of Q and of K each
  const int64_t unit = static_cast<int64_t>(segments) * vec_elems;
  SWIFTQK_EXPECTS(forced_vpt == 0 || forced_vpt == 2 || forced_vpt == 4 || forced_vpt == 8,
                  "deterministic mode: vectors per thread must be 0 (the policy), 2, 4 or 8, not " +
                      std::to_string(forced_vpt));
  const int64_t seg_q = q_width / unit, seg_k = k_width / unit;  // vectors per segment
  const int64_t n = (q_width + k_width) / vec_elems;
  const int min_group = std::min(32, std::max(kMinGroupThreads, pow2_at_least(world)));
  DeterministicShape d;
  d.shape.vec_elems = vec_elems;
  bool found = false;
  int64_t best_slots = 0;
  if (n <= kMaxStagedVectors) {
    for (int lanes = kMaxVectorsPerThread; lanes >= 1; lanes >>= 1) {  // fewest threads first
      const int p = kCanonicalLanes / lanes;
      const int64_t qs = ceil_div(seg_q, p), ks = ceil_div(seg_k, p);
      const int fit = std::max(2, pow2_at_least(qs + ks));
      const int group = p * segments;
      const int vpt = forced_vpt != 0 ? forced_vpt : fit;
      if (fit > vpt || vpt > kMaxVectorsPerThread || lanes > vpt || group < min_group) continue;
      const int64_t slots = static_cast<int64_t>(group) * vpt;
      // Forced: the first that fits. Else the fewest slots, then 4 vectors a thread (the
      // default layouts' count), then the fewest threads; but at many tokens 8 vectors a thread
      // keep their place before a one-lane layout of 4 (kDetEightFromTokens).
      const bool keep_eight =
          tokens >= kDetEightFromTokens && d.shape.vectors_per_thread == 8 && lanes == 1;
      const bool better =
          !found || (forced_vpt == 0 &&
                     (slots < best_slots || (slots == best_slots && vpt == 4 &&
                                             d.shape.vectors_per_thread != 4 && !keep_eight)));
      if (!better) continue;
      found = true;
      best_slots = slots;
      d.shape.group_threads = group;
      d.shape.vectors_per_thread = vpt;
      d.shape.det_lanes = lanes;
      d.q_slots = static_cast<int>(qs);
    }
  }
  if (!found) {
    SWIFTQK_EXPECTS(forced_vpt == 0, "deterministic mode: no layout stages local widths " +
                                         std::to_string(q_width) + " and " +
                                         std::to_string(k_width) + " in " +
                                         std::to_string(forced_vpt) + " vectors per thread");
    d.shape.group_threads = kCanonicalLanes * segments;  // streamed, one warp a segment
    d.shape.vectors_per_thread = 0;
    d.shape.det_lanes = 1;
    d.q_slots = 0;
  }
  d.shape.tokens_per_block = groups_per_block(d.shape, n, block_threads);
  return d;
}

int launch_sm_budget(int sm_budget, int sm_count, int ranks, int ranks_on_device) {
  if (ranks >= ranks_on_device) return sm_budget;
  const int base = sm_budget == 0 ? sm_count : std::min(sm_budget, sm_count);
  return std::max(1, base * ranks / ranks_on_device);
}

ChunkPlan LaunchPlan::chunk(int64_t i) const {
  SWIFTQK_EXPECTS(i >= 0 && i < chunks, "LaunchPlan::chunk: chunk " + std::to_string(i) + " of " +
                                            std::to_string(chunks));
  if (i == chunks - 1) return last;
  ChunkPlan c = full;
  c.first_token = i * full.tokens;
  return c;
}

namespace {

// The slot order follows the chunk's token count, like the hash: every rank derives it from the
// hashed values alone. The block order is the tuned one unless the tuning names one, and a launch
// of one rank has one order.
ChunkOrders orders_of(const LaunchRequest& r, int64_t chunk_tokens) {
  ChunkOrders o;
  // The deterministic mode has token-major slots only; the block order changes which block
  // serves a token, never the order of a sum, so it takes the tuned one too.
  if (!r.deterministic) {
    o.slots = choose_slot_layout(r.world, r.q_full_width, r.k_full_width, chunk_tokens);
  }
  o.blocks = choose_block_order(r.ranks, chunk_tokens);
  if (r.ranks > 1 && r.tuning.block_order != LaunchTuning::BlockOrder::kTuned) {
    o.blocks = r.tuning.block_order == LaunchTuning::BlockOrder::kRankMajor
                   ? BlockOrder::kRankMajor
                   : BlockOrder::kInterleaved;
  }
  return o;
}

// A layout the policy weighs, with the footprint of the kernels the chunks would run.
struct Layout {
  KernelShape shape;
  PipelineDepth depth;
  KernelFootprint footprint;
};

}  // namespace

LaunchPlan make_launch_plan(const LaunchRequest& r, const FootprintOf& footprint_of) {
  SWIFTQK_EXPECTS(r.world >= 1 && r.ranks >= 1 && r.ranks <= r.world,
                  "make_launch_plan: ranks must be in [1, world]");
  SWIFTQK_EXPECTS(r.tokens >= 1, "make_launch_plan: tokens must be >= 1");
  SWIFTQK_EXPECTS(r.q_full_width % r.world == 0 && r.k_full_width % r.world == 0,
                  "make_launch_plan: the full widths must split over the world");
  SWIFTQK_EXPECTS(r.token_capacity >= 1 && r.sm_count >= 1 && r.ranks_on_device >= 1,
                  "make_launch_plan: token_capacity, sm_count and ranks_on_device must be >= 1");
  r.tuning.validate();
  const LaunchTuning& t = r.tuning;
  SWIFTQK_EXPECTS(!r.deterministic || (r.vec_elems > 1 && r.vec_bytes == 16),
                  "make_launch_plan: the deterministic mode needs rows of 16-byte vectors "
                  "(16-byte aligned pointers, strides and widths in whole vectors, and "
                  "LaunchTuning::vector_bytes 0 or 16)");
  const int64_t qw = r.q_full_width / r.world, kw = r.k_full_width / r.world;
  const int sms = r.sm_count;
  const int budget = launch_sm_budget(r.sm_budget, sms, r.ranks, r.ranks_on_device);
  const int block_target = t.block_threads != 0 ? t.block_threads
                           : r.world == 1       ? kDefaultBlockThreadsAlone
                                                : kDefaultBlockThreads;
  // Every chunk but the last covers per_launch tokens: the first one's count picks the ring.
  const int64_t per_launch = std::min(r.token_capacity, kMaxLaunchTokens);
  const int64_t launch_tokens = std::min(per_launch, r.tokens);
  const int64_t last_tokens = r.tokens - (r.tokens - 1) / per_launch * per_launch;
  const ChunkOrders used[2] = {orders_of(r, launch_tokens), orders_of(r, last_tokens)};

  // The grid must fit the residency of each kernel the chunks take (usually one).
  auto layout_of = [&](const PipelineDepth& depth, const KernelShape& shape) {
    Layout l{shape, depth, footprint_of(KernelCandidate{shape, depth, used[0]})};
    if (used[1] != used[0]) {
      l.footprint.blocks_per_sm =
          std::min(l.footprint.blocks_per_sm,
                   footprint_of(KernelCandidate{shape, depth, used[1]}).blocks_per_sm);
    }
    return l;
  };
  // Short rows go several to a warp when the GPU is full anyway (the unpacked grid of the first
  // launch is capped by residency); with fewer rows, one row a warp spreads them over more SMs.
  // The packed blocks hold more rows, so fewer fit an SM: under a small SM budget every rank
  // must still get one.
  const DeterministicShape det =
      r.deterministic ? deterministic_kernel_shape(qw, kw, r.vec_elems, r.world, block_target,
                                                   t.vectors_per_thread, launch_tokens)
                      : DeterministicShape{};
  auto layout_for = [&](const PipelineDepth& depth) {
    if (r.deterministic) return layout_of(depth, det.shape);
    const int64_t staged_limit = staged_row_bytes_limit(
        r.world, depth.stages, r.vec_elems > 1 ? r.out_elem_bytes * r.vec_elems / r.vec_bytes : 1);
    Layout lay = layout_of(
        depth, choose_kernel_shape(qw, kw, r.vec_elems, block_target, r.world, t.vectors_per_thread,
                                   r.vec_bytes, staged_limit, launch_tokens));
    const KernelShape packed =
        packed_kernel_shape(qw, kw, r.vec_elems, block_target, r.world, r.vec_bytes);
    if (t.vectors_per_thread == 0 && packed.vectors_per_thread > 0 &&
        grid_is_full(launch_tokens, r.ranks, lay.shape.tokens_per_block,
                     lay.footprint.blocks_per_sm, sms, budget)) {
      const Layout p = layout_of(depth, packed);
      if (resident_blocks(p.footprint.blocks_per_sm, sms, budget) >= r.ranks) lay = p;
    }
    // A launch of few tokens with peers is one latency chain: a row spread over more threads
    // (fewer vectors each) and its blocks over more SMs shortens it, while every block still
    // has an SM of its own. A forced vector count or block size keeps the shape it asks for.
    // spread takes the first candidate shape (shape_for(option, &shape) true) whose blocks each
    // have an SM of the launch's budget and that keeps a rank of one block in one.
    auto spread = [&](auto&& shape_for, std::initializer_list<int> options) {
      const int64_t sm_room = budget == 0 ? sms : std::min(budget, sms);
      for (int option : options) {
        KernelShape s;
        if (!shape_for(option, &s)) continue;
        if (ceil_div(launch_tokens * r.ranks, s.tokens_per_block) > sm_room) continue;
        // A rank of one block skips the other blocks' wait for its claim and the count of
        // finished blocks (rank_claim.cuh): spreading it over two or more costs more than it saves.
        if (launch_tokens <= lay.shape.tokens_per_block && launch_tokens > s.tokens_per_block) {
          continue;
        }
        const Layout l = layout_of(depth, s);
        if (l.footprint.blocks_per_sm >= 1) {
          lay = l;
          return;
        }
      }
    };
    const int64_t n = qw / r.vec_elems + kw / r.vec_elems;
    // A forced vector count or block size turns off every reshaping below.
    const bool policy_shape = t.vectors_per_thread == 0 && t.block_threads == 0;
    const bool few_with_peers = policy_shape && r.world > 1 && launch_tokens <= kSpreadMaxTokens;
    if (few_with_peers && lay.shape.vectors_per_thread == 4 && lay.shape.group_threads > 32) {
      // Staged rows: 1, else 2, vectors a thread. The group is these lanes rounded up to a warp
      // (or a power of two below one), so at most kSpreadMaxGroupThreads too.
      spread(
          [&](int vpt, KernelShape* s) {
            if (ceil_div(n, vpt) > kSpreadMaxGroupThreads) return false;
            *s = choose_kernel_shape(qw, kw, r.vec_elems, block_target, r.world, vpt, r.vec_bytes,
                                     staged_limit, launch_tokens);
            return true;
          },
          {1, 2});
    } else if (few_with_peers && lay.shape.vectors_per_thread == 0 && r.vec_elems > 1) {
      // Streamed rows (8 vectors a thread): groups of one lane per 2, else 4, vectors.
      const KernelShape streamed = lay.shape;
      spread(
          [&](int per, KernelShape* s) {
            *s = streamed;
            s->group_threads = std::min(1024, round_up_32(ceil_div(n, per)));
            if (s->group_threads <= streamed.group_threads) return false;
            s->tokens_per_block = groups_per_block(*s, n, block_target);
            return true;
          },
          {2, 4});
    }
    // Three further cases take 2 vectors a thread instead of 4: alone, launches of few tokens whose
    // doubled group still fits the block; with peers, fp8 rows of 16-byte vectors (16 elements
    // each, so 4 a thread is twice bf16's work a lane) in launches just past the spread; alone,
    // 16-bit rows of kAloneHalfVectorsMinGroup-kAloneHalfVectorsMaxGroup threads at 4 in
    // launches of many tokens (launch_plan.hpp).
    const bool alone_few = r.world == 1 && launch_tokens <= kSpreadMaxTokens;
    const bool fp8_wide = r.world > 1 && r.vec_bytes == 16 && r.vec_elems == 16 &&
                          launch_tokens <= kFp8HalfVectorsMaxTokens &&
                          n >= kFp8HalfVectorsMinVectors;
    const bool alone_mid = r.world == 1 && r.vec_bytes == 16 && r.vec_elems == 8 &&
                           launch_tokens >= kAloneHalfVectorsFromTokens &&
                           lay.shape.group_threads >= kAloneHalfVectorsMinGroup &&
                           lay.shape.group_threads <= kAloneHalfVectorsMaxGroup;
    // The doubled group fits the block alone at few tokens, and a block's 1024 threads else.
    const int64_t half_lanes = ceil_div(n, 2);
    if (policy_shape && lay.shape.vectors_per_thread == 4 &&
        ((alone_few && half_lanes <= block_target) ||
         ((fp8_wide || alone_mid) && half_lanes <= 1024))) {
      const Layout l =
          layout_of(depth, choose_kernel_shape(qw, kw, r.vec_elems, block_target, r.world, 2,
                                               r.vec_bytes, staged_limit, launch_tokens));
      if (l.footprint.blocks_per_sm >= 1) lay = l;
    }
    return lay;
  };
  const bool tuned_depth = t.stages != 0 || t.defer != 0;
  // Up to kFewTokensMax tokens at TP 4-8, 3 stages with D = 1 (docs/design.md, "Launch shape").
  const PipelineDepth few =
      tuned_depth ? PipelineDepth{0, 0} : few_token_pipeline_depth(r.world, launch_tokens);
  Layout lay =
      layout_for(few.stages != 0 ? few : choose_pipeline_depth(r.world, t.stages, t.defer));
  // Otherwise, few tokens at TP >= 8: a shallower ring that fits more groups on the GPU can be
  // worth more than the row loading ahead (docs/design.md, "Launch shape").
  const PipelineDepth shallow = shallow_pipeline_depth(r.world, launch_tokens);
  if (!tuned_depth && few.stages == 0 && shallow.stages != 0) {
    const Layout s = layout_for(shallow);
    auto resident_groups = [&](const Layout& l) {
      return resident_blocks(l.footprint.blocks_per_sm, sms, budget) * l.shape.tokens_per_block;
    };
    if (take_shallow_pipeline(launch_tokens, resident_groups(lay), resident_groups(s))) lay = s;
  }

  // A forced block size the kernel's registers or shared memory cannot hold is the caller's
  // choice to change: name it.
  SWIFTQK_EXPECTS(lay.footprint.blocks_per_sm >= 1 || t.block_threads == 0,
                  "launch: LaunchTuning::block_threads " + std::to_string(t.block_threads) +
                      " gives blocks of " + std::to_string(lay.shape.block_threads()) +
                      " threads that this kernel cannot hold on an SM (occupancy 0: its "
                      "registers or shared memory); ask for fewer threads");
  LaunchPlan plan;
  plan.shape = lay.shape;
  plan.depth = lay.depth;
  plan.smem_bytes = lay.footprint.smem_bytes;
  plan.blocks_per_sm = lay.footprint.blocks_per_sm;
  plan.sm_budget = budget;
  plan.det_q_slots = det.q_slots;
  plan.chunks = ceil_div(r.tokens, per_launch);
  auto chunk_of = [&](int64_t first, int64_t tokens, const ChunkOrders& orders) {
    return ChunkPlan{
        first, tokens, orders,
        plan_grid(tokens, r.ranks, plan.shape.tokens_per_block, plan.blocks_per_sm, sms, budget)};
  };
  plan.full = chunk_of(0, launch_tokens, used[0]);
  plan.last = chunk_of((plan.chunks - 1) * per_launch, last_tokens, used[1]);
  return plan;
}

}  // namespace swiftqk
