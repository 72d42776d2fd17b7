// Argument checks run before any launch: a bad call throws and writes nothing.
#include <cmath>
#include <cstdint>
#include <string>

#include "extent.hpp"
#include "launch_plan.hpp"
#include "swiftqk/comm_config.hpp"
#include "swiftqk/error.hpp"
#include "swiftqk/qk_norm_params.hpp"

namespace swiftqk {

namespace {

void check_shard(const char* name, const ShardView& v, int64_t tokens, int64_t full_width,
                 int world, DType in_t, DType out_t) {
  const std::string n(name);
  SWIFTQK_EXPECTS(full_width > 0,
                  n + "_full_width must be positive, got " + std::to_string(full_width));
  SWIFTQK_EXPECTS(full_width % world == 0, n + "_full_width " + std::to_string(full_width) +
                                               " is not divisible by the TP degree " +
                                               std::to_string(world));
  // K heads replicated over ranks (fewer KV heads than TP ranks, as engines shard them) show up
  // as shards that together are a multiple of the full width: say so.
  const bool replicated =
      v.width > 0 && v.width * world > full_width && (v.width * world) % full_width == 0;
  SWIFTQK_EXPECTS(
      v.width == full_width / world,
      n + ".width is " + std::to_string(v.width) + " but " + n +
          "_full_width / TP = " + std::to_string(full_width / world) +
          (replicated ? " (the shards add up to " + std::to_string(v.width * world / full_width) +
                            " x " + n + "_full_width: replicated heads are not supported yet)"
                      : std::string()));
  SWIFTQK_EXPECTS(v.in_stride >= v.width, n + ".in_stride " + std::to_string(v.in_stride) +
                                              " is smaller than the width " +
                                              std::to_string(v.width));
  SWIFTQK_EXPECTS(v.out_stride >= v.width, n + ".out_stride " + std::to_string(v.out_stride) +
                                               " is smaller than the width " +
                                               std::to_string(v.width));
  SWIFTQK_EXPECTS(std::isfinite(v.in_scale) && v.in_scale > 0.f,
                  n + ".in_scale must be finite and positive");
  SWIFTQK_EXPECTS(in_t == DType::kF8E4M3 || v.in_scale == 1.f,
                  n + ".in_scale applies to fp8 inputs only; it must be 1 for " + to_string(in_t));
  if (tokens == 0) return;
  SWIFTQK_EXPECTS(v.in != nullptr, n + ".in is null");
  SWIFTQK_EXPECTS(v.out != nullptr, n + ".out is null");
  SWIFTQK_EXPECTS(v.weight != nullptr, n + ".weight is null");
  auto aligned = [](const void* p, std::size_t a) {
    return reinterpret_cast<uintptr_t>(p) % a == 0;
  };
  SWIFTQK_EXPECTS(aligned(v.in, dtype_size(in_t)),
                  n + ".in is not aligned to its element size (" + to_string(in_t) + ")");
  SWIFTQK_EXPECTS(aligned(v.out, dtype_size(out_t)),
                  n + ".out is not aligned to its element size (" + to_string(out_t) + ")");
  SWIFTQK_EXPECTS(aligned(v.weight, dtype_size(out_t)),
                  n + ".weight is not aligned to its element size (" + to_string(out_t) + ")");
}

}  // namespace

void validate_params(const QkNormParams& p, int world) {
  SWIFTQK_EXPECTS(world >= 1, "TP degree must be >= 1");
  SWIFTQK_EXPECTS(p.tokens >= 0, "tokens must be >= 0, got " + std::to_string(p.tokens));
  SWIFTQK_EXPECTS(std::isfinite(p.eps) && p.eps > 0.f,
                  "eps must be finite and > 0, got " + std::to_string(p.eps));
  SWIFTQK_EXPECTS(p.order == NormOrder::kOlmo2 || p.order == NormOrder::kLlama,
                  "order must be NormOrder::kOlmo2 or NormOrder::kLlama");
  const int m = static_cast<int>(p.method);
  SWIFTQK_EXPECTS(m >= 0 && m <= static_cast<int>(Method::kMiniMaxEager), "method is not a Method");
  const int dt = static_cast<int>(p.in_dtype);
  SWIFTQK_EXPECTS(dt >= 0 && dt <= 3, "in_dtype is not a DType");
  p.tuning.validate();
  const DType out_t = output_dtype_for(p.in_dtype);
  check_shard("q", p.q, p.tokens, p.q_full_width, world, p.in_dtype, out_t);
  check_shard("k", p.k, p.tokens, p.k_full_width, world, p.in_dtype, out_t);
  if (p.deterministic) {
    SWIFTQK_EXPECTS(p.method == Method::kSwiftQK,
                    "deterministic mode needs Method::kSwiftQK (the baselines keep their own "
                    "reduction orders)");
    // Throws naming the TP degree or the widths that allow no canonical segments.
    (void)deterministic_kernel_shape(p.q.width, p.k.width,
                                     static_cast<int>(16 / dtype_size(p.in_dtype)), world,
                                     kDefaultBlockThreads);
  }
  if (p.tokens == 0) return;

  const std::size_t is = dtype_size(p.in_dtype), os = dtype_size(out_t);
  const Extent qi = extent_of("q.in", p.q.in, p.tokens, p.q.width, p.q.in_stride, is);
  const Extent ki = extent_of("k.in", p.k.in, p.tokens, p.k.width, p.k.in_stride, is);
  const Extent qo = extent_of("q.out", p.q.out, p.tokens, p.q.width, p.q.out_stride, os);
  const Extent ko = extent_of("k.out", p.k.out, p.tokens, p.k.width, p.k.out_stride, os);
  const Extent qw = extent_of("q.weight", p.q.weight, 1, p.q.width, p.q.width, os);
  const Extent kw = extent_of("k.weight", p.k.weight, 1, p.k.width, p.k.width, os);
  // In place is allowed when an output is exactly its input; any other overlap is an error.
  auto same = [&](const ShardView& v) {
    return v.in == v.out && v.in_stride == v.out_stride && is == os;
  };
  SWIFTQK_EXPECTS(same(p.q) || !overlaps(qo, qi),
                  "q.out partly overlaps q.in (in place needs the same pointer and stride)");
  SWIFTQK_EXPECTS(same(p.k) || !overlaps(ko, ki),
                  "k.out partly overlaps k.in (in place needs the same pointer and stride)");
  SWIFTQK_EXPECTS(!overlaps(qo, ko), "q.out and k.out overlap");
  SWIFTQK_EXPECTS(!overlaps(qo, ki), "q.out overlaps k.in");
  SWIFTQK_EXPECTS(!overlaps(ko, qi), "k.out overlaps q.in");
  for (const Extent* o : {&qo, &ko}) {
    SWIFTQK_EXPECTS(!overlaps(*o, qw) && !overlaps(*o, kw), "an output overlaps a weight");
  }
  if (p.rstd_out != nullptr) {
    SWIFTQK_EXPECTS(reinterpret_cast<uintptr_t>(p.rstd_out) % alignof(float) == 0,
                    "rstd_out is not aligned to 4 bytes");
    SWIFTQK_EXPECTS(p.tokens <= (int64_t{1} << 40), "rstd_out: too many tokens");
    const Extent r =
        extent_of("rstd_out", p.rstd_out, 1, 2 * p.tokens, 2 * p.tokens, sizeof(float));
    for (const Extent* o : {&qo, &ko, &qi, &ki, &qw, &kw}) {
      SWIFTQK_EXPECTS(!overlaps(*o, r), "rstd_out overlaps an input, output or weight");
    }
  }
}

int vector_bytes_for(const QkNormParams& p) {
  const std::size_t is = dtype_size(p.in_dtype), os = dtype_size(output_dtype_for(p.in_dtype));
  // Input vectors of `bytes` (vec elements): outputs and weights move vec elements of theirs at
  // a time, aligned to that size up to 16 bytes.
  auto ok = [&](const ShardView& v, std::size_t bytes) {
    const int64_t vec = static_cast<int64_t>(bytes / is);
    auto al = [](const void* ptr, std::size_t a) {
      return reinterpret_cast<uintptr_t>(ptr) % a == 0;
    };
    const std::size_t out_align = std::min<std::size_t>(16, vec * os);
    return v.width % vec == 0 && v.in_stride % vec == 0 && v.out_stride % vec == 0 &&
           al(v.in, bytes) && al(v.out, out_align) && al(v.weight, out_align);
  };
  for (std::size_t bytes : {std::size_t{16}, std::size_t{8}, std::size_t{4}}) {
    if (bytes / is < 2) break;  // a vector holds two elements or more
    if (ok(p.q, bytes) && ok(p.k, bytes)) return static_cast<int>(bytes);
  }
  return static_cast<int>(is);
}

void validate_config(const CommConfig& c) {
  SWIFTQK_EXPECTS(
      c.token_capacity >= 1 && c.token_capacity <= (int64_t{1} << 31),
      "CommConfig.token_capacity must be in [1, 2^31], got " + std::to_string(c.token_capacity));
  // The wait bound becomes a nanosecond count on the device: infinity, NaN or a huge value would
  // overflow it (undefined, in practice a zero bound).
  SWIFTQK_EXPECTS(
      std::isfinite(c.timeout_s) && c.timeout_s >= kMinTimeoutS && c.timeout_s <= kMaxTimeoutS,
      "CommConfig.timeout_s must be a finite number of seconds in [" +
          std::to_string(kMinTimeoutS) + ", " + std::to_string(kMaxTimeoutS) + "], got " +
          std::to_string(c.timeout_s));
  SWIFTQK_EXPECTS(c.sm_budget >= 0, "CommConfig.sm_budget must be >= 0 (0 = all SMs), got " +
                                        std::to_string(c.sm_budget));
}

}  // namespace swiftqk
