// The fused QK epilogue's reference: float64 gold, the fp32 emulation of its rounding points,
// fp8 quantisation and its tolerance, column shards.
#include "epilogue_reference.hpp"

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>

#include "reference.hpp"
#include "swiftqk/error.hpp"

namespace swiftqk {
namespace ref {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string num(int64_t v) { return std::to_string(v); }

void expect_size(const char* name, std::size_t got, int64_t want) {
  SWIFTQK_EXPECTS(got == static_cast<std::size_t>(want),
                  std::string("epilogue reference: ") + name + " has " +
                      num(static_cast<int64_t>(got)) + " elements, expected " + num(want));
}

void check_problem(const EpilogueProblem& p) {
  SWIFTQK_EXPECTS(p.tokens >= 0 && p.q_heads > 0 && p.kv_heads > 0 && p.head_dim > 0,
                  "epilogue reference: need tokens >= 0 and positive heads and head_dim");
  SWIFTQK_EXPECTS(p.dtype == DType::kBF16 || p.dtype == DType::kF16,
                  "epilogue reference: the model dtype is bf16 or f16, got " + to_string(p.dtype));
  SWIFTQK_EXPECTS(
      p.rotary_dim >= 2 && p.rotary_dim <= p.head_dim && p.rotary_dim % 2 == 0,
      "epilogue reference: rotary_dim must be even and in [2, head_dim], got " + num(p.rotary_dim));
  SWIFTQK_EXPECTS(p.max_position >= 1, "epilogue reference: max_position must be >= 1");
  SWIFTQK_EXPECTS(!p.weight_plus_one || p.scope == NormScope::kHeadwise,
                  "epilogue reference: weight_plus_one is headwise only");
  const int64_t qw = p.q_heads * p.head_dim, kw = p.kv_heads * p.head_dim;
  const bool layerwise = p.scope == NormScope::kLayerwise;
  expect_size("q", p.q.size(), p.tokens * qw);
  expect_size("k", p.k.size(), p.tokens * kw);
  expect_size("v", p.v.size(), p.tokens * kw);
  expect_size("q_weight", p.q_weight.size(), layerwise ? qw : p.head_dim);
  expect_size("k_weight", p.k_weight.size(), layerwise ? kw : p.head_dim);
  expect_size("cos_sin", p.cos_sin.size(), p.max_position * p.rotary_dim);
  expect_size("positions", p.positions.size(), p.tokens);
}

// The element indices (a, b) of rotation pair i < rotary_dim / 2 within a head.
void pair_of(RopeStyle style, int64_t rotary_dim, int64_t i, int64_t* a, int64_t* b) {
  if (style == RopeStyle::kNeox) {
    *a = i;
    *b = i + rotary_dim / 2;
  } else {
    *a = 2 * i;
    *b = 2 * i + 1;
  }
}

bool position_ok(const EpilogueProblem& p, int64_t t) {
  const int64_t pos = p.positions[static_cast<std::size_t>(t)];
  return pos >= 0 && pos < p.max_position;
}

// One tensor (Q or K) of the gold: normalise each row in place, then rotate each head.
std::vector<double> gold_tensor(const EpilogueProblem& p, const std::vector<double>& x,
                                const std::vector<double>& w, int64_t heads) {
  const int64_t D = p.head_dim, width = heads * D, half = p.rotary_dim / 2;
  const bool layerwise = p.scope == NormScope::kLayerwise;
  const int64_t group = layerwise ? width : D;  // elements under one RMS
  std::vector<double> y(x.size());
  for (int64_t t = 0; t < p.tokens; ++t) {
    double* out = y.data() + t * width;
    const double* in = x.data() + t * width;
    if (!position_ok(p, t)) {
      for (int64_t i = 0; i < width; ++i) out[i] = kNaN;
      continue;
    }
    for (int64_t g = 0; g < width; g += group) {
      double sum = 0;
      for (int64_t i = g; i < g + group; ++i) sum += in[i] * in[i];
      const double rstd = 1.0 / std::sqrt(sum / static_cast<double>(group) + p.eps);
      for (int64_t i = g; i < g + group; ++i) {
        const double wi = w[static_cast<std::size_t>(layerwise ? i : i - g)];
        out[i] = (p.weight_plus_one ? 1.0 + wi : wi) * (in[i] * rstd);
      }
    }
    const double* cs = p.cos_sin.data() + p.positions[static_cast<std::size_t>(t)] * p.rotary_dim;
    for (int64_t h = 0; h < heads; ++h) {
      double* head = out + h * D;
      for (int64_t i = 0; i < half; ++i) {
        int64_t a = 0, b = 0;
        pair_of(p.style, p.rotary_dim, i, &a, &b);
        const double c = cs[i], s = cs[half + i], xa = head[a], xb = head[b];
        head[a] = xa * c - xb * s;
        head[b] = xb * c + xa * s;
      }
    }
  }
  return y;
}

// One tensor of the emulation (epilogue_emulated's comment lists the steps).
std::vector<double> emulated_tensor(const EpilogueProblem& p, const std::vector<double>& x,
                                    const std::vector<double>& w, int64_t heads) {
  const int64_t D = p.head_dim, width = heads * D, half = p.rotary_dim / 2;
  const bool layerwise = p.scope == NormScope::kLayerwise;
  const bool olmo2 = p.order == NormOrder::kOlmo2;
  const int64_t group = layerwise ? width : D;
  const DType dt = p.dtype;
  std::vector<double> y(x.size());
  std::vector<float> pre(static_cast<std::size_t>(width));    // what the rotation takes
  std::vector<float> scale(static_cast<std::size_t>(width));  // Olmo2: rs, applied last
  for (int64_t t = 0; t < p.tokens; ++t) {
    double* out = y.data() + t * width;
    const double* in = x.data() + t * width;
    if (!position_ok(p, t)) {
      for (int64_t i = 0; i < width; ++i) out[i] = kNaN;
      continue;
    }
    for (int64_t g = 0; g < width; g += group) {
      double sum = 0;
      for (int64_t i = g; i < g + group; ++i) {
        const double xf = static_cast<float>(in[i]);
        sum += xf * xf;
      }
      const float rs = 1.0f / std::sqrt(static_cast<float>(sum) / static_cast<float>(group) +
                                        static_cast<float>(p.eps));
      for (int64_t i = g; i < g + group; ++i) {
        const float wf = static_cast<float>(w[static_cast<std::size_t>(layerwise ? i : i - g)]);
        const float wi = p.weight_plus_one ? 1.0f + wf : wf;
        const float xf = static_cast<float>(in[i]);
        const auto u = static_cast<std::size_t>(i);
        pre[u] = olmo2 ? xf * wi : round_to(dt, round_to(dt, xf * rs) * wi);
        scale[u] = olmo2 ? rs : 1.0f;
      }
    }
    const double* cs = p.cos_sin.data() + p.positions[static_cast<std::size_t>(t)] * p.rotary_dim;
    std::vector<float> rot(pre);
    for (int64_t h = 0; h < heads; ++h) {
      float* head = rot.data() + h * D;
      for (int64_t i = 0; i < half; ++i) {
        int64_t a = 0, b = 0;
        pair_of(p.style, p.rotary_dim, i, &a, &b);
        const float c = static_cast<float>(cs[i]), s = static_cast<float>(cs[half + i]);
        const float xa = head[a], xb = head[b];
        // Each product rounded to fp32 on its own: volatile keeps the compiler from contracting
        // them into a fused multiply-add on targets that have one.
        volatile float ac = xa * c, bs = xb * s, bc = xb * c, as = xa * s;
        head[a] = ac - bs;
        head[b] = bc + as;
      }
    }
    for (int64_t i = 0; i < width; ++i) {
      const auto u = static_cast<std::size_t>(i);
      out[i] = round_to(dt, scale[u] * rot[u]);
    }
  }
  return y;
}

}  // namespace

EpilogueExpected epilogue_fp64(const EpilogueProblem& p) {
  check_problem(p);
  return {gold_tensor(p, p.q, p.q_weight, p.q_heads), gold_tensor(p, p.k, p.k_weight, p.kv_heads)};
}

EpilogueExpected epilogue_emulated(const EpilogueProblem& p) {
  check_problem(p);
  return {emulated_tensor(p, p.q, p.q_weight, p.q_heads),
          emulated_tensor(p, p.k, p.k_weight, p.kv_heads)};
}

std::vector<double> quantize_e4m3(const std::vector<double>& x, double scale) {
  SWIFTQK_EXPECTS(std::isfinite(scale) && scale > 0,
                  "quantize_e4m3: scale must be finite and > 0, got " + std::to_string(scale));
  std::vector<double> q(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    q[i] = e4m3_bits_to_float(float_to_e4m3_bits(static_cast<float>(x[i] / scale)));
  }
  return q;
}

// Why one ulp: e4m3 keeps 3 mantissa bits, so rounding the exact value to nearest errs by at most
// half an ulp (2^-4 of |gold| at the bottom of a binade, less above). The kernel quantises its
// own fp32 value, which may have been rounded to the model dtype first (the K of k_out and of an
// fp8 cache are the same) and so differs from the float64 gold by a few model-dtype ulps (2^-7
// of |gold| for bf16): less than another half e4m3 ulp, enough to cross one rounding boundary,
// so one ulp in all. Below 2^-6 the ulp is the subnormal spacing 2^-9; past 448 every value
// saturates to 448, which the second term admits.
double e4m3_tolerance(double gold) {
  const double a = std::fabs(gold);
  if (std::isnan(a)) return kNaN;
  const double m = std::fmin(a, 448.0);
  const int e = m < 0x1p-6 ? -6 : std::ilogb(m);
  return std::ldexp(1.0, e - 3) + (a > 448.0 ? a - 448.0 : 0.0);
}

std::vector<double> column_shard(const std::vector<double>& full, int64_t tokens, int64_t width,
                                 int world, int rank) {
  SWIFTQK_EXPECTS(tokens >= 0 && width > 0 && world >= 1 && rank >= 0 && rank < world,
                  "column_shard: need tokens >= 0, width > 0 and 0 <= rank < world, got tokens " +
                      num(tokens) + ", width " + num(width) + ", rank " + num(rank) + " of " +
                      num(world));
  SWIFTQK_EXPECTS(width % world == 0,
                  "column_shard: width " + num(width) + " is not divisible by world " + num(world));
  expect_size("column_shard input", full.size(), tokens * width);
  const int64_t w = width / world;
  std::vector<double> shard(static_cast<std::size_t>(tokens * w));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t i = 0; i < w; ++i) {
      shard[static_cast<std::size_t>(t * w + i)] =
          full[static_cast<std::size_t>(t * width + rank * w + i)];
    }
  }
  return shard;
}

}  // namespace ref
}  // namespace swiftqk
