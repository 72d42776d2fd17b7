// validate_epilogue_params: the fused QK epilogue's argument checks, run before any launch (a bad
// call throws and writes nothing). Scalars first (they alone decide a no-op call with 0 tokens),
// then pointers, alignment, extents and overlaps.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "epilogue_plan.hpp"
#include "extent.hpp"
#include "kernels/launch_args.hpp"
#include "launch_plan.hpp"
#include "swiftqk/error.hpp"
#include "swiftqk/qk_epilogue_params.hpp"

namespace swiftqk {
namespace {

std::string num(int64_t v) { return std::to_string(v); }

bool is_dtype(DType t) {
  const int v = static_cast<int>(t);
  return v >= 0 && v <= static_cast<int>(DType::kF8E4M3);
}

// The dtype's name, or its number when it is no DType at all.
std::string name_of(DType t) {
  return is_dtype(t) ? to_string(t) : "DType(" + num(static_cast<int>(t)) + ")";
}

// heads x head_dim, the width of a row of this rank's Q (or K, V).
int64_t row_width(const char* heads_name, int64_t heads, int64_t head_dim) {
  int64_t w = 0;
  SWIFTQK_EXPECTS(
      !__builtin_mul_overflow(heads, head_dim, &w),
      std::string(heads_name) + " x head_dim overflows: " + num(heads) + " x " + num(head_dim));
  return w;
}

void check_stride(const char* name, int64_t stride, int64_t width, const char* width_name) {
  SWIFTQK_EXPECTS(stride >= width, std::string(name) + " " + num(stride) +
                                       " is smaller than the row width " + width_name + " = " +
                                       num(width));
}

// One dimension of the paged cache: its stride in elements and how many indices it takes.
struct CacheDim {
  const char* stride_name;
  const char* extent_name;
  int64_t stride, extent;
};

// Checks that no two (block, slot, head, element) of the cache share an address and returns the
// elements one cache spans (its largest offset + 1). Sufficient condition, which every real
// layout (NHD, HND, padded) meets: the dimensions taking more than one index, sorted by stride,
// nest, each stride at least the span (stride x extent) of the one below it.
// The cache's dimensions that take more than one index (a single index never collides with
// itself), innermost (smallest stride) first.
std::vector<CacheDim> cache_dims(const PagedKvCache& c, int64_t kv_heads, int64_t head_dim) {
  // Innermost first, so that on equal strides the message blames the outer dimension.
  const std::array<CacheDim, 4> all = {{
      {"1 (the element stride)", "head_dim", 1, head_dim},
      {"cache.head_stride", "num_kv_heads", c.head_stride, kv_heads},
      {"cache.slot_stride", "cache.block_size", c.slot_stride, c.block_size},
      {"cache.block_stride", "cache.num_blocks", c.block_stride, c.num_blocks},
  }};
  std::vector<CacheDim> dims;
  for (const CacheDim& d : all) {
    if (d.extent > 1) dims.push_back(d);
  }
  std::stable_sort(dims.begin(), dims.end(),
                   [](const CacheDim& a, const CacheDim& b) { return a.stride < b.stride; });
  return dims;
}

int64_t cache_span_elements(const PagedKvCache& c, int64_t kv_heads, int64_t head_dim) {
  const std::vector<CacheDim> dims = cache_dims(c, kv_heads, head_dim);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const CacheDim& d = dims[i];
    SWIFTQK_EXPECTS(d.stride > 0, std::string("cache geometry: ") + d.stride_name + " is 0 but " +
                                      d.extent_name + " is " + num(d.extent) +
                                      ", so two of them share an address");
    if (i == 0) continue;
    const CacheDim& below = dims[i - 1];
    int64_t span = 0;
    const bool fits =
        !__builtin_mul_overflow(below.stride, below.extent, &span) && d.stride >= span;
    SWIFTQK_EXPECTS(fits, std::string("cache geometry: ") + d.stride_name + " " + num(d.stride) +
                              " is smaller than " + below.stride_name + " x " + below.extent_name +
                              " = " + num(below.stride) + " x " + num(below.extent) + " = " +
                              num(span) + ", so two (block, slot, head, element) share an address");
  }
  // Largest offset + 1, bounded by kMaxExtentBytes; a huge stride could overflow before the
  // bound is reached, so every step is checked.
  uint64_t span = 1;
  bool ok = true;
  for (const CacheDim& d : dims) {
    uint64_t term = 0;
    ok = ok &&
         !__builtin_mul_overflow(static_cast<uint64_t>(d.stride),
                                 static_cast<uint64_t>(d.extent - 1), &term) &&
         !__builtin_add_overflow(span, term, &span);
  }
  uint64_t bytes = 0;
  ok = ok && !__builtin_mul_overflow(span, static_cast<uint64_t>(dtype_size(c.dtype)), &bytes) &&
       bytes <= kMaxExtentBytes;
  SWIFTQK_EXPECTS(ok,
                  "cache.k and cache.v would each span more than 2^50 bytes (the cache's strides "
                  "x extents too large)");
  return static_cast<int64_t>(span);
}

// Whether `delta` elements is the offset between two addresses of one cache: delta = sum of
// c_i x stride_i with |c_i| < extent_i over dims[0..n). The dims nest (cache_span_elements
// checked it), so the lower dims reach less than stride_{n-1} either way and c_{n-1} is delta /
// stride rounded down or up: at most two branches a dimension.
bool is_offset_difference(const std::vector<CacheDim>& dims, std::size_t n, int64_t delta) {
  if (n == 0) return delta == 0;
  const CacheDim& d = dims[n - 1];
  int64_t reach = 0;  // the largest |difference| the dims below can make
  for (std::size_t i = 0; i + 1 < n; ++i) reach += dims[i].stride * (dims[i].extent - 1);
  const int64_t lo = delta >= 0 ? delta / d.stride : -((-delta + d.stride - 1) / d.stride);
  for (int64_t c : {lo, lo + 1}) {
    if (c <= -d.extent || c >= d.extent) continue;
    const int64_t rest = delta - c * d.stride;
    if (rest >= -reach && rest <= reach && is_offset_difference(dims, n - 1, rest)) return true;
  }
  return false;
}

// K and V may share a buffer with their elements interleaved (FlashInfer's [num_blocks, 2,
// block_size, heads, head_dim]): their byte ranges then meet, but no element of one is an
// element of the other. True when that holds exactly: v - k is whole elements and not the offset
// between two addresses of the (common) geometry.
bool caches_interleave_disjointly(const PagedKvCache& c, int64_t kv_heads, int64_t head_dim) {
  const intptr_t bytes = reinterpret_cast<intptr_t>(c.v) - reinterpret_cast<intptr_t>(c.k);
  const intptr_t es = static_cast<intptr_t>(dtype_size(c.dtype));
  if (bytes % es != 0) return false;
  const std::vector<CacheDim> dims = cache_dims(c, kv_heads, head_dim);
  return !is_offset_difference(dims, dims.size(), static_cast<int64_t>(bytes / es));
}

void check_scalars(const QkEpilogueParams& p, int world_size) {
  // The largest group a communicator takes (one lane of the polling warp per rank).
  SWIFTQK_EXPECTS(
      world_size >= 1 && world_size <= detail::kMaxWorld,
      "world_size must be in [1, " + num(detail::kMaxWorld) + "], got " + num(world_size));
  SWIFTQK_EXPECTS(p.tokens >= 0, "tokens must be >= 0, got " + num(p.tokens));
  SWIFTQK_EXPECTS(is_dtype(p.dtype), "dtype is not a DType: " + name_of(p.dtype));
  SWIFTQK_EXPECTS(
      p.dtype == DType::kBF16 || p.dtype == DType::kF16,
      "dtype: the epilogue takes bf16 or f16 models (q, k, v, weights), got " + name_of(p.dtype));
  SWIFTQK_EXPECTS(p.num_q_heads > 0, "num_q_heads must be > 0, got " + num(p.num_q_heads));
  SWIFTQK_EXPECTS(p.num_kv_heads > 0, "num_kv_heads must be > 0, got " + num(p.num_kv_heads));
  SWIFTQK_EXPECTS(p.head_dim > 0, "head_dim must be > 0, got " + num(p.head_dim));
  SWIFTQK_EXPECTS(p.head_dim % 2 == 0, "head_dim must be even, got " + num(p.head_dim));
  const int64_t qw = row_width("num_q_heads", p.num_q_heads, p.head_dim);
  const int64_t kw = row_width("num_kv_heads", p.num_kv_heads, p.head_dim);

  SWIFTQK_EXPECTS(p.scope == NormScope::kLayerwise || p.scope == NormScope::kHeadwise,
                  "scope is not a NormScope: " + num(static_cast<int>(p.scope)));
  SWIFTQK_EXPECTS(p.order == NormOrder::kOlmo2 || p.order == NormOrder::kLlama,
                  "order is not a NormOrder: " + num(static_cast<int>(p.order)));
  SWIFTQK_EXPECTS(std::isfinite(p.eps) && p.eps > 0.f,
                  "eps must be finite and > 0, got " + std::to_string(p.eps));
  SWIFTQK_EXPECTS(!p.weight_plus_one || p.scope == NormScope::kHeadwise,
                  "weight_plus_one (Gemma-3's 1 + w) needs scope == NormScope::kHeadwise");
  if (epilogue_canonical_sums(p)) {
    // The canonical order: 16 segments of each full row, rank r holding 16 / world of them.
    check_canonical_split(qw, kw, static_cast<int>(16 / dtype_size(p.dtype)), world_size);
  }

  SWIFTQK_EXPECTS(p.q_out_dtype == p.dtype || p.q_out_dtype == DType::kF8E4M3,
                  "q_out_dtype must be the model dtype " + name_of(p.dtype) + " or f8e4m3, got " +
                      name_of(p.q_out_dtype));
  check_stride("q_stride", p.q_stride, qw, "num_q_heads x head_dim");
  check_stride("k_stride", p.k_stride, kw, "num_kv_heads x head_dim");
  check_stride("v_stride", p.v_stride, kw, "num_kv_heads x head_dim");
  check_stride("q_out_stride", p.q_out_stride, qw, "num_q_heads x head_dim");
  if (p.k_out != nullptr) {
    check_stride("k_out_stride", p.k_out_stride, kw, "num_kv_heads x head_dim");
  }

  const RopeParams& r = p.rope;
  SWIFTQK_EXPECTS(r.style == RopeStyle::kNeox || r.style == RopeStyle::kGptj,
                  "rope.style is not a RopeStyle: " + num(static_cast<int>(r.style)));
  SWIFTQK_EXPECTS(r.rotary_dim >= 2 && r.rotary_dim <= p.head_dim && r.rotary_dim % 2 == 0,
                  "rope.rotary_dim must be even and in [2, head_dim = " + num(p.head_dim) +
                      "], got " + num(r.rotary_dim));
  SWIFTQK_EXPECTS(r.max_position >= 1,
                  "rope.max_position must be >= 1, got " + num(r.max_position));
  SWIFTQK_EXPECTS(r.cache_dtype == DType::kF32 || r.cache_dtype == p.dtype,
                  "rope.cache_dtype must be f32 or the model dtype " + name_of(p.dtype) + ", got " +
                      name_of(r.cache_dtype));

  const PagedKvCache& c = p.cache;
  SWIFTQK_EXPECTS(c.dtype == p.dtype || c.dtype == DType::kF8E4M3,
                  "cache.dtype must be the model dtype " + name_of(p.dtype) + " or f8e4m3, got " +
                      name_of(c.dtype));
  SWIFTQK_EXPECTS(c.num_blocks >= 1, "cache.num_blocks must be >= 1, got " + num(c.num_blocks));
  SWIFTQK_EXPECTS(c.block_size >= 1, "cache.block_size must be >= 1, got " + num(c.block_size));
  SWIFTQK_EXPECTS(c.block_stride >= 0,
                  "cache.block_stride must be >= 0, got " + num(c.block_stride));
  SWIFTQK_EXPECTS(c.slot_stride >= 0, "cache.slot_stride must be >= 0, got " + num(c.slot_stride));
  SWIFTQK_EXPECTS(c.head_stride >= 0, "cache.head_stride must be >= 0, got " + num(c.head_stride));
  (void)cache_span_elements(c, p.num_kv_heads, p.head_dim);
}

void check_not_null(const void* ptr, const char* name) {
  SWIFTQK_EXPECTS(ptr != nullptr, std::string(name) + " is null");
}

void check_aligned(const void* ptr, std::size_t bytes, const char* name, const std::string& what) {
  SWIFTQK_EXPECTS(is_aligned(ptr, bytes), std::string(name) + " is not aligned to " +
                                              num(static_cast<int64_t>(bytes)) + " bytes (" + what +
                                              ")");
}

// One tensor the kernel reads or writes, for the overlap checks.
struct Named {
  const char* name;
  Extent extent;
};

}  // namespace

