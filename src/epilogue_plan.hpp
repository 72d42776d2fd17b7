// The launch shape of a fused QK epilogue: its access width, block size, ring depth and chunks.
// Host-only and CPU-tested; the kernel's shared-memory layout is qk_epilogue.cuh's.
#pragma once

#include <cstdint>

#include "swiftqk/qk_epilogue_params.hpp"

namespace swiftqk {

/// Vectors a thread handles per token at most before the block grows (up to the largest block).
constexpr int kEpilogueUnitsPerThread = 4;
constexpr int kEpilogueMinThreads = 64;
constexpr int kEpilogueBlockCap = 512;  // qk_epilogue.cuh's kEpilogueMaxThreads
/// Stages of the ring: three while a stage is small (more rows in flight per block), else two.
constexpr std::size_t kEpilogueDeepStageBytes = 16 * 1024;

/// @brief Elements per access: 16 bytes of the model dtype when every pointer, stride and width
/// the kernel touches with vectors allows it (and a rotation pairs whole vectors: NeoX needs
/// rotary_dim / 2, GPT-J rotary_dim, to be a multiple of it), else 1.
int epilogue_vector_elems(const QkEpilogueParams& p);

struct EpilogueShape {
  int vec = 1;      ///< elements per access
  int threads = 0;  ///< per block (one token at a time)
  int stages = 2;   ///< ring depth
  int cs_copy_bytes = 2;  ///< unit in which a cos/sin row is staged: 16, 4 or 2
};

/// @brief The shape for p with access width vec and a ring stage of stage_bytes.
EpilogueShape epilogue_shape(const QkEpilogueParams& p, int vec, std::size_t stage_bytes);

/// @brief Whether the launch exchanges partial sums (layerwise with more than one rank).
constexpr bool epilogue_exchanges(const QkEpilogueParams& p, int world) {
  return p.scope == NormScope::kLayerwise && world > 1;
}

}  // namespace swiftqk
