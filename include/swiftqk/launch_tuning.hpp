// Overrides of the tuned launch policy, for tuning runs and for engines that have measured their
// own shapes. Plain data, no CUDA: the checks are CPU-tested.
#pragma once

#include <string>

namespace swiftqk {

/// Rows of input a token group may stage through shared memory (LaunchTuning::stages): the one
/// being reduced, with peers the deferred ones, and the rest loading ahead.
constexpr int kMinStages = 2;
constexpr int kMaxStages = 5;

/// @brief How a launch is shaped, where the caller wants something other than the policy tuned
/// on one H200 (docs/design.md, "Launch shape" and "Block order"). Every field's default leaves
/// its choice to that policy, so a default LaunchTuning launches exactly as the policy decides.
/// It travels with the launch (QkNormParams::tuning); the ranks of one group launch must give
/// the same. It changes how the work is spread, not what is computed (another thread layout may sum
/// a row's squares in another order, within the same tolerance).
struct LaunchTuning {
  /// How a launch that serves several (virtual) ranks assigns its blocks to them.
  enum class BlockOrder : int {
    kTuned = 0,        ///< rank-major below 2048 tokens a launch, interleaved from there
    kRankMajor = 1,    ///< each rank's blocks contiguous
    kInterleaved = 2,  ///< block b serves rank b mod ranks
  };

  /// Rows each token group stages, kMinStages..kMaxStages; 0 = tuned. Setting it or `defer`
  /// also turns off the policy's token-count exceptions (the few-token and shallow pipelines).
  int stages = 0;
  /// With peers, how many tokens a group writes behind the one it reduces: 1..stages - 1
  /// (1..kMaxStages - 1 while stages is tuned, which then follows as defer + 2); 0 = tuned.
  /// A group of one rank defers nothing and ignores it.
  int defer = 0;
  /// Vectors (16-, 8- or 4-byte, vector_bytes) each thread stages of a row: 1, 2, 4 or 8 (the
  /// kernel's instantiations); 0 = tuned. A row then takes the fewest lanes that hold it (at
  /// least 8, and one a rank), and short rows are not packed otherwise. Rows that stream (over
  /// 32 KB, or the scalar path) ignore it. In the deterministic mode, 2, 4 or 8: the fewest
  /// threads a segment whose slots fit (a count no layout fits is refused by name); its bits do
  /// not change.
  int vectors_per_thread = 0;
  /// Threads a block aims at, 32..1024: token groups are added while the block stays within it
  /// (at least one); 0 = tuned (384 alone, 256 with peers).
  int block_threads = 0;
  /// Ignored by a launch that serves one rank, which has one order.
  BlockOrder block_order = BlockOrder::kTuned;
  /// The vector access a launch takes, in bytes: 16, 8, 4 (1- and 2-byte types only), or 1 (the
  /// scalar path, one element at a time); 0 = tuned (choose_vector_bytes). Where the rows' widths,
  /// strides or pointers do not allow the width asked, the launch takes the widest narrower one
  /// they allow. The deterministic mode needs 16 (its canonical order is defined on 16-byte
  /// vectors) and the MiniMax-fused method has 16 or the scalar path.
  int vector_bytes = 0;

  /// @brief Throws swiftqk::Error naming the first field whose value no launch can take, and
  /// the value: stages outside [kMinStages, kMaxStages], defer past stages - 1, vectors per
  /// thread with no kernel instantiation, block threads outside [32, 1024], an unknown order,
  /// a vector width other than 0, 1, 8 or 16.
  void validate() const;

  bool operator==(const LaunchTuning& o) const {
    return stages == o.stages && defer == o.defer && vectors_per_thread == o.vectors_per_thread &&
           block_threads == o.block_threads && block_order == o.block_order &&
           vector_bytes == o.vector_bytes;
  }
  bool operator!=(const LaunchTuning& o) const { return !(*this == o); }
};

/// @brief "tuned", "rank_major" or "interleaved".
std::string to_string(LaunchTuning::BlockOrder o);
/// @brief Parses what to_string gives (also "rank-major"); throws swiftqk::Error otherwise.
LaunchTuning::BlockOrder parse_block_order(const std::string& name);

}  // namespace swiftqk
