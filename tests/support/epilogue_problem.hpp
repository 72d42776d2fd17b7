// Fused QK epilogue problems for the GPU tests and the benchmark: a full random problem on the
// host (fused QKV rows, weights, a real RoPE cos/sin table, positions, slots), one rank's device
// buffers (QKV as one fused buffer with Q, K and V as column views, a paged cache per rank), and
// the check of what a rank wrote against the float64 gold, the cache compared byte for byte
// outside the slots the call owns.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "epilogue_reference.hpp"
#include "problem.hpp"
#include "swiftqk/communicator.hpp"

namespace swiftqk::testing {

/// What a test or benchmark point varies. Heads are the model's (all ranks).
struct EpilogueSetup {
  int64_t tokens = 64;
  int64_t q_heads = 16, kv_heads = 16, head_dim = 128, rotary_dim = 128;
  NormScope scope = NormScope::kLayerwise;
  NormOrder order = NormOrder::kOlmo2;
  RopeStyle style = RopeStyle::kNeox;
  DType dtype = DType::kBF16;
  DType q_out_dtype = DType::kBF16;  ///< dtype, or fp8
  DType cache_dtype = DType::kBF16;  ///< dtype, or fp8
  DType cos_sin_dtype = DType::kF32;
  bool in_place = true;  ///< q_out is the Q view of the QKV buffer (model-dtype q_out only)
  bool k_out = false;    ///< also write K to a dense [tokens, kv width] buffer
  bool hnd = false;      ///< cache layout [blocks, heads, block_size, head_dim] instead of NHD
  bool weight_plus_one = false;
  bool unaligned = false;  ///< QKV rows start one element off 16 bytes (the element path)
  int64_t block_size = 16;
  int64_t max_position = 4096;
  double padding = 0.1;  ///< fraction of tokens with slot -1
  float eps = 1e-6f;
  uint64_t seed = 1;
  /// Cache blocks: enough for every token's slot, spread over 4x as many (slots across many
  /// blocks, most of the cache untouched by a call).
  int64_t num_blocks() const { return 4 * ((tokens + block_size - 1) / block_size) + 1; }
  std::string name() const;
};

/// The full problem: stored bits (the model dtype) and their exact values (ref::EpilogueProblem).
struct EpilogueHost {
  EpilogueSetup s;
  ref::EpilogueProblem ref;
  std::vector<uint8_t> q, k, v;  ///< [tokens, heads * head_dim], model dtype
  std::vector<uint8_t> wq, wk;   ///< weights, model dtype (full rows, or [head_dim])
  std::vector<uint8_t> cos_sin;  ///< [max_position, rotary_dim], cos_sin_dtype
  std::vector<int64_t> slots;    ///< [tokens]; distinct, or -1
  float q_scale = 1.f, k_scale = 1.f, v_scale = 1.f;  ///< fp8 scales (amax / 448 of the gold)
  static EpilogueHost random(const EpilogueSetup& s);
  /// Fresh Q, K, V values (weights, table, positions and slots kept).
  void refill(uint64_t seed);
  int64_t cache_slots() const { return s.num_blocks() * s.block_size; }
};

/// One rank's device buffers and parameters. qkv is [tokens, (q + 2 kv) local width], Q, K and V
/// its column views; the caches are this rank's heads only.
struct EpilogueRank {
  DeviceBuffer qkv, q_out, k_out, k_cache, v_cache, wq, wk, cos_sin, positions, slots, scales;
  QkEpilogueParams params;
  std::size_t cache_bytes = 0;  ///< of each of k_cache and v_cache
};

EpilogueRank make_epilogue_rank(const EpilogueHost& h, int world, int rank);
/// Uploads h's current Q, K, V (and positions, slots) into an existing rank.
void upload_epilogue_inputs(const EpilogueHost& h, int world, int rank, EpilogueRank& d,
                            cudaStream_t s);
/// Fills q_out (out of place), k_out and both caches with a seeded byte pattern (not zeros)
/// and returns nothing; snapshot_caches then records them.
void poison_epilogue(EpilogueRank& d, uint64_t seed, cudaStream_t s);

struct CacheSnapshot {
  std::vector<uint8_t> k, v;
};
CacheSnapshot snapshot_caches(const EpilogueRank& d);

/// What a call may have left. kCorrect: every output right. kCorrectOrFailed (a call of a
/// failed group): each element of Q and k_out right or NaN, and each cache element at the call's
/// slots right or as it was before the call (a token the kernel did not finish writes no K; its
/// V, copied before the exchange, may be written); finite wrong values and stray cache bytes are
/// errors either way.
enum class EpilogueExpect { kCorrect, kCorrectOrFailed };

struct EpilogueCheck {
  int64_t q_wrong = 0, k_wrong = 0, v_wrong = 0, k_out_wrong = 0;
  int64_t cache_changed = 0;  ///< bytes changed outside the call's valid slots
  int64_t checked = 0;        ///< elements compared
  int64_t q_nan = 0;          ///< kCorrectOrFailed: Q elements that are NaN
  int64_t k_unwritten = 0;    ///< kCorrectOrFailed: K cache elements left as they were
  std::string first_error;
  bool ok() const {
    return q_wrong == 0 && k_wrong == 0 && v_wrong == 0 && k_out_wrong == 0 && cache_changed == 0;
  }
};

/// Checks one rank's outputs against gold (epilogue_fp64 of h): Q (its columns), K in the cache
/// at each token's slot (and k_out), V in the cache (bit-exact: a copy or one quantisation), and
/// every other cache byte against `before`. Tokens listed in `bad_tokens` must have a NaN Q row
/// and no cache write. `roundings` scales the model dtype's part of the bound: 1 for the fused
/// kernel; the unfused chain rounds its normalised Q and K to the model dtype before rotating
/// them and rounds again after, twice the fused kernel's roundings.
EpilogueCheck check_epilogue_rank(const EpilogueHost& h, const ref::EpilogueExpected& gold,
                                  int world, int rank, const EpilogueRank& d,
                                  const CacheSnapshot& before,
                                  const std::vector<int64_t>& bad_tokens = {},
                                  double roundings = 1.0,
                                  EpilogueExpect expect = EpilogueExpect::kCorrect);

}  // namespace swiftqk::testing
