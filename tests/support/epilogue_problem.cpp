// Epilogue problems, rank buffers and checks (epilogue_problem.hpp).
#include "epilogue_problem.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>

namespace swiftqk::testing {

namespace {

std::size_t esize(DType t) { return dtype_size(t); }

// Values stored in t: bits and their exact values.
void fill(std::vector<uint8_t>& bits, std::vector<double>& vals, std::size_t n, DType t,
          const std::vector<double>& want) {
  bits.assign(n * esize(t), 0);
  vals.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    ref::store_element(bits.data(), t, i, want[i]);
    vals[i] = ref::load_element(bits.data(), t, i);
  }
}

// Normal values, each token's row scaled by 10^u, u uniform in [-1, 1): two decades, no zeros.
std::vector<double> random_rows(int64_t tokens, int64_t width, std::mt19937_64& rng) {
  std::normal_distribution<double> n(0.0, 1.0);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> x(static_cast<std::size_t>(tokens * width));
  for (int64_t t = 0; t < tokens; ++t) {
    const double m = std::pow(10.0, u(rng));
    for (int64_t i = 0; i < width; ++i) {
      double v = n(rng) * m;
      if (v == 0.0) v = m;
      x[t * width + i] = v;
    }
  }
  return x;
}

double amax(const std::vector<double>& x) {
  double m = 0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}

void upload(DeviceBuffer& d, const void* src, std::size_t bytes) {
  d = DeviceBuffer(bytes);
  SWIFTQK_CUDA_TRY(cudaMemcpy(d.get(), src, bytes, cudaMemcpyHostToDevice));
}

struct RankGeometry {
  int64_t qh, kh, qw, kw, row, stride, off;
};
RankGeometry geometry(const EpilogueSetup& s, int world) {
  RankGeometry g;
  g.qh = s.q_heads / world;
  g.kh = s.kv_heads / world;
  g.qw = g.qh * s.head_dim;
  g.kw = g.kh * s.head_dim;
  g.row = g.qw + 2 * g.kw;
  g.off = s.unaligned ? 1 : 0;
  g.stride = g.row + g.off;
  return g;
}

int64_t cache_offset(const QkEpilogueParams& p, int64_t slot, int64_t head, int64_t d) {
  const int64_t b = slot / p.cache.block_size, o = slot % p.cache.block_size;
  return b * p.cache.block_stride + o * p.cache.slot_stride + head * p.cache.head_stride + d;
}

// Index in its head of the element rotated with element d (d < rotary_dim).
int64_t partner(const EpilogueSetup& s, int64_t d) {
  const int64_t half = s.rotary_dim / 2;
  if (s.style == RopeStyle::kNeox) return d < half ? d + half : d - half;
  return d ^ 1;
}

}  // namespace

std::string EpilogueSetup::name() const {
  std::ostringstream o;
  o << "T" << tokens << "_q" << q_heads << "_kv" << kv_heads << "_hd" << head_dim << "_rot"
    << rotary_dim << (scope == NormScope::kHeadwise ? "_headwise" : "_layerwise") << "_"
    << to_string(order) << (style == RopeStyle::kNeox ? "_neox" : "_gptj") << "_"
    << to_string(dtype) << "_q" << to_string(q_out_dtype) << "_cache" << to_string(cache_dtype)
    << "_cs" << to_string(cos_sin_dtype) << (in_place ? "_inplace" : "_outofplace")
    << (k_out ? "_kout" : "") << (hnd ? "_hnd" : "_nhd") << (unaligned ? "_unaligned" : "")
    << (weight_plus_one ? "_plus1" : "");
  return o.str();
}

