// The launch policy (launch_plan.hpp).
#include "launch_plan.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "swiftqk/error.hpp"

namespace swiftqk {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int round_up_32(int64_t v) { return static_cast<int>(ceil_div(v, 32) * 32); }
}  // namespace

int tuning_override(const char* name, int lo, int hi, const char* what) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == '\0') return 0;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  const bool digits_only = std::isdigit(static_cast<unsigned char>(e[0])) && *end == '\0';
  SWIFTQK_EXPECTS(digits_only && v >= lo && v <= hi, std::string(name) + "=" + e + " is not " +
                                                         what + " from " + std::to_string(lo) +
                                                         " to " + std::to_string(hi));
  return static_cast<int>(v);
}

namespace {
int pow2_at_least(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

// The fewest threads that hold a row of n vectors at vpt each: a power of two from min_group up
// to one warp, else whole warps.
int group_for(int64_t n, int vpt, int min_group) {
  const int64_t lanes = ceil_div(n, vpt);
  if (lanes <= 32) return std::max(min_group, pow2_at_least(lanes));
  return round_up_32(lanes);
}
}  // namespace

KernelShape choose_kernel_shape(int64_t q_width, int64_t k_width, int vec_elems, int block_threads,
                                int world, int forced_vpt) {
  SWIFTQK_EXPECTS(vec_elems >= 1 && q_width % vec_elems == 0 && k_width % vec_elems == 0,
                  "choose_kernel_shape: widths must be multiples of the vector size");
  SWIFTQK_EXPECTS(block_threads >= 32 && block_threads <= 1024,
                  "choose_kernel_shape: block_threads must be in [32, 1024]");
  SWIFTQK_EXPECTS(world >= 1, "choose_kernel_shape: world must be >= 1");
  SWIFTQK_EXPECTS(
      forced_vpt == 0 || forced_vpt == 1 || forced_vpt == 2 || forced_vpt == 4 || forced_vpt == 8,
      "choose_kernel_shape: forced vectors per thread must be 0, 1, 2, 4 or 8");
  const int64_t n = q_width / vec_elems + k_width / vec_elems;
  SWIFTQK_EXPECTS(n > 0, "choose_kernel_shape: empty rows");
  // A group narrower than a warp gives each rank's slot one of its lanes.
  const int min_group = std::min(32, std::max(kMinGroupThreads, pow2_at_least(world)));
  KernelShape s;
  s.vec_elems = vec_elems;
  if (vec_elems == 1 || n > kMaxStagedVectors) {
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
    // Four 16-byte vectors per thread; the group grows with the row, in whole warps, so few
    // threads idle.
    s.vectors_per_thread = 4;
    s.group_threads = round_up_32(ceil_div(n, 4));
  }
  int64_t groups = std::max(1, block_threads / s.group_threads);
  if (s.group_threads > 32) groups = std::min<int64_t>(groups, kMaxGroupsPerBlock);
  if (s.vectors_per_thread > 0) {
    groups = std::min(groups, std::max<int64_t>(1, kMaxStagedRingBytes / (kMaxStages * 16 * n)));
  }
  s.tokens_per_block = static_cast<int>(groups);
  return s;
}

KernelShape packed_kernel_shape(int64_t q_width, int64_t k_width, int vec_elems, int block_threads,
                                int world) {
  KernelShape none;
  none.vectors_per_thread = 0;
  if (world < 2 || world > 16 || vec_elems < 2) return none;  // a 16-lane group serves 16 ranks
  // Rows this short are always staged (vec_elems > 1); choose_kernel_shape checks the widths.
  if (q_width / vec_elems + k_width / vec_elems > kMaxPackedVectors) return none;
  return choose_kernel_shape(q_width, k_width, vec_elems, block_threads, world, 4);
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

}  // namespace swiftqk