void EpilogueTuning::validate() const {
  const std::string who = "QkEpilogueParams.tuning.";
  SWIFTQK_EXPECTS(
      block_threads == 0 ||
          (block_threads >= 32 && block_threads <= kEpilogueBlockCap && block_threads % 32 == 0),
      who + "block_threads = " + num(block_threads) + " is not a multiple of 32 in [32, " +
          num(kEpilogueBlockCap) + "] (0 = tuned)");
  SWIFTQK_EXPECTS(stages == 0 || (stages >= 2 && stages <= kEpilogueStageCap),
                  who + "stages = " + num(stages) + " is outside [2, " + num(kEpilogueStageCap) +
                      "] (0 = tuned)");
  const int max_defer = stages != 0 ? std::min(kEpilogueDeferCap, stages - 2) : kEpilogueDeferCap;
  SWIFTQK_EXPECTS(defer == -1 || (defer >= 0 && defer <= max_defer),
                  who + "defer = " + num(defer) + " is outside [0, " + num(max_defer) + "] (" +
                      (stages != 0 ? "stages - 2 with stages = " + num(stages)
                                   : std::string("the kernel's largest")) +
                      "; -1 = tuned)");
  SWIFTQK_EXPECTS(
      split == 0 || (split >= 1 && split <= kEpilogueMaxSplit && (split & (split - 1)) == 0),
      who + "split = " + num(split) + " is not a power of two in [1, " + num(kEpilogueMaxSplit) +
          "] (0 = tuned)");
  SWIFTQK_EXPECTS(weights >= 0 && weights <= 2,
                  who + "weights = " + num(weights) +
                      " is not 1 (shared memory) or 2 (global memory); 0 = tuned");
}