EpilogueHost EpilogueHost::random(const EpilogueSetup& s) {
  EpilogueHost h;
  h.s = s;
  ref::EpilogueProblem& r = h.ref;
  r.tokens = s.tokens;
  r.q_heads = s.q_heads;
  r.kv_heads = s.kv_heads;
  r.head_dim = s.head_dim;
  r.weight_plus_one = s.weight_plus_one;
  r.scope = s.scope;
  r.order = s.order;
  r.eps = s.eps;
  r.dtype = s.dtype;
  r.max_position = s.max_position;
  r.rotary_dim = s.rotary_dim;
  r.style = s.style;
  std::mt19937_64 rng(s.seed);
  const bool headwise = s.scope == NormScope::kHeadwise;
  const int64_t qwf = headwise ? s.head_dim : s.q_heads * s.head_dim;
  const int64_t kwf = headwise ? s.head_dim : s.kv_heads * s.head_dim;
  std::uniform_real_distribution<double> w(s.weight_plus_one ? -0.5 : 0.25,
                                           s.weight_plus_one ? 1.0 : 2.0);
  std::vector<double> wq(qwf), wk(kwf);
  for (double& x : wq) x = w(rng);
  for (double& x : wk) x = w(rng);
  fill(h.wq, r.q_weight, qwf, s.dtype, wq);
  fill(h.wk, r.k_weight, kwf, s.dtype, wk);
  // A real rotary table (base 10000): cos half, then sin half.
  const int64_t half = s.rotary_dim / 2;
  std::vector<double> cs(static_cast<std::size_t>(s.max_position * s.rotary_dim));
  for (int64_t p = 0; p < s.max_position; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double f = std::pow(10000.0, -2.0 * static_cast<double>(i) / s.rotary_dim);
      cs[p * s.rotary_dim + i] = std::cos(p * f);
      cs[p * s.rotary_dim + half + i] = std::sin(p * f);
    }
  }
  fill(h.cos_sin, r.cos_sin, cs.size(), s.cos_sin_dtype, cs);
  // Positions: any order, repeats allowed. Slots: distinct, across many blocks, some -1.
  std::uniform_int_distribution<int64_t> pos(0, s.max_position - 1);
  r.positions.resize(s.tokens);
  for (int64_t& p : r.positions) p = pos(rng);
  std::vector<int64_t> all(static_cast<std::size_t>(h.cache_slots()));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  h.slots.assign(all.begin(), all.begin() + s.tokens);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t& x : h.slots) {
    if (u(rng) < s.padding) x = -1;
  }
  h.refill(s.seed * 7 + 3);
  return h;
}

void EpilogueHost::refill(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t qwf = s.q_heads * s.head_dim, kwf = s.kv_heads * s.head_dim;
  fill(q, ref.q, s.tokens * qwf, s.dtype, random_rows(s.tokens, qwf, rng));
  fill(k, ref.k, s.tokens * kwf, s.dtype, random_rows(s.tokens, kwf, rng));
  fill(v, ref.v, s.tokens * kwf, s.dtype, random_rows(s.tokens, kwf, rng));
  // fp8 scales from the gold's range (a few values saturate at most).
  const ref::EpilogueExpected g = ref::epilogue_fp64(ref);
  q_scale = static_cast<float>(amax(g.q) / 400.0);
  k_scale = static_cast<float>(amax(g.k) / 400.0);
  v_scale = static_cast<float>(amax(ref.v) / 400.0);
}

void upload_epilogue_inputs(const EpilogueHost& h, int world, int rank, EpilogueRank& d,
                            cudaStream_t s) {
  const EpilogueSetup& st = h.s;
  const RankGeometry g = geometry(st, world);
  const std::size_t es = esize(st.dtype);
  std::vector<uint8_t> rows(static_cast<std::size_t>((st.tokens * g.stride + g.off) * es), 0);
  const int64_t qwf = st.q_heads * st.head_dim, kwf = st.kv_heads * st.head_dim;
  for (int64_t t = 0; t < st.tokens; ++t) {
    uint8_t* row = rows.data() + (t * g.stride + g.off) * es;
    std::memcpy(row, h.q.data() + (t * qwf + rank * g.qw) * es, g.qw * es);
    std::memcpy(row + g.qw * es, h.k.data() + (t * kwf + rank * g.kw) * es, g.kw * es);
    std::memcpy(row + (g.qw + g.kw) * es, h.v.data() + (t * kwf + rank * g.kw) * es, g.kw * es);
  }
  SWIFTQK_CUDA_TRY(
      cudaMemcpyAsync(d.qkv.get(), rows.data(), rows.size(), cudaMemcpyHostToDevice, s));
  SWIFTQK_CUDA_TRY(cudaMemcpyAsync(d.positions.get(), h.ref.positions.data(),
                                   st.tokens * sizeof(int64_t), cudaMemcpyHostToDevice, s));
  SWIFTQK_CUDA_TRY(cudaMemcpyAsync(d.slots.get(), h.slots.data(), st.tokens * sizeof(int64_t),
                                   cudaMemcpyHostToDevice, s));
  const float scales[3] = {h.q_scale, h.k_scale, h.v_scale};
  SWIFTQK_CUDA_TRY(
      cudaMemcpyAsync(d.scales.get(), scales, sizeof(scales), cudaMemcpyHostToDevice, s));
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));  // the host vectors die here
}

