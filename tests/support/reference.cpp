// Float64 RMSNorm reference, an fp32-kernel emulation, bit-exact dtype conversions and metrics.
#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "protocol.hpp"
#include "swiftqk/error.hpp"

namespace swiftqk {
namespace ref {
namespace {

// Rounds finite a >= 0 to nearest-even on a binary grid with `mant` stored mantissa bits and
// minimum normal exponent `emin` (subnormal spacing 2^(emin - mant)); no upper limit, callers
// handle overflow. Every step is exact in float except nearbyint, which is the RNE rounding.
float round_grid(float a, int mant, int emin) {
  if (a == 0.0f) return 0.0f;
  const int e = std::max(std::ilogb(a), emin);
  return std::ldexp(std::nearbyint(std::ldexp(a, mant - e)), e - mant);
}

// Bit code (without sign) of r >= 0 lying on that grid. A subnormal's code is r / spacing; at
// r = 2^emin that formula gives 1 << mant, the first normal's code, so the branches agree.
uint32_t encode_grid(float r, int mant, int emin) {
  if (r < std::ldexp(1.0f, emin)) return static_cast<uint32_t>(std::ldexp(r, mant - emin));
  const int e = std::ilogb(r);
  const uint32_t significand = static_cast<uint32_t>(std::ldexp(r, mant - e));  // 1.m * 2^mant
  return (static_cast<uint32_t>(e - emin + 1) << mant) | (significand - (1u << mant));
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

void check_shapes(const std::vector<double>& x, const std::vector<double>& w, int64_t tokens,
                  int64_t width) {
  SWIFTQK_EXPECTS(tokens >= 0 && width > 0, "rms_norm: need tokens >= 0 and width > 0, got " +
                                                std::to_string(tokens) + "x" +
                                                std::to_string(width));
  SWIFTQK_EXPECTS(x.size() == static_cast<std::size_t>(tokens * width),
                  "rms_norm: x has " + std::to_string(x.size()) + " elements, expected " +
                      std::to_string(tokens * width));
  SWIFTQK_EXPECTS(w.size() == static_cast<std::size_t>(width),
                  "rms_norm: w has " + std::to_string(w.size()) + " elements, expected " +
                      std::to_string(width));
}

// Unit roundoff 2^-p (p = significand bits incl. the implicit one): the largest relative error
// of one round-to-nearest into the output type.
double unit_roundoff(DType out) {
  switch (out) {
    case DType::kF32:
      return std::ldexp(1.0, -24);
    case DType::kF16:
      return std::ldexp(1.0, -11);
    case DType::kBF16:
      return std::ldexp(1.0, -8);
    case DType::kF8E4M3:
      break;
  }
  SWIFTQK_FAIL("fp8 is an input type only; outputs are f32, f16 or bf16, got " + to_string(out));
}

}  // namespace

uint16_t float_to_bf16_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // canonical NaN, as CUDA returns
  // RNE on the low 16 bits; a carry out of the mantissa correctly bumps the exponent (to inf).
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float bf16_bits_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

uint16_t float_to_f16_bits(float v) {
  if (std::isnan(v)) return 0x7fff;
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  if (std::isinf(v)) return sign | 0x7c00;
  const float r = round_grid(std::fabs(v), 10, -14);
  if (r > 65504.0f) return sign | 0x7c00;  // rounded past the max finite half: overflow to inf
  return static_cast<uint16_t>(sign | encode_grid(r, 10, -14));
}

float f16_bits_to_float(uint16_t bits) {
  const int exp = (bits >> 10) & 0x1f, man = bits & 0x3ff;
  float mag;
  if (exp == 0x1f) {
    mag = man ? kNaN : std::numeric_limits<float>::infinity();
  } else {
    mag = exp == 0 ? std::ldexp(static_cast<float>(man), -24)
                   : std::ldexp(static_cast<float>(1024 + man), exp - 25);
  }
  return (bits & 0x8000) ? -mag : mag;
}

uint8_t float_to_e4m3_bits(float v) {
  if (std::isnan(v)) return 0x7f;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  // SATFINITE: anything beyond 448 (inf included) becomes 448. Clamping before rounding is
  // equivalent because 448 is the top of the grid.
  const float a = std::fmin(std::fabs(v), 448.0f);
  return static_cast<uint8_t>(sign | encode_grid(round_grid(a, 3, -6), 3, -6));
}

float e4m3_bits_to_float(uint8_t bits) {
  const int exp = (bits >> 3) & 0xf, man = bits & 0x7;
  if (exp == 0xf && man == 0x7) return kNaN;  // the only NaN codes: 0x7f and 0xff
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                             : std::ldexp(static_cast<float>(8 + man), exp - 10);
  return (bits & 0x80) ? -mag : mag;
}

float round_to(DType t, float v) {
  switch (t) {
    case DType::kF32:
      return v;
    case DType::kF16:
      return f16_bits_to_float(float_to_f16_bits(v));
    case DType::kBF16:
      return bf16_bits_to_float(float_to_bf16_bits(v));
    case DType::kF8E4M3:
      return e4m3_bits_to_float(float_to_e4m3_bits(v));
  }
  SWIFTQK_FAIL("invalid DType value " + std::to_string(static_cast<int>(t)));
}

double load_element(const void* base, DType t, std::size_t index) {
  // memcpy: the buffer is raw bytes from the caller; no aliasing or alignment assumptions.
  const auto* p = static_cast<const unsigned char*>(base) + index * dtype_size(t);
  switch (t) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::kF16:
    case DType::kBF16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return t == DType::kF16 ? f16_bits_to_float(b) : bf16_bits_to_float(b);
    }
    case DType::kF8E4M3:
      return e4m3_bits_to_float(*p);
  }
  SWIFTQK_FAIL("invalid DType value " + std::to_string(static_cast<int>(t)));
}

void store_element(void* base, DType t, std::size_t index, double value) {
  auto* p = static_cast<unsigned char*>(base) + index * dtype_size(t);
  const float f = static_cast<float>(value);
  switch (t) {
    case DType::kF32:
      std::memcpy(p, &f, 4);
      return;
    case DType::kF16:
    case DType::kBF16: {
      const uint16_t b = t == DType::kF16 ? float_to_f16_bits(f) : float_to_bf16_bits(f);
      std::memcpy(p, &b, 2);
      return;
    }
    case DType::kF8E4M3:
      *p = float_to_e4m3_bits(f);
      return;
  }
  SWIFTQK_FAIL("invalid DType value " + std::to_string(static_cast<int>(t)));
}

float input_scale(DType t, const float* v, std::size_t n) {
  if (t != DType::kF8E4M3) return 1.f;
  float amax = 0.f;
  for (std::size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(v[i]));
  return amax / 448.f;
}

void quantise(const float* v, DType t, float scale, std::size_t begin, std::size_t end, void* raw,
              double* stored) {
  for (std::size_t i = begin; i < end; ++i) {
    store_element(raw, t, i, v[i] / scale);  // the division in float, as a kernel scales
    stored[i] = load_element(raw, t, i) * scale;
  }
}

std::vector<double> rms_norm_fp64(const std::vector<double>& x, const std::vector<double>& w,
                                  int64_t tokens, int64_t width, double eps) {
  check_shapes(x, w, tokens, width);
  std::vector<double> y(x.size());
  rms_norm_fp64_rows(x.data(), w.data(), width, eps, 0, tokens, y.data());
  return y;
}

void rms_norm_fp64_rows(const double* x, const double* w, int64_t width, double eps,
                        int64_t row_begin, int64_t row_end, double* y) {
  SWIFTQK_EXPECTS(width >= 1 && row_begin >= 0 && row_begin <= row_end,
                  "rms_norm_fp64_rows: width must be >= 1 and 0 <= row_begin <= row_end");
  for (int64_t t = row_begin; t < row_end; ++t) {
    const double* row = x + t * width;
    double sum = 0;
    for (int64_t i = 0; i < width; ++i) sum += row[i] * row[i];
    const double rstd = 1.0 / std::sqrt(sum / static_cast<double>(width) + eps);
    for (int64_t i = 0; i < width; ++i) y[t * width + i] = w[i] * (row[i] * rstd);
  }
}

// The kernel may differ from this emulation by one ulp of `out`: it sums squares in fp32 in a
// different order (and across ranks) and may fuse multiply-adds, so its fp32 value can land on
// the other side of an output rounding boundary. Compare kernels against rms_norm_fp64 within
// relative_tolerance; use this emulation to reason about what exact rounding looks like.
std::vector<double> rms_norm_emulated(const std::vector<double>& x, const std::vector<double>& w,
                                      int64_t tokens, int64_t width, double eps, NormOrder order,
                                      DType out) {
  check_shapes(x, w, tokens, width);
  SWIFTQK_EXPECTS(out != DType::kF8E4M3, "rms_norm_emulated: fp8 is not an output type");
  std::vector<double> y(x.size());
  for (int64_t t = 0; t < tokens; ++t) {
    const double* row = x.data() + t * width;
    double sum = 0;
    for (int64_t i = 0; i < width; ++i) sum += row[i] * row[i];
    const float rstd = 1.0f / std::sqrt(static_cast<float>(sum) / static_cast<float>(width) +
                                        static_cast<float>(eps));
    for (int64_t i = 0; i < width; ++i) {
      const float normed = static_cast<float>(row[i]) * rstd;
      const float scaled = order == NormOrder::kOlmo2
                               ? static_cast<float>(w[i]) * normed
                               : static_cast<float>(w[i]) * round_to(out, normed);
      y[t * width + i] = round_to(out, scaled);
    }
  }
  return y;
}

double sum_of_squares_sharded(const double* row, int64_t width, int world) {
  SWIFTQK_EXPECTS(world >= 1 && width >= 0, "sum_of_squares_sharded: bad world or width");
  SWIFTQK_EXPECTS(width % world == 0, "sum_of_squares_sharded: width " + std::to_string(width) +
                                          " is not divisible by world " + std::to_string(world));
  const int64_t shard = width / world;
  float total = 0.0f;
  for (int r = 0; r < world; ++r) {
    float partial = 0.0f;
    for (int64_t i = 0; i < shard; ++i) {
      const float v = static_cast<float>(row[r * shard + i]);
      partial += v * v;
    }
    total += partial;  // rank order, as every rank must combine identically
  }
  return total;
}

namespace {

// One level of a butterfly over n values: every entry becomes v[j] + v[j ^ off], as a lane
// adding its xor partner's value does (each pairwise add is commutative, so both partners get
// the same bits).
void butterfly_level(std::vector<float>& v, int off) {
  std::vector<float> next(v.size());
  for (std::size_t j = 0; j < v.size(); ++j) next[j] = v[j] + v[j ^ static_cast<std::size_t>(off)];
  v.swap(next);
}
// The pairwise tree in index order (offsets 1, 2, 4, ...): the segments, then the ranks.
float tree_sum(std::vector<float> v) {
  for (std::size_t off = 1; off < v.size(); off <<= 1) butterfly_level(v, static_cast<int>(off));
  return v[0];
}

// One canonical segment of `len` values: lane j of kCanonicalLanes takes vectors j, j + 32, ...
// and adds each vector's fused-multiply-add chain to its total in order; the lanes' totals meet
// in a warp's xor butterfly (offsets 16, 8, 4, 2, 1).
float canonical_segment(const float* x, int64_t len, int vec) {
  std::vector<float> lane(kCanonicalLanes);
  const int64_t vectors = len / vec;
  for (int j = 0; j < kCanonicalLanes; ++j) {
    float a = 0.0f;
    for (int64_t v = j; v < vectors; v += kCanonicalLanes) {
      float s = 0.0f;
      for (int e = 0; e < vec; ++e) s = std::fma(x[v * vec + e], x[v * vec + e], s);
      a += s;
    }
    lane[j] = a;
  }
  for (int off = kCanonicalLanes / 2; off > 0; off >>= 1) butterfly_level(lane, off);
  return lane[0];
}

void check_canonical(int64_t width, int vec, int world) {
  SWIFTQK_EXPECTS(vec >= 1 && width > 0 && width % (int64_t{kCanonicalSegments} * vec) == 0,
                  "canonical_sum_of_squares: width " + std::to_string(width) +
                      " is not a multiple of 16 vectors of " + std::to_string(vec));
  SWIFTQK_EXPECTS(world >= 1 && world <= kCanonicalSegments && (world & (world - 1)) == 0,
                  "canonical_sum_of_squares: world must be a power of two up to 16");
}

// The leaves: each segment's sum times the scale, twice (the kernel's order of the products).
std::vector<float> canonical_leaves(const float* row, int64_t width, int vec, float scale) {
  const int64_t len = width / kCanonicalSegments;
  std::vector<float> leaf(kCanonicalSegments);
  for (int i = 0; i < kCanonicalSegments; ++i) {
    leaf[i] = canonical_segment(row + i * len, len, vec) * scale * scale;
  }
  return leaf;
}

}  // namespace

float canonical_sum_of_squares(const float* row, int64_t width, int vec_elems, float scale) {
  check_canonical(width, vec_elems, 1);
  return tree_sum(canonical_leaves(row, width, vec_elems, scale));
}

float canonical_sum_of_squares_ranks(const float* row, int64_t width, int vec_elems, float scale,
                                     int world) {
  check_canonical(width, vec_elems, world);
  const std::vector<float> leaf = canonical_leaves(row, width, vec_elems, scale);
  const int m = kCanonicalSegments / world;
  std::vector<float> partial(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {  // a rank's own segments: its group's warps
    partial[r] = tree_sum(std::vector<float>(leaf.begin() + r * m, leaf.begin() + (r + 1) * m));
  }
  return tree_sum(partial);  // the exchange: lane sl holds rank sl's partial
}

ErrorMetrics compare(const std::vector<double>& got, const std::vector<double>& ref) {
  SWIFTQK_EXPECTS(got.size() == ref.size(), "compare: got has " + std::to_string(got.size()) +
                                                " elements, ref has " + std::to_string(ref.size()));
  ErrorMetrics m;
  m.count = static_cast<int64_t>(got.size());
  double sum_abs = 0, sum_sq = 0;
  int64_t finite = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = ref[i];
    if (!std::isfinite(g) || !std::isfinite(r)) {
      const bool same = (std::isnan(g) && std::isnan(r)) || g == r;  // equal infinities agree
      if (!same) {
        if (m.nonfinite++ == 0) m.worst_index = static_cast<int64_t>(i);
        m.max_abs = std::numeric_limits<double>::infinity();
      }
      continue;
    }
    const double d = std::fabs(g - r);
    sum_abs += d;
    sum_sq += d * d;
    ++finite;
    if (m.worst_index < 0 || d > m.max_abs) {
      m.max_abs = d;
      m.worst_index = static_cast<int64_t>(i);
    }
  }
  if (finite > 0) {
    m.mean_abs = sum_abs / static_cast<double>(finite);
    m.rmse = std::sqrt(sum_sq / static_cast<double>(finite));
  }
  return m;
}

ErrorMetrics pool(const std::vector<ErrorMetrics>& parts) {
  ErrorMetrics m;
  double sum_abs = 0, sum_sq = 0;
  for (const ErrorMetrics& p : parts) {
    m.max_abs = std::max(m.max_abs, p.max_abs);
    m.count += p.count;
    m.nonfinite += p.nonfinite;
    sum_abs += p.mean_abs * p.count;
    sum_sq += p.rmse * p.rmse * p.count;
  }
  const double n = std::max<double>(1, static_cast<double>(m.count));
  m.mean_abs = sum_abs / n;
  m.rmse = std::sqrt(sum_sq / n);
  return m;
}

// Why these bounds (u = unit roundoff of `out`: 2^-8 bf16, 2^-11 f16, 2^-24 f32):
//  * Olmo2 rounds once into `out`: relative error <= u. Llama rounds x*rstd into `out` and then
//    w * that again: (1+u)^2 - 1 = 2u + u^2.
//  * fp32 arithmetic before the final rounding (fp32 sum of squares, sqrt, division, two
//    products) adds a few 2^-24 plus the summation error, which for random data grows like
//    sqrt(width) * 2^-24 (~4e-6 at width 4096, far less with tree reductions). 1e-5 covers it.
//  * The extra 0.25u is margin for the cross terms (u^2, u * fp32 error); it stays well below
//    the next ulp so a 1% scale error or a wrong eps/width still fails.
double relative_tolerance(DType out, NormOrder order) {
  const double roundings = order == NormOrder::kOlmo2 ? 1.25 : 2.25;
  return roundings * unit_roundoff(out) + 1e-5;
}

// In the subnormal range the rounding error is absolute: half the subnormal spacing, which is
// u * 2^emin. With floor = 4 * 2^emin (4x the smallest normal), rel * floor is >= 5 half
// spacings for Olmo2 (needs 1) and >= 9 for Llama (needs 1 + |w|), and still tiny.
double absolute_floor(DType out) {
  const int emin = out == DType::kF16 ? -14 : -126;  // f32 and bf16 share float's exponent range
  unit_roundoff(out);                                // rejects fp8
  return std::ldexp(4.0, emin);
}

int64_t count_out_of_tolerance(const std::vector<double>& got, const std::vector<double>& gold,
                               DType out, NormOrder order) {
  SWIFTQK_EXPECTS(got.size() == gold.size(), "count_out_of_tolerance: size mismatch");
  const double rel = relative_tolerance(out, order), floor = absolute_floor(out);
  int64_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], r = gold[i];
    if (!std::isfinite(r)) {
      bad += !((std::isnan(g) && std::isnan(r)) || g == r);
    } else {
      // !(a <= b) also counts NaN in got as out of tolerance.
      bad += !(std::isfinite(g) && std::fabs(g - r) <= rel * std::max(std::fabs(r), floor));
    }
  }
  return bad;
}

}  // namespace ref
}  // namespace swiftqk