void validate_epilogue_params(const QkEpilogueParams& p, int world_size) {
  check_scalars(p, world_size);
  p.tuning.validate();
  if (p.tokens == 0) return;  // nothing is read or written

  const RopeParams& r = p.rope;
  const PagedKvCache& c = p.cache;
  const bool fp8_q_out = p.q_out_dtype == DType::kF8E4M3;
  const bool fp8_cache = c.dtype == DType::kF8E4M3;
  check_not_null(p.q, "q");
  check_not_null(p.k, "k");
  check_not_null(p.v, "v");
  check_not_null(p.q_out, "q_out");
  check_not_null(p.q_weight, "q_weight");
  check_not_null(p.k_weight, "k_weight");
  check_not_null(r.positions, "rope.positions");
  check_not_null(r.cos_sin_cache, "rope.cos_sin_cache");
  check_not_null(c.k, "cache.k");
  check_not_null(c.v, "cache.v");
  check_not_null(c.slot_mapping, "cache.slot_mapping");
  if (fp8_q_out) check_not_null(p.q_out_scale, "q_out_scale (needed by an fp8 q_out)");
  if (fp8_cache) {
    check_not_null(c.k_scale, "cache.k_scale (needed by an fp8 cache)");
    check_not_null(c.v_scale, "cache.v_scale (needed by an fp8 cache)");
  }

  const std::size_t es = dtype_size(p.dtype);
  const std::string model = name_of(p.dtype);
  check_aligned(p.q, es, "q", model);
  check_aligned(p.k, es, "k", model);
  check_aligned(p.v, es, "v", model);
  check_aligned(p.q_out, dtype_size(p.q_out_dtype), "q_out", name_of(p.q_out_dtype));
  if (p.k_out != nullptr) check_aligned(p.k_out, es, "k_out", model);
  check_aligned(p.q_weight, es, "q_weight", model);
  check_aligned(p.k_weight, es, "k_weight", model);
  check_aligned(r.positions, sizeof(int64_t), "rope.positions", "int64");
  check_aligned(r.cos_sin_cache, dtype_size(r.cache_dtype), "rope.cos_sin_cache",
                name_of(r.cache_dtype));
  check_aligned(c.k, dtype_size(c.dtype), "cache.k", name_of(c.dtype));
  check_aligned(c.v, dtype_size(c.dtype), "cache.v", name_of(c.dtype));
  check_aligned(c.slot_mapping, sizeof(int64_t), "cache.slot_mapping", "int64");
  if (fp8_q_out) check_aligned(p.q_out_scale, sizeof(float), "q_out_scale", "f32");
  if (fp8_cache) {
    check_aligned(c.k_scale, sizeof(float), "cache.k_scale", "f32");
    check_aligned(c.v_scale, sizeof(float), "cache.v_scale", "f32");
  }

  const int64_t qw = p.num_q_heads * p.head_dim, kw = p.num_kv_heads * p.head_dim;
  const bool layerwise = p.scope == NormScope::kLayerwise;
  const int64_t qww = layerwise ? qw : p.head_dim, kww = layerwise ? kw : p.head_dim;
  const int64_t T = p.tokens;
  const Extent q = extent_of("q", p.q, T, qw, p.q_stride, es);
  const Extent k = extent_of("k", p.k, T, kw, p.k_stride, es);
  const Extent v = extent_of("v", p.v, T, kw, p.v_stride, es);
  const Extent q_out =
      extent_of("q_out", p.q_out, T, qw, p.q_out_stride, dtype_size(p.q_out_dtype));
  const Extent q_weight = extent_of("q_weight", p.q_weight, 1, qww, qww, es);
  const Extent k_weight = extent_of("k_weight", p.k_weight, 1, kww, kww, es);
  const Extent positions = extent_of("rope.positions", r.positions, 1, T, T, sizeof(int64_t));
  const Extent cos_sin =
      extent_of("rope.cos_sin_cache", r.cos_sin_cache, r.max_position, r.rotary_dim, r.rotary_dim,
                dtype_size(r.cache_dtype), "max_position x rotary_dim too large");
  const Extent slots = extent_of("cache.slot_mapping", c.slot_mapping, 1, T, T, sizeof(int64_t));
  // A cache is taken as the plain byte range from its pointer to its largest offset.
  const int64_t span = cache_span_elements(c, p.num_kv_heads, p.head_dim);
  const char* cache_hint = "the cache's strides x extents too large";
  const Extent cache_k = extent_of("cache.k", c.k, 1, span, span, dtype_size(c.dtype), cache_hint);
  const Extent cache_v = extent_of("cache.v", c.v, 1, span, span, dtype_size(c.dtype), cache_hint);

  // Everything read besides q and k, which an in-place output may be.
  std::vector<Named> read = {{"v", v},
                             {"q_weight", q_weight},
                             {"k_weight", k_weight},
                             {"rope.positions", positions},
                             {"rope.cos_sin_cache", cos_sin},
                             {"cache.slot_mapping", slots}};
  const std::size_t fs = sizeof(float);
  if (fp8_q_out) {
    read.push_back({"q_out_scale", extent_of("q_out_scale", p.q_out_scale, 1, 1, 1, fs)});
  }
  if (fp8_cache) {
    read.push_back({"cache.k_scale", extent_of("cache.k_scale", c.k_scale, 1, 1, 1, fs)});
    read.push_back({"cache.v_scale", extent_of("cache.v_scale", c.v_scale, 1, 1, 1, fs)});
  }
  std::vector<Named> written = {{"q_out", q_out}, {"cache.k", cache_k}, {"cache.v", cache_v}};
  if (p.k_out != nullptr) {
    written.push_back({"k_out", extent_of("k_out", p.k_out, T, kw, p.k_out_stride, es)});
  }

  // In place: an output exactly its input (same pointer, stride and dtype); any other overlap of
  // the two is an error.
  const bool q_in_place = p.q_out == p.q && p.q_out_stride == p.q_stride;
  SWIFTQK_EXPECTS(!q_in_place || !fp8_q_out,
                  "q_out is q but q_out_dtype is f8e4m3: in place needs q_out_dtype == dtype");
  SWIFTQK_EXPECTS(q_in_place || !overlaps(q_out, q),
                  "q_out partly overlaps q (in place needs the same pointer and stride)");
  const bool k_in_place = p.k_out == p.k && p.k_out_stride == p.k_stride;
  for (const Named& w : written) {
    const std::string wn(w.name);
    if (wn == "k_out") {
      SWIFTQK_EXPECTS(k_in_place || !overlaps(w.extent, k),
                      "k_out overlaps k (in place needs the same pointer and stride)");
    } else {
      SWIFTQK_EXPECTS(!overlaps(w.extent, k), wn + " overlaps k");
    }
    if (wn != "q_out") SWIFTQK_EXPECTS(!overlaps(w.extent, q), wn + " overlaps q");
    for (const Named& rd : read) {
      SWIFTQK_EXPECTS(!overlaps(w.extent, rd.extent), wn + " overlaps " + rd.name);
    }
  }
  const bool kv_interleaved = caches_interleave_disjointly(c, p.num_kv_heads, p.head_dim);
  for (std::size_t i = 0; i < written.size(); ++i) {
    for (std::size_t j = i + 1; j < written.size(); ++j) {
      const bool kv_pair =
          std::string(written[i].name) == "cache.k" && std::string(written[j].name) == "cache.v";
      SWIFTQK_EXPECTS(
          (kv_pair && kv_interleaved) || !overlaps(written[i].extent, written[j].extent),
          std::string(written[i].name) + " and " + written[j].name + " overlap");
    }
  }
}

}  // namespace swiftqk