EpilogueRank make_epilogue_rank(const EpilogueHost& h, int world, int rank) {
  const EpilogueSetup& st = h.s;
  const RankGeometry g = geometry(st, world);
  const std::size_t es = esize(st.dtype);
  EpilogueRank d;
  d.qkv = DeviceBuffer(static_cast<std::size_t>((st.tokens * g.stride + g.off) * es));
  d.positions = DeviceBuffer(std::max<int64_t>(1, st.tokens) * sizeof(int64_t));
  d.slots = DeviceBuffer(std::max<int64_t>(1, st.tokens) * sizeof(int64_t));
  d.scales = DeviceBuffer(3 * sizeof(float));
  upload_epilogue_inputs(h, world, rank, d, nullptr);
  const bool headwise = st.scope == NormScope::kHeadwise;
  if (headwise) {
    upload(d.wq, h.wq.data(), h.wq.size());
    upload(d.wk, h.wk.data(), h.wk.size());
  } else {
    upload(d.wq, h.wq.data() + rank * g.qw * es, g.qw * es);
    upload(d.wk, h.wk.data() + rank * g.kw * es, g.kw * es);
  }
  upload(d.cos_sin, h.cos_sin.data(), h.cos_sin.size());
  const std::size_t ce = esize(st.cache_dtype);
  const int64_t nb = st.num_blocks(), bs = st.block_size, hd = st.head_dim;
  d.cache_bytes = static_cast<std::size_t>(nb * bs * g.kh * hd) * ce;
  d.k_cache = DeviceBuffer(d.cache_bytes);
  d.v_cache = DeviceBuffer(d.cache_bytes);

  QkEpilogueParams& p = d.params;
  uint8_t* base = d.qkv.get() + g.off * es;
  p.q = base;
  p.k = base + g.qw * es;
  p.v = base + (g.qw + g.kw) * es;
  p.q_stride = p.k_stride = p.v_stride = g.stride;
  const bool in_place = st.in_place && st.q_out_dtype == st.dtype;
  if (in_place) {
    p.q_out = base;
    p.q_out_stride = g.stride;
  } else {
    d.q_out = DeviceBuffer(static_cast<std::size_t>(std::max<int64_t>(1, st.tokens) * g.qw) *
                           esize(st.q_out_dtype));
    p.q_out = d.q_out.get();
    p.q_out_stride = g.qw;
  }
  p.q_out_dtype = st.q_out_dtype;
  p.q_out_scale = d.scales.get<float>();
  if (st.k_out) {
    d.k_out = DeviceBuffer(static_cast<std::size_t>(std::max<int64_t>(1, st.tokens) * g.kw) * es);
    p.k_out = d.k_out.get();
    p.k_out_stride = g.kw;
  }
  p.q_weight = d.wq.get();
  p.k_weight = d.wk.get();
  p.weight_plus_one = st.weight_plus_one;
  p.dtype = st.dtype;
  p.tokens = st.tokens;
  p.num_q_heads = g.qh;
  p.num_kv_heads = g.kh;
  p.head_dim = hd;
  p.scope = st.scope;
  p.order = st.order;
  p.eps = st.eps;
  p.rope.positions = d.positions.get<int64_t>();
  p.rope.cos_sin_cache = d.cos_sin.get();
  p.rope.cache_dtype = st.cos_sin_dtype;
  p.rope.max_position = st.max_position;
  p.rope.rotary_dim = st.rotary_dim;
  p.rope.style = st.style;
  p.cache.k = d.k_cache.get();
  p.cache.v = d.v_cache.get();
  p.cache.dtype = st.cache_dtype;
  p.cache.num_blocks = nb;
  p.cache.block_size = bs;
  if (st.hnd) {
    p.cache.block_stride = g.kh * bs * hd;
    p.cache.head_stride = bs * hd;
    p.cache.slot_stride = hd;
  } else {
    p.cache.block_stride = bs * g.kh * hd;
    p.cache.slot_stride = g.kh * hd;
    p.cache.head_stride = hd;
  }
  p.cache.k_scale = d.scales.get<float>() + 1;
  p.cache.v_scale = d.scales.get<float>() + 2;
  p.cache.slot_mapping = d.slots.get<int64_t>();
  return d;
}

