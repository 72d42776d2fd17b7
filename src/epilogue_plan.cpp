// The fused QK epilogue's launch shape (epilogue_plan.hpp).
#include "epilogue_plan.hpp"

#include <algorithm>
#include <string>

#include "swiftqk/error.hpp"

namespace swiftqk {

namespace {

bool aligned(const void* p, std::size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

}  // namespace

int epilogue_vector_elems(const QkEpilogueParams& p) {
  const int vec = static_cast<int>(16 / dtype_size(p.dtype));
  const bool rotation = p.rope.style == RopeStyle::kNeox ? (p.rope.rotary_dim / 2) % vec == 0
                                                         : p.rope.rotary_dim % vec == 0;
  bool ok = p.head_dim % vec == 0 && rotation;
  for (const void* ptr : {p.q, p.k, p.v, p.q_weight, p.k_weight}) ok = ok && aligned(ptr, 16);
  for (int64_t s : {p.q_stride, p.k_stride, p.v_stride, p.q_out_stride}) ok = ok && s % vec == 0;
  ok = ok && aligned(p.q_out, vec * dtype_size(p.q_out_dtype));
  if (p.k_out != nullptr) ok = ok && aligned(p.k_out, 16) && p.k_out_stride % vec == 0;
  const std::size_t cache_access = vec * dtype_size(p.cache.dtype);
  ok = ok && aligned(p.cache.k, cache_access) && aligned(p.cache.v, cache_access);
  for (int64_t s : {p.cache.block_stride, p.cache.slot_stride, p.cache.head_stride}) {
    ok = ok && s % vec == 0;
  }
  return ok ? vec : 1;
}

int epilogue_pair_items(const QkEpilogueParams& p, int vec) {
  const int64_t half = p.rope.rotary_dim / 2;
  const bool neox = p.rope.style == RopeStyle::kNeox;
  return static_cast<int>(neox ? half / vec : (vec == 1 ? half : 0));
}

int epilogue_items_per_head(const QkEpilogueParams& p, int vec) {
  const int64_t pairs = epilogue_pair_items(p, vec);
  const int64_t single_from = pairs > 0 ? p.rope.rotary_dim : 0;
  return static_cast<int>(pairs + (p.head_dim - single_from) / vec);
}

uint32_t epilogue_div_magic(uint32_t d) {
  if (d <= 1) return 0;
  return static_cast<uint32_t>(((uint64_t{1} << 32) + d - 1) / d);
}

EpilogueShape epilogue_shape(const QkEpilogueParams& p, int world, int vec,
                             std::size_t stage_bytes) {
  const EpilogueTuning& t = p.tuning;
  EpilogueShape s;
  s.vec = vec;
  const int64_t units = (p.num_q_heads + 2 * p.num_kv_heads) * p.head_dim / vec;
  const bool exchanges = epilogue_exchanges(p, world);
  const int per_thread = exchanges && p.tokens <= kEpilogueFewTokensMax
                             ? kEpilogueFewTokenUnitsPerThread
                             : kEpilogueUnitsPerThread;
  int threads = kEpilogueMinThreads;
  while (threads < kEpilogueBlockCap && threads * per_thread < units) threads <<= 1;
  s.threads = t.block_threads != 0 ? t.block_threads : threads;
  int log2_world = 0;
  while ((1 << log2_world) < world) ++log2_world;
  SWIFTQK_EXPECTS(exchanges || t.defer <= 0,
                  "QkEpilogueParams.tuning.defer = " + std::to_string(t.defer) +
                      ": a launch that exchanges nothing (TP 1, or a headwise norm) defers "
                      "nothing; give 0 or -1 (tuned)");
  const int max_defer =
      p.tokens <= kEpilogueFewTokensMax ? kEpilogueFewTokensMaxDefer : kEpilogueMaxDefer;
  const int policy_defer = exchanges ? std::min(log2_world, max_defer) : 0;
  const int ahead = !exchanges && stage_bytes <= kEpilogueDeepStageBytes ? 2 : 1;
  if (t.stages != 0) {
    s.stages = t.stages;
    s.defer = t.defer >= 0 ? t.defer : std::min(policy_defer, t.stages - 2);
  } else {
    s.defer = t.defer >= 0 ? t.defer : policy_defer;
    s.stages = std::min(kEpilogueStageCap, s.defer + 1 + ahead);
  }
  s.cs_copy_bytes = epilogue_cos_sin_copy_bytes(p);
  const bool det = epilogue_canonical_sums(p);
  SWIFTQK_EXPECTS(t.weights != 2 || (exchanges && !det),
                  std::string("QkEpilogueParams.tuning.weights = 2: ") +
                      (det ? "the deterministic mode"
                           : "a launch that exchanges nothing (TP 1, or a headwise norm)") +
                      " stages its weights in shared memory; give 0 (tuned) or 1");
  s.weights_global = t.weights == 2;
  return s;
}

int epilogue_token_split(const QkEpilogueParams& p, int world, int vec, int64_t tokens, int ranks,
                         int64_t pairs, int sms) {
  // Written in place, a part's Q or K items would overwrite a row the token's other parts may
  // not have staged yet for their sums.
  const bool in_place = p.q_out == p.q || (p.k_out != nullptr && p.k_out == p.k);
  const char* whole = epilogue_exchanges(p, world) ? "a launch that exchanges partial sums"
                      : vec == 1                   ? "the element path"
                      : epilogue_canonical_sums(p) ? "the deterministic mode"
                      : in_place                   ? "a launch that writes Q or K in place"
                                                   : nullptr;
  if (whole != nullptr) {
    SWIFTQK_EXPECTS(p.tuning.split <= 1,
                    "QkEpilogueParams.tuning.split = " + std::to_string(p.tuning.split) + ": " +
                        whole + " splits no token; give 0 (tuned) or 1");
    return 1;
  }
  if (p.tuning.split != 0) return p.tuning.split;
  int split = 1;
  if (pairs < kEpilogueMinSplitPairs) return split;
  while (split < kEpiloguePolicySplit &&
         tokens * ranks * split * 2 * kEpilogueSplitSmShare <= sms) {
    split *= 2;
  }
  return split;
}

int epilogue_cos_sin_copy_bytes(const QkEpilogueParams& p) {
  const std::size_t cs_row = static_cast<std::size_t>(p.rope.rotary_dim) *
                             (p.rope.cache_dtype == DType::kF32 ? 4 : dtype_size(p.dtype));
  const auto base = reinterpret_cast<uintptr_t>(p.rope.cos_sin_cache);
  return base % 16 == 0 && cs_row % 16 == 0 ? 16 : (base % 4 == 0 && cs_row % 4 == 0 ? 4 : 2);
}

}  // namespace swiftqk
