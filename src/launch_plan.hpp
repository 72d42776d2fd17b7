// The launch policy: how a call is cut into launches and how each is shaped (thread layout,
// pipeline depth, block and slot order, persistent grid), tuned on one H200 and overridable by
// LaunchTuning. Pure host arithmetic, no CUDA calls: the launcher (src/launch.cu) answers the
// one question that needs the GPU, a kernel's residency, through a callback, so CI tests the
// whole policy without a GPU (tests/cpu/test_launch_plan.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>

#include "protocol.hpp"
#include "swiftqk/launch_tuning.hpp"

namespace swiftqk {

/// @brief How one token row (Q shard then K shard) of one rank is spread over threads.
struct KernelShape {
  int vec_elems = 1;   ///< elements per vector access; 1 selects the scalar path
  int vec_bytes = 16;  ///< bytes of a vector access (16, 8 or 4; the scalar path ignores it)
  int vectors_per_thread = 1;  ///< staged vectors per thread (1, 2, 4, 8); 0 = streaming
  /// Threads normalising one token of one rank: whole warps, or (staged rows only) 8 or 16
  /// lanes, so that one warp normalises 4 or 2 tokens at once (kMinGroupThreads).
  int group_threads = 32;
  int tokens_per_block = 1;  ///< groups per block
  /// Deterministic mode: canonical lanes a thread holds (1, 2, 4 or 8; kCanonicalLanes / lanes
  /// a segment takes); 0 for the default mode's shapes.
  int det_lanes = 0;
  int block_threads() const { return group_threads * tokens_per_block; }
};

/// Rows of more 16-byte vectors than this (16384 bf16 elements of Q+K; twice as many 8-byte
/// vectors) are streamed in two passes (the second hits L2) instead of being staged: four
/// stages of a 32 KB row fill 128 KB of shared memory. The scalar path (vec_elems 1) always
/// streams.
constexpr int64_t kMaxStagedVectors = 2048;
constexpr int64_t kMaxStagedRowBytes = kMaxStagedVectors * 16;

/// Alone (2 stages, nothing deferred) a row of up to this many bytes is staged too, 4 vectors a
/// thread in up to 1024 threads, where the two stages and the weights fit kMaxStagedSmemBytes:
/// one token group a block, one row loading ahead (staged_row_bytes_limit).
constexpr int64_t kMaxStagedRowBytesAlone = 1024 * 4 * 16;
/// Dynamic shared memory a staged block may ask for (an H200 block may use 227 KB, its static
/// shared memory included).
constexpr int64_t kMaxStagedSmemBytes = 220 * 1024;

/// @brief The widest row (bytes of input) that a launch of a group of `world` with `stages`
/// stages stages instead of streaming, for rows whose weights take weight_bytes_per_row_byte
/// bytes a byte of input (2 for fp8 inputs, whose weights are bf16; else 1):
/// kMaxStagedRowBytesAlone alone at 2 stages where the ring and the weights fit
/// kMaxStagedSmemBytes, else kMaxStagedRowBytes.
int64_t staged_row_bytes_limit(int world, int stages, int weight_bytes_per_row_byte);

/// @brief The vector access of a launch, in bytes (16, 8, 4, or 1: the scalar path), for inputs
/// of in_size bytes an element whose rows allow vectors of up to `allowed` bytes
/// (vector_bytes_for: 16, 8, 4 for 1- and 2-byte types, or the element size) at TP `world`.
/// has_narrow: whether the call's kernels have 8- and 4-byte rows (SwiftQK in the default mode).
/// 4-byte vectors exist for 1- and 2-byte types (two or more elements), so that rows of widths
/// like fp8's 412 (TP 8 of 3296) do not fall to the scalar path. forced:
/// LaunchTuning::vector_bytes (0 = tuned); a width the rows or kernels do not allow gives the
/// widest narrower one. Tuned: the widest, except fp8
/// alone, which takes 8 bytes where it can: a 16-byte fp8 vector writes 32 bytes of bf16, two
/// stores that each fill half of every sector they touch, and an 8-byte one writes one full
/// 16-byte store. On one H200 at TP 1 the 8-byte rows were 19-29% faster at 4096 tokens and
/// 1.1-1.5 us at 64 on three models; at virtual TP 8 they were 8-17% slower, where the longer
/// rows take groups of several warps (CHANGELOG.md). With peers fp8 takes 8 bytes too in
/// launches of at most kFp8FewTokensMax tokens (`tokens`, 0 = not known) on a rank's rows
/// (Q + K shard) of more than kFp8FewTokensMinRowBytes (`row_bytes`).
int choose_vector_bytes(int in_size, int allowed, int world, bool has_narrow, int forced = 0,
                        int64_t tokens = 0, int64_t row_bytes = 0);

/// fp8 with peers in launches of 1 to kFp8FewTokensMax tokens takes 8-byte vectors on rows of more
/// than kFp8FewTokensMinRowBytes (more than 64 16-byte vectors, 4 a thread in a warp or more).
/// Virtual ranks on one H100, against 16-byte vectors, two passes: 0.09-0.75 us faster at 1-64
/// tokens on such rows (OLMo2-13B at TP 2-8, OLMoE at TP 2, 1536:5760 at TP 2 and 4); on rows of
/// 512-1024 bytes (OLMoE at TP 4 and 8, 1536:5760 at TP 8) 0.11-0.28 us slower; at 256 tokens
/// -0.46 to +0.32 us, and from 1024 tokens 13% slower to 11% faster by shape and TP
/// (docs/performance.md, "Vector width").
constexpr int64_t kFp8FewTokensMax = 64;
constexpr int64_t kFp8FewTokensMinRowBytes = 1024;

/// @brief The pipeline of a token group: rows staged and, with peers, the deferral depth D (the
/// group writes token i - D while it reduces token i, so a peer up to D tokens behind costs no
/// wait). stages - 1 - defer rows load ahead.
struct PipelineDepth {
  int stages = 2;
  int defer = 0;
};

/// Tokens per launch up to which TP 8 and more may take the shallow pipeline (3 stages, D = 2;
/// shallow_pipeline_depth), and up to which any gain in resident token groups justifies it
/// (take_shallow_pipeline).
constexpr int64_t kShallowMaxTokens = 4096;
constexpr int64_t kShallowAnyGainTokens = 2048;

/// @brief Alone: 2 stages, no deferral. With peers: D = log2(world) (at most kMaxStages - 2) and
/// one row loading ahead, so stages = D + 2. A deeper D pays off as the group grows (the
/// slowest of more peers lags further) and costs nothing at TP 2; alone, 2 stages are the
/// fastest of 2-5 (one H200, 4096 tokens; CHANGELOG.md, 9127d35). forced_stages and
/// forced_defer (LaunchTuning::stages and defer; 0 = not forced) override them; the depth is
/// then cut to stages - 1.
PipelineDepth choose_pipeline_depth(int world, int forced_stages = 0, int forced_defer = 0);

/// @brief The shallower pipeline a launch of `tokens` tokens may take instead of
/// choose_pipeline_depth's: at TP 8 and more, up to kShallowMaxTokens, 3 stages and D = 2, or
/// {0, 0} when none applies. take_shallow_pipeline decides. Where few_token_pipeline_depth
/// applies (TP 8 up to kFewTokensMax tokens) the launch takes that one instead.
PipelineDepth shallow_pipeline_depth(int world, int64_t tokens);

/// Tokens per launch up to which TP 4 to kFewTokensMaxWorld run 3 stages with D = 1
/// (few_token_pipeline_depth), in place of choose_pipeline_depth's and the shallow pipeline.
constexpr int64_t kFewTokensMax = 2048;
constexpr int kFewTokensMaxWorld = 8;

/// @brief The pipeline a launch of `tokens` tokens takes at 4 <= world <= kFewTokensMaxWorld up
/// to kFewTokensMax tokens: 3 stages and D = 1 (one row loading ahead, one deferred), as at TP 2;
/// {0, 0} when none applies. With a few tokens per group a deep deferral is mostly the ring's fill
/// and drain, and the smaller ring fits more groups where registers do not cap them. With
/// virtual ranks on one H200 it is faster at TP 4 and 8 between 512 and 2048 tokens for nearly
/// every model and level below; past 2048 tokens at TP 8, past 4096 at TP 4 and from 1536 at
/// TP 16 the deeper pipelines win (CHANGELOG.md, 925dafa). Not measured across GPUs
/// (docs/design.md, "Limits").
PipelineDepth few_token_pipeline_depth(int world, int64_t tokens);

/// @brief Whether a launch of `tokens` tokens takes the shallow pipeline, given the token groups
/// resident on the GPU with the default ring and with the shallow one. The smaller ring pays off
/// when few tokens per group leave the row loading ahead little to hide: at virtual TP 8 on one
/// H200, 3 stages are faster at 2048 tokens wherever they fit more groups, and at 4096 only
/// where they double them (OLMoE, OLMo2-7B); where registers cap residency (OLMo2-13B) they
/// gain nothing and lose the row ahead; at 8192 tokens they lose everywhere (CHANGELOG.md,
/// 91a1d19). Measured with virtual ranks (8 ranks share the GPU's groups). Across 8 GPUs each
/// GPU serves one rank, so at these token counts a group runs about one token either way; not
/// measured there (docs/design.md, "Limits").
bool take_shallow_pipeline(int64_t tokens, int64_t default_groups, int64_t shallow_groups);

/// Tokens one kernel launch covers at most: longer calls are split into launches of this many
/// (like workspace chunks), so the kernel indexes tokens and vectors with 32-bit integers.
constexpr int64_t kMaxLaunchTokens = int64_t{1} << 30;

/// Token groups of whole warps a block may hold: each such group synchronises on its own hardware
/// barrier (1..15; barrier 0 is the whole block's). Groups of a warp or less need no barrier.
constexpr int kMaxGroupsPerBlock = 15;

/// Smallest token group: a group narrower than a warp exchanges its partials with one lane per
/// rank, so it has at least max(kMinGroupThreads, world) lanes (a power of two up to 32).
constexpr int kMinGroupThreads = 8;
constexpr int kMaxVectorsPerThread = 8;

/// Deterministic mode: from this many tokens a launch, 8 vectors a thread beat a one-lane layout
/// of 4 with as many slots (OLMo2-13B's 40-vector segments at TP 1, 2 and 8: 1-6% faster at 256
/// tokens, 4-16% at 1024-2048, level or faster from 4096, 7-13% slower at 64; docs/
/// performance.md, "Deterministic mode").
constexpr int64_t kDetEightFromTokens = 256;

/// @brief Throws naming the TP degree (a power of two up to kCanonicalSegments) or the local
/// widths (multiples of the rank's 16 / world segments of vec_elems-element vectors) that allow
/// no canonical order (docs/design.md, "Deterministic mode"): the check the fused kernel's and
/// the epilogue's deterministic launches share.
void check_canonical_split(int64_t q_width, int64_t k_width, int vec_elems, int world);

/// @brief The kernel shape of the deterministic mode for local widths q_width, k_width (elements)
/// of vec_elems-element vectors at TP `world` (a power of two dividing kCanonicalSegments). A
/// segment of the rank's row takes P = 32 / det_lanes threads, so thread p of it holds the
/// canonical lanes p, p + P, ... (docs/design.md, "Deterministic mode"): group_threads = P x the
/// rank's 16 / world segments; each thread stages q_slots vectors of Q from its first slot up and
/// the vectors of K from its last slot down. P is the one whose layout has the fewest slots
/// (group_threads x vectors_per_thread) and, among those, 4 vectors a thread or else the fewest
/// threads (but from kDetEightFromTokens `tokens` a launch, 8 vectors a thread before a one-lane
/// layout of 4), with at most kMaxVectorsPerThread, at least det_lanes slots a thread and a group
/// wide enough for the exchange (kMinGroupThreads, world). forced_vpt (LaunchTuning::
/// vectors_per_thread; 0: the policy) takes the fewest threads whose slots fit in that many a
/// thread. vectors_per_thread 0 (streamed, one warp a segment) when no layout fits or the row is
/// too wide to stage. tokens_per_block fills block_threads within the shared memory of the
/// deepest ring. Throws naming the TP degree or the widths that allow no canonical segments, and
/// a forced vectors per thread no layout fits.
struct DeterministicShape {
  KernelShape shape;
  int q_slots = 0;
};
DeterministicShape deterministic_kernel_shape(int64_t q_width, int64_t k_width, int vec_elems,
                                              int world, int block_threads, int forced_vpt = 0,
                                              int64_t tokens = 0);

/// Shared memory the staged rows of one block may fill at the deepest ring (kMaxStages), so
/// every stage depth fits the 227 KB a block may use, weights included.
constexpr int64_t kMaxStagedRingBytes = 200 * 1024;

/// fp8 rows alone in 8-byte vectors take 8 vectors a thread where 4 would need a group wider than
/// kFp8AloneMaxGroupAtFour and at most kFp8EightMaxGroupAtFour threads, in launches of at least
/// kEightVectorsMinTokens tokens. On one H200 at 4096-16384 tokens OLMo3-32B's 768 vectors to
/// OLMo2-13B's 1280 gain 1-10%, OLMoE's 512 (128 threads at 4) lose 3-8% at 8, and rows of
/// 2104-3172 vectors (526-793 threads at 4) lose 0.5-5%; at 1-16 tokens 8 a thread took 0.5-1.3
/// us more (docs/performance.md, "fp8 alone: 8 vectors a thread").
constexpr int kFp8AloneMaxGroupAtFour = 128;
constexpr int kFp8EightMaxGroupAtFour = 512;
constexpr int64_t kEightVectorsMinTokens = 4096;
/// With peers, rows of 8- or 4-byte vectors (widths that 16-byte ones do not divide) of more
/// than 128 vectors and at most this many take 8 vectors a thread in launches of at least
/// kEightVectorsMinTokens tokens: groups of one or two warps instead of up to four. At virtual
/// TP 8 and 4096 tokens on one H200, rows of 269-270 vectors (bf16 3280:1040 and 3296:5312, fp8
/// 3296:5312) were 14-21% faster at 8 than at 4 (docs/performance.md, "Vector width").
constexpr int64_t kNarrowEightMaxVectors = 512;

/// With peers, launches of up to kSpreadMaxTokens tokens whose rows take 4 vectors a thread in
/// groups wider than a warp take 1, else 2, vectors a thread where that group has at most
/// kSpreadMaxGroupThreads threads, the launch's blocks (tokens x ranks groups) still have an SM
/// each, and a rank that fits one block is not split over several (make_launch_plan). Such a
/// launch is one latency chain, which more threads a row and more SMs shorten; the second block
/// of a rank waits for the first one's claim and counts itself finished (rank_claim.cuh), which
/// cost 0.1-0.4 us more than the spread saved at 2-4 tokens. With virtual ranks on one H100, at
/// 1-64 tokens and TP 2-8 the five models in bf16 and fp8 are 0.14-0.75 us faster where the
/// layout changes and level elsewhere (docs/performance.md, "Few tokens: rows over more
/// threads").
constexpr int64_t kSpreadMaxTokens = 64;
constexpr int kSpreadMaxGroupThreads = 256;

/// Streamed rows (8 vectors a thread, rows too wide to stage) of launches of up to
/// kSpreadMaxTokens tokens with peers take groups of one lane per 2, else 4, vectors of the row
/// (at most 1024 threads), on the spread's conditions above. On one H100, virtual TP 2, f32 rows
/// of 10784-15784 elements a rank at 1-64 tokens are 0.84-3.14 us faster; TP 4 and 8 are level
/// (docs/performance.md, "Few tokens: rows over more threads").
///
/// Two more launches take 2 vectors a thread where the tuned shape takes 4 (virtual ranks on one
/// H100, two passes against 6030c1b; docs/performance.md, "Few tokens: rows over more threads"):
/// - alone, launches of up to kSpreadMaxTokens tokens whose doubled group still fits the block
///   (kDefaultBlockThreadsAlone): OLMoE and OLMo3-32B in bf16 and fp8 at 1-64 tokens are
///   0.21-0.65 us faster; MiniMax-M2 (448 threads) and OLMo2-7B and OLMo2-13B keep their shape
///   (forced, MiniMax-M2 was 0.05-0.1 us faster, OLMo2-7B level and OLMo2-13B 0.06-0.12 slower);
/// - with peers, fp8 rows of 16-byte vectors (16 elements each: at 4 a thread a lane does twice
///   bf16's work) of at least kFp8HalfVectorsMinVectors vectors in launches of up to
///   kFp8HalfVectorsMaxTokens tokens (fp8 takes 8-byte vectors up to kFp8FewTokensMax): at 65-128
///   tokens, TP 2 and 4, 0.20-0.96 us faster at all 36 such points of the five models. Rows of
///   64-80 vectors (TP 8) were level or slower forced.
constexpr int64_t kFp8HalfVectorsMaxTokens = 128;
constexpr int64_t kFp8HalfVectorsMinVectors = 96;

/// Alone, rows of 16-bit elements whose 4-vector group has kAloneHalfVectorsMinGroup to
/// kAloneHalfVectorsMaxGroup threads (rows of 1281-1664 16-byte vectors: the group is a quarter
/// of the vectors rounded up to a warp) take 2 vectors a thread in launches of at least
/// kAloneHalfVectorsFromTokens tokens: one group of up to 832 threads a block. On one H100 at
/// 4096 tokens, f16 and bf16 rows of 1290-1664 vectors reach 94.3-100% of copy bandwidth instead
/// of 89.1-94.9% (f16 7376:4768 on one H200: 85.0 -> 90.6%); rows of 1280 vectors (320 threads,
/// OLMo2-13B) and of 759 lose 2.9-5.6 points, rows of 1696-1920 are level or lose, and fp8, f32
/// and rows of 512 vectors gain nothing (docs/performance.md, "2 vectors a thread alone").
constexpr int kAloneHalfVectorsMinGroup = 352;
constexpr int kAloneHalfVectorsMaxGroup = 416;
constexpr int64_t kAloneHalfVectorsFromTokens = 4096;

/// Threads a block aims at: groups are added while the block stays within this many threads.
/// 256 with peers; alone, 384 (on one H200 at 4096 tokens, 3 OLMoE or 2 OLMo3-32B groups per
/// block are faster than 2 and 1; the other shapes keep one group either way; CHANGELOG.md,
/// e12d48e). LaunchTuning::block_threads overrides both.
constexpr int kDefaultBlockThreads = 256;
constexpr int kDefaultBlockThreadsAlone = 384;

/// @brief Picks the thread layout for local widths q_width/k_width moved vec_elems at a time;
/// a block holds as many token groups as fit block_threads (at least one; at most
/// kMaxGroupsPerBlock groups of whole warps, and no more than kMaxStagedRingBytes of rows).
/// @param world ranks of the group: with peers, short rows are packed several to a warp.
/// @param forced_vpt 0, or vectors per thread (1, 2, 4 or 8) to force on staged rows
/// (LaunchTuning::vectors_per_thread); the group is then the fewest lanes that hold the row.
/// @param vec_bytes bytes of a vector (16, or 8 or 4 where wider vectors do not divide the rows).
/// @param staged_limit the widest row in bytes that is staged (staged_row_bytes_limit).
/// @param launch_tokens tokens of the launch the layout is for (the default: many).
KernelShape choose_kernel_shape(int64_t q_width, int64_t k_width, int vec_elems,
                                int block_threads = kDefaultBlockThreads, int world = 1,
                                int forced_vpt = 0, int vec_bytes = 16,
                                int64_t staged_limit = kMaxStagedRowBytes,
                                int64_t launch_tokens = std::numeric_limits<int64_t>::max());

/// Rows of at most this many 16-byte vectors (1 KB of bf16: OLMoE at TP 8) may be packed two or
/// more to a warp, 4 vectors a thread (packed_kernel_shape).
constexpr int64_t kMaxPackedVectors = 64;
static_assert(kSourceMajorMaxRowElements == kMaxPackedVectors * 8,
              "source-major slots serve the packed rows of 2-byte types (protocol.hpp)");

/// @brief With peers, the layout that packs short rows several to a warp (4 vectors a thread,
/// groups of 16 or 8 lanes, at least one lane per rank), or vectors_per_thread 0 when it does not
/// apply (alone, rows over kMaxPackedVectors, or the scalar path). It pays off only when the GPU is
/// full: it is faster for OLMoE at virtual TP 8 and 4096 tokens, and slower at 64 tokens, where
/// the unpacked grid leaves SMs idle (one H200; CHANGELOG.md, 7a09ebe). The launch takes it when
/// the unpacked grid is capped by residency.
KernelShape packed_kernel_shape(int64_t q_width, int64_t k_width, int vec_elems, int block_threads,
                                int world, int vec_bytes = 16);

/// @brief The persistent grid of one launch.
struct GridPlan {
  int ranks = 1;            ///< ranks served by this launch (virtual ranks share one launch)
  int blocks_per_rank = 0;  ///< blocks serving each rank (their order: BlockOrder)
  int grid() const { return ranks * blocks_per_rank; }
};

/// Tokens per launch from which virtual ranks' blocks are interleaved (choose_block_order).
constexpr int64_t kInterleaveMinTokens = 2048;

/// @brief The block order of a launch: interleaved from kInterleaveMinTokens tokens a launch
/// when it serves more than one rank. On one H200 (virtual TP 2-16) interleaving is as fast or
/// faster from 2048 tokens, by up to 23 us at 16384, but for OLMoE at TP 8 with 2048-4096 tokens
/// (a shape only virtual ranks have), and mixed below 2048 (CHANGELOG.md, 39af1e8).
constexpr BlockOrder choose_block_order(int ranks, int64_t tokens) {
  return ranks > 1 && tokens >= kInterleaveMinTokens ? BlockOrder::kInterleaved
                                                     : BlockOrder::kRankMajor;
}

/// @brief Blocks resident at once: max_blocks_per_sm on each of min(sm_count, sm_budget) SMs
/// (sm_budget 0 = all).
int64_t resident_blocks(int max_blocks_per_sm, int sm_count, int sm_budget);

/// @brief Bounds the grid by what can be resident at once so that spinning blocks never wait on
/// a block that is not running: at most max_blocks_per_sm x min(sm_count, sm_budget) blocks.
/// @param sm_budget SMs this launch may occupy; 0 means all. Throws if even one block per rank
/// cannot be resident.
GridPlan plan_grid(int64_t tokens, int ranks, int tokens_per_block, int max_blocks_per_sm,
                   int sm_count, int sm_budget);

/// @brief Whether plan_grid caps this launch by residency (fewer blocks than one per
/// tokens_per_block tokens): the GPU is then full, and a layout that moves more rows per warp
/// (packed_kernel_shape) pays off, if that layout still gives every rank a resident block.
bool grid_is_full(int64_t tokens, int ranks, int tokens_per_block, int max_blocks_per_sm,
                  int sm_count, int sm_budget);

/// @brief The SMs a launch may fill: the communicator's budget (0 = all), or, for a launch that
/// serves `ranks` of the `ranks_on_device` ranks a local group has on this GPU (each launched on
/// its own stream), that share of the budget (of all SMs when it is 0), at least one, so that
/// the launches of all of them are resident together.
int launch_sm_budget(int sm_budget, int sm_count, int ranks, int ranks_on_device);

// ---------------------------------------------------------------- the plan of one call

/// @brief What the policy reads of a call; the same for every rank the launch serves.
struct LaunchRequest {
  int world = 1;             ///< ranks of the group
  int ranks = 1;             ///< ranks this launch serves (virtual ranks of one GPU share one)
  int64_t tokens = 1;        ///< tokens of the call, at least one
  int64_t q_full_width = 0;  ///< Hq and Hk over all ranks
  int64_t k_full_width = 0;
  /// Elements a vector access moves: of 16 bytes when every rank's rows allow it, else of 8
  /// bytes when they allow that, else 1 (the scalar path, always streamed); capped by
  /// LaunchTuning::vector_bytes.
  int vec_elems = 1;
  int vec_bytes = 16;          ///< bytes of that access (16, 8 or 4; the scalar path ignores it)
  int out_elem_bytes = 2;      ///< bytes of an output (and weight) element
  int64_t token_capacity = 1;  ///< CommConfig::token_capacity: tokens one launch exchanges
  int sm_count = 1;            ///< SMs of the GPU
  int sm_budget = 0;           ///< CommConfig::sm_budget (0 = all SMs)
  int ranks_on_device = 1;     ///< ranks of the group this process drives on this GPU
  LaunchTuning tuning;
  bool deterministic = false;  ///< QkNormParams::deterministic: deterministic_kernel_shape
};

/// @brief The orders that, besides the thread layout, pick a chunk's kernel instantiation (both
/// are template parameters of the kernel).
struct ChunkOrders {
  SlotLayout slots = SlotLayout::kTokenMajor;
  BlockOrder blocks = BlockOrder::kRankMajor;
  bool operator==(const ChunkOrders& o) const { return slots == o.slots && blocks == o.blocks; }
  bool operator!=(const ChunkOrders& o) const { return !(*this == o); }
};

/// @brief A kernel the policy weighs: its thread layout, its ring and the orders of a chunk.
struct KernelCandidate {
  KernelShape shape;
  PipelineDepth depth;
  ChunkOrders orders;
};

/// @brief What the launcher answers for a candidate: the dynamic shared memory its kernel needs
/// (the same for both orders) and how many of its blocks one SM holds at once (the launcher asks
/// cudaOccupancyMaxActiveBlocksPerMultiprocessor; the CPU tests model it).
struct KernelFootprint {
  std::size_t smem_bytes = 0;
  int blocks_per_sm = 0;
};
using FootprintOf = std::function<KernelFootprint(const KernelCandidate&)>;

/// @brief One kernel launch of a call: tokens [first_token, first_token + tokens).
struct ChunkPlan {
  int64_t first_token = 0;
  int64_t tokens = 0;
  ChunkOrders orders;
  GridPlan grid;
};

/// @brief How a call runs: one thread layout and ring for all its launches, the chunks of at
/// most min(token_capacity, kMaxLaunchTokens) tokens each.
struct LaunchPlan {
  KernelShape shape;
  PipelineDepth depth;
  std::size_t smem_bytes = 0;  ///< dynamic shared memory of every launch
  int det_q_slots = 0;         ///< deterministic mode: DeterministicShape::q_slots
  /// Blocks an SM holds of each kernel the chunks run (the smaller, when they run two)
  int blocks_per_sm = 0;
  int sm_budget = 0;   ///< what launch_sm_budget gave
  int64_t chunks = 0;  ///< launches
  ChunkPlan full;      ///< every chunk but the last (first_token 0)
  ChunkPlan last;      ///< the last (the only one when chunks is 1)
  /// @brief Chunk i, 0 <= i < chunks. All chunks but the last have the same length, so the
  /// call runs at most two instantiations, and the residency counts both.
  ChunkPlan chunk(int64_t i) const;
};

/// @brief The tuned policy, with what r.tuning overrides (docs/design.md, "Launch shape"):
/// - the thread layout: choose_kernel_shape at the block size the world aims at; with peers,
///   short rows packed several to a warp (packed_kernel_shape) when the unpacked grid of the
///   first chunk is capped by residency and the packed one still gives every rank a block;
///   up to kSpreadMaxTokens tokens rows spread over more threads (staged and streamed with
///   peers, 2 vectors a thread alone where the group fits the block), and fp8 rows of 16-byte
///   vectors with peers at 2 vectors a thread up to kFp8HalfVectorsMaxTokens;
/// - the ring: up to kFewTokensMax tokens a launch at TP 4-8 few_token_pipeline_depth; else
///   choose_pipeline_depth, or at TP 8+ up to kShallowMaxTokens the shallow pipeline where
///   take_shallow_pipeline says it fits enough more token groups; a tuned stage or deferral
///   depth turns both exceptions off, a tuned vector count the packing and the spreads, a tuned
///   block size the spreads;
/// - per chunk, the slot order (choose_slot_layout, from hashed values only) and the block order
///   (choose_block_order), and the resident grid (plan_grid, within launch_sm_budget).
/// footprint_of is asked for each layout it weighs, for each order the chunks take. Throws
/// swiftqk::Error on a bad request or tuning, or when no block a rank can be resident.
LaunchPlan make_launch_plan(const LaunchRequest& r, const FootprintOf& footprint_of);

}  // namespace swiftqk