void poison_epilogue(EpilogueRank& d, uint64_t seed, cudaStream_t s) {
  std::mt19937_64 rng(seed);
  auto pattern = [&](DeviceBuffer& b) {
    if (b.bytes() == 0) return;
    std::vector<uint8_t> bytes(b.bytes());
    for (auto& x : bytes) x = static_cast<uint8_t>(rng() | 1u);  // never zero
    SWIFTQK_CUDA_TRY(
        cudaMemcpyAsync(b.get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice, s));
    SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
  };
  pattern(d.k_cache);
  pattern(d.v_cache);
  if (d.q_out.bytes() > 0)
    SWIFTQK_CUDA_TRY(cudaMemsetAsync(d.q_out.get(), 0xff, d.q_out.bytes(), s));
  if (d.k_out.bytes() > 0)
    SWIFTQK_CUDA_TRY(cudaMemsetAsync(d.k_out.get(), 0xff, d.k_out.bytes(), s));
  SWIFTQK_CUDA_TRY(cudaStreamSynchronize(s));
}

CacheSnapshot snapshot_caches(const EpilogueRank& d) {
  CacheSnapshot c;
  c.k.resize(d.cache_bytes);
  c.v.resize(d.cache_bytes);
  SWIFTQK_CUDA_TRY(cudaMemcpy(c.k.data(), d.k_cache.get(), d.cache_bytes, cudaMemcpyDeviceToHost));
  SWIFTQK_CUDA_TRY(cudaMemcpy(c.v.data(), d.v_cache.get(), d.cache_bytes, cudaMemcpyDeviceToHost));
  return c;
}

EpilogueCheck check_epilogue_rank(const EpilogueHost& h, const ref::EpilogueExpected& gold,
                                  int world, int rank, const EpilogueRank& d,
                                  const CacheSnapshot& before,
                                  const std::vector<int64_t>& bad_tokens, double roundings,
                                  EpilogueExpect expect) {
  const bool failed = expect == EpilogueExpect::kCorrectOrFailed;
  const EpilogueSetup& st = h.s;
  const QkEpilogueParams& p = d.params;
  const RankGeometry g = geometry(st, world);
  const int64_t T = st.tokens, hd = st.head_dim;
  const int64_t qwf = st.q_heads * hd, kwf = st.kv_heads * hd;
  const CacheSnapshot after = snapshot_caches(d);
  // Q as written: from the QKV rows (in place) or the dense q_out.
  const std::size_t qes = esize(st.q_out_dtype);
  std::vector<uint8_t> qo(static_cast<std::size_t>(T * g.qw) * qes);
  SWIFTQK_CUDA_TRY(cudaMemcpy2D(qo.data(), g.qw * qes, p.q_out, p.q_out_stride * qes, g.qw * qes, T,
                                cudaMemcpyDeviceToHost));
  std::vector<uint8_t> ko;
  if (st.k_out) {
    ko.resize(static_cast<std::size_t>(T * g.kw) * esize(st.dtype));
    SWIFTQK_CUDA_TRY(cudaMemcpy(ko.data(), p.k_out, ko.size(), cudaMemcpyDeviceToHost));
  }
  // The bound: the order's roundings relative to the pair the element was rotated with (an
  // error of the inputs a and b of y = a c -+ b s reaches y as |a| + |b| <= sqrt 2 times the
  // pair's norm, which is |y| + |y'| at most), plus the fp8 ulp when quantised.
  const double rel = roundings * ref::relative_tolerance(st.dtype, st.order);
  const double floor = ref::absolute_floor(st.dtype);
  auto bound = [&](const std::vector<double>& row, int64_t i_in_head, int64_t base) {
    const double gv = row[base + i_in_head];
    const double gp = i_in_head < st.rotary_dim ? row[base + partner(st, i_in_head)] : 0.0;
    return 1.5 * rel * std::max(std::fabs(gv) + std::fabs(gp), floor);
  };
  EpilogueCheck c;
  auto fail = [&](int64_t& counter, const std::string& what) {
    ++counter;
    if (c.first_error.empty()) c.first_error = what;
  };
  const std::size_t ce = esize(st.cache_dtype);
  std::vector<uint8_t> written(d.cache_bytes, 0);
  for (int64_t t = 0; t < T; ++t) {
    const bool bad = std::find(bad_tokens.begin(), bad_tokens.end(), t) != bad_tokens.end();
    for (int64_t j = 0; j < g.qw; ++j) {
      double got = ref::load_element(qo.data(), st.q_out_dtype, t * g.qw + j);
      if (st.q_out_dtype == DType::kF8E4M3) got *= h.q_scale;
      ++c.checked;
      if (bad) {
        if (!std::isnan(got)) fail(c.q_wrong, "token " + std::to_string(t) + ": Q not NaN");
        continue;
      }
      if (failed && std::isnan(got)) {
        ++c.q_nan;
        continue;
      }
      const int64_t col = rank * g.qw + j, head_base = t * qwf + (col / hd) * hd;
      const double gv = gold.q[t * qwf + col];
      double b = bound(gold.q, col % hd, head_base);
      if (st.q_out_dtype == DType::kF8E4M3) b += h.q_scale * ref::e4m3_tolerance(gv / h.q_scale);
      if (!(std::fabs(got - gv) <= b)) {
        fail(c.q_wrong, "token " + std::to_string(t) + " Q element " + std::to_string(j) +
                            ": got " + std::to_string(got) + ", gold " + std::to_string(gv));
      }
    }
    const int64_t slot = h.slots[t];
    for (int64_t hh = 0; hh < g.kh; ++hh) {
      for (int64_t e = 0; e < hd; ++e) {
        const int64_t col = rank * g.kw + hh * hd + e, head_base = t * kwf + (col / hd) * hd;
        const double gv = gold.k[t * kwf + col];
        const double b = bound(gold.k, e, head_base);
        if (st.k_out) {
          const double got = ref::load_element(ko.data(), st.dtype, t * g.kw + hh * hd + e);
          const bool nan_ok = bad || (failed && std::isnan(got));
          if (nan_ok ? !std::isnan(got) : !(std::fabs(got - gv) <= b)) {
            fail(c.k_out_wrong, "token " + std::to_string(t) + " k_out element " +
                                    std::to_string(hh * hd + e) + ": got " + std::to_string(got) +
                                    ", gold " + std::to_string(gv));
          }
        }
        if (bad || slot < 0) continue;
        const int64_t off = cache_offset(p, slot, hh, e);
        for (std::size_t byte = 0; byte < ce; ++byte) written[off * ce + byte] = 1;
        const bool k_kept =
            std::memcmp(after.k.data() + off * ce, before.k.data() + off * ce, ce) == 0;
        const bool v_kept =
            std::memcmp(after.v.data() + off * ce, before.v.data() + off * ce, ce) == 0;
        if (failed && k_kept) ++c.k_unwritten;
        double got = ref::load_element(after.k.data(), st.cache_dtype, off);
        double kb = b;
        if (st.cache_dtype == DType::kF8E4M3) {
          got *= h.k_scale;
          kb += h.k_scale * ref::e4m3_tolerance(gv / h.k_scale);
        }
        if (!(failed && k_kept) && !(std::fabs(got - gv) <= kb)) {
          fail(c.k_wrong, "token " + std::to_string(t) + " slot " + std::to_string(slot) +
                              " K head " + std::to_string(hh) + " element " + std::to_string(e) +
                              ": got " + std::to_string(got) + ", gold " + std::to_string(gv));
        }
        // V: a copy, or one quantisation of the stored value (float division, as the kernel).
        const double vin = h.ref.v[t * kwf + col];
        bool v_ok;
        if (st.cache_dtype == DType::kF8E4M3) {
          const uint8_t want = ref::float_to_e4m3_bits(static_cast<float>(vin) / h.v_scale);
          v_ok = after.v[off] == want;
        } else {
          v_ok = std::memcmp(after.v.data() + off * ce,
                             h.v.data() + (t * kwf + col) * esize(st.dtype), ce) == 0;
        }
        if (!v_ok && !(failed && v_kept)) {
          fail(c.v_wrong, "token " + std::to_string(t) + " slot " + std::to_string(slot) +
                              " V head " + std::to_string(hh) + " element " + std::to_string(e));
        }
      }
    }
  }
  for (std::size_t i = 0; i < d.cache_bytes; ++i) {
    if (written[i]) continue;
    if (after.k[i] != before.k[i] || after.v[i] != before.v[i]) {
      fail(c.cache_changed,
           "cache byte " + std::to_string(i) + " outside the call's slots changed");
    }
  }
  return c;
}

}  // namespace swiftqk::testing
