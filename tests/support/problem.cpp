#include "problem.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <thread>

#include "epilogue_reference.hpp"

namespace swiftqk::testing {

namespace {

// Runs f(begin, end) over [0, n) split across the machine's cores.
template <typename F>
void parallel_for(int64_t n, F f) {
  const int64_t workers =
      std::max<int64_t>(1, std::min<int64_t>(std::thread::hardware_concurrency(), n / 64 + 1));
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < workers; ++w) {
    pool.emplace_back([=, &f] { f(n * w / workers, n * (w + 1) / workers); });
  }
  for (auto& t : pool) t.join();
}

// Row t draws from its own generator seeded by (seed, t), so rows fill in parallel and the
// values do not depend on the number of threads. `original`, where given, gets the values drawn
// (before quantisation: the end-to-end gold's inputs).
void fill_rows(std::vector<uint8_t>& raw, std::vector<double>& exact, std::vector<double>* original,
               int64_t tokens, int64_t width, DType in, float& scale, uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(tokens * width));
  parallel_for(tokens, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + t);
      std::normal_distribution<float> normal(0.f, 1.f);
      std::uniform_real_distribution<float> decade(-1.f, 1.f);
      const float mag = std::pow(10.f, decade(rng));  // rows from 0.1x to 10x
      for (int64_t j = 0; j < width; ++j) {
        float x = normal(rng) * mag;
        if (x == 0.f) x = 1e-3f;  // never zeros
        v[t * width + j] = x;
      }
    }
  });
  scale = ref::input_scale(in, v.data(), v.size());
  raw.assign(v.size() * dtype_size(in), 0);
  exact.resize(v.size());
  parallel_for(static_cast<int64_t>(v.size()), [&](int64_t i0, int64_t i1) {
    ref::quantise(v.data(), in, scale, i0, i1, raw.data(), exact.data());
  });
  if (original != nullptr) original->assign(v.begin(), v.end());
}

void fill_weight(std::vector<uint8_t>& raw, std::vector<double>& exact, int64_t width, DType out,
                 std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(0.25f, 2.f);
  raw.assign(width * dtype_size(out), 0);
  exact.resize(width);
  for (int64_t j = 0; j < width; ++j) {
    ref::store_element(raw.data(), out, j, u(rng));
    exact[j] = ref::load_element(raw.data(), out, j);
  }
}

// Copies `cols` elements of each of `rows` rows between strided host/device layouts.
void copy_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
             std::size_t row_bytes, int64_t rows, cudaMemcpyKind kind, cudaStream_t s) {
  if (rows == 0 || row_bytes == 0) return;
  SWIFTQK_CUDA_TRY(cudaMemcpy2DAsync(dst, dpitch, src, spitch, row_bytes, rows, kind, s));
}

}  // namespace

Problem Problem::random(int64_t tokens, int64_t q_width, int64_t k_width, DType in, NormOrder order,
                        float eps, uint64_t seed) {
  Problem p;
  p.tokens = tokens;
  p.q_width = q_width;
  p.k_width = k_width;
  p.in = in;
  p.order = order;
  p.eps = eps;
  std::mt19937_64 rng(seed);
  fill_weight(p.wq, p.wqd, q_width, p.out(), rng);
  fill_weight(p.wk, p.wkd, k_width, p.out(), rng);
  p.refill(seed ^ 0x9e3779b97f4a7c15ull);
  return p;
}

void Problem::refill(uint64_t seed) {
  qo.clear();
  ko.clear();
  fill_rows(q, qd, quantised() ? &qo : nullptr, tokens, q_width, in, q_scale, seed * 2 + 1);
  fill_rows(k, kd, quantised() ? &ko : nullptr, tokens, k_width, in, k_scale, seed * 2 + 2);
}

namespace {
std::vector<double> gold_of(const std::vector<double>& x, const std::vector<double>& w,
                            int64_t tokens, int64_t width, float eps) {
  SWIFTQK_EXPECTS(width > 0 && x.size() == static_cast<std::size_t>(tokens * width) &&
                      w.size() == static_cast<std::size_t>(width),
                  "Problem::gold: inputs do not match the problem's shape");
  std::vector<double> y(x.size());
  parallel_for(tokens, [&](int64_t t0, int64_t t1) {
    ref::rms_norm_fp64_rows(x.data(), w.data(), width, eps, t0, t1, y.data());
  });
  return y;
}
}  // namespace

std::vector<double> Problem::gold_q() const { return gold_of(qd, wqd, tokens, q_width, eps); }
std::vector<double> Problem::gold_k() const { return gold_of(kd, wkd, tokens, k_width, eps); }
std::vector<double> Problem::gold_q_original() const {
  SWIFTQK_EXPECTS(quantised(), "Problem::gold_q_original: the inputs are not quantised");
  return gold_of(qo, wqd, tokens, q_width, eps);
}
std::vector<double> Problem::gold_k_original() const {
  SWIFTQK_EXPECTS(quantised(), "Problem::gold_k_original: the inputs are not quantised");
  return gold_of(ko, wkd, tokens, k_width, eps);
}

RankData make_rank(const Problem& p, int world, int rank, Layout layout) {
  RankData d;
  const int64_t qs = p.q_width / world, ks = p.k_width / world;
  const std::size_t is = dtype_size(p.in), os = dtype_size(p.out());
  const int64_t rows = std::max<int64_t>(p.tokens, 1);
  QkNormParams& prm = d.params;
  prm.tokens = p.tokens;
  prm.q_full_width = p.q_width;
  prm.k_full_width = p.k_width;
  prm.in_dtype = p.in;
  prm.eps = p.eps;
  prm.order = p.order;
  prm.q.width = qs;
  prm.k.width = ks;
  prm.q.in_scale = p.q_scale;
  prm.k.in_scale = p.k_scale;
  d.wq = DeviceBuffer(qs * os);
  d.wk = DeviceBuffer(ks * os);
  SWIFTQK_CUDA_TRY(
      cudaMemcpy(d.wq.get(), p.wq.data() + rank * qs * os, qs * os, cudaMemcpyHostToDevice));
  SWIFTQK_CUDA_TRY(
      cudaMemcpy(d.wk.get(), p.wk.data() + rank * ks * os, ks * os, cudaMemcpyHostToDevice));
  prm.q.weight = d.wq.get();
  prm.k.weight = d.wk.get();
  d.rstd = DeviceBuffer(2 * rows * sizeof(float));
  prm.rstd_out = d.rstd.get<float>();
  if (layout == Layout::kSeparate) {
    d.in = DeviceBuffer(rows * (qs + ks) * is);
    d.out = DeviceBuffer(rows * (qs + ks) * os);
    prm.q.in = d.in.get();
    prm.k.in = d.in.get() + rows * qs * is;
    prm.q.out = d.out.get();
    prm.k.out = d.out.get() + rows * qs * os;
    prm.q.in_stride = prm.q.out_stride = qs;
    prm.k.in_stride = prm.k.out_stride = ks;
  } else {
    // A fused QKV projection output: [tokens, q | k | v] with V as wide as K.
    const int64_t stride = qs + 2 * ks;
    d.in = DeviceBuffer(rows * stride * is);
    prm.q.in = d.in.get();
    prm.k.in = d.in.get() + qs * is;
    prm.q.in_stride = prm.k.in_stride = stride;
    prm.q.out_stride = prm.k.out_stride = stride;
    if (layout == Layout::kFusedInPlace) {
      prm.q.out = const_cast<void*>(prm.q.in);
      prm.k.out = const_cast<void*>(prm.k.in);
    } else {
      d.out = DeviceBuffer(rows * stride * os);
      prm.q.out = d.out.get();
      prm.k.out = d.out.get() + qs * os;
    }
  }
  upload_inputs(p, world, rank, d, nullptr);
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  return d;
}

void upload_inputs(const Problem& p, int world, int rank, RankData& d, cudaStream_t s) {
  const int64_t qs = p.q_width / world, ks = p.k_width / world;
  const std::size_t is = dtype_size(p.in);
  const QkNormParams& prm = d.params;
  d.params.q.in_scale = p.q_scale;
  d.params.k.in_scale = p.k_scale;
  copy_2d(const_cast<void*>(prm.q.in), prm.q.in_stride * is, p.q.data() + rank * qs * is,
          p.q_width * is, qs * is, p.tokens, cudaMemcpyHostToDevice, s);
  copy_2d(const_cast<void*>(prm.k.in), prm.k.in_stride * is, p.k.data() + rank * ks * is,
          p.k_width * is, ks * is, p.tokens, cudaMemcpyHostToDevice, s);
}

void poison(RankData& d, cudaStream_t s) {
  const QkNormParams& prm = d.params;
  if (prm.tokens == 0) return;
  const std::size_t os = dtype_size(output_dtype_for(prm.in_dtype));
  for (const ShardView* v : {&prm.q, &prm.k}) {
    if (v->out == v->in) continue;  // in place: the input itself is what gets overwritten
    SWIFTQK_CUDA_TRY(
        cudaMemset2DAsync(v->out, v->out_stride * os, 0xff, v->width * os, prm.tokens, s));
  }
  SWIFTQK_CUDA_TRY(cudaMemsetAsync(d.rstd.get(), 0xff, d.rstd.bytes(), s));
}

namespace {
// Downloads one rank's [tokens, width] output shard into columns of a full [tokens, full] array.
void gather(const void* dev, int64_t stride, int64_t tokens, int64_t width, int64_t full,
            int64_t col0, DType out, std::vector<double>& dst) {
  const std::size_t os = dtype_size(out);
  std::vector<uint8_t> host(tokens * width * os);
  copy_2d(host.data(), width * os, dev, stride * os, width * os, tokens, cudaMemcpyDeviceToHost,
          nullptr);
  SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
  parallel_for(tokens, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t j = 0; j < width; ++j) {
        dst[t * full + col0 + j] = ref::load_element(host.data(), out, t * width + j);
      }
    }
  });
}
}  // namespace

namespace {
// The gold outputs of rank `rank`'s columns of `world` (world 1: the full width): of the stored
// inputs and, for quantised inputs, of the values before quantisation (else empty).
struct Golds {
  std::vector<double> q, k, q_original, k_original;
};

Golds golds_of(const Problem& p, int world, int rank) {
  auto columns = [&](std::vector<double> full, int64_t width) {
    if (world == 1) return full;  // moved, not copied: at 16384 tokens it is a gigabyte
    return ref::column_shard(full, p.tokens, width, world, rank);
  };
  Golds g{columns(p.gold_q(), p.q_width), columns(p.gold_k(), p.k_width), {}, {}};
  if (p.quantised()) {
    g.q_original = columns(p.gold_q_original(), p.q_width);
    g.k_original = columns(p.gold_k_original(), p.k_width);
  }
  return g;
}

// The error metrics and the out-of-tolerance counts of Q and K against the gold of the stored
// inputs, and for quantised inputs the metrics against the gold of the values before
// quantisation: independent serial passes, run at once (each one's result is the same as run
// alone). The tolerance holds the kernel to the stored inputs only: the end-to-end error is
// quantisation error, reported, not bounded.
void compare_both(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                  const Golds& g, Check& c) {
  auto count = [&p](const std::vector<double>& got, const std::vector<double>& gold) {
    return ref::count_out_of_tolerance(got, gold, p.out(), p.order);
  };
  auto q_metrics = std::async(std::launch::async, [&] { return ref::compare(q, g.q); });
  auto k_metrics = std::async(std::launch::async, [&] { return ref::compare(k, g.k); });
  auto q_wrong = std::async(std::launch::async, [&] { return count(q, g.q); });
  std::future<ref::ErrorMetrics> q_e2e, k_e2e;
  if (p.quantised()) {
    q_e2e = std::async(std::launch::async, [&] { return ref::compare(q, g.q_original); });
    k_e2e = std::async(std::launch::async, [&] { return ref::compare(k, g.k_original); });
  }
  const int64_t k_wrong = count(k, g.k);
  c.q = q_metrics.get();
  c.k = k_metrics.get();
  c.wrong = q_wrong.get() + k_wrong;
  c.has_e2e = p.quantised();
  if (c.has_e2e) {
    c.q_e2e = q_e2e.get();
    c.k_e2e = k_e2e.get();
  }
}
}  // namespace

Check check_ranks(const Problem& p, int world, const std::vector<RankData*>& ranks) {
  Check c;
  const int64_t T = p.tokens;
  const int64_t qs = p.q_width / world, ks = p.k_width / world;
  std::vector<double> q(T * p.q_width), k(T * p.k_width);
  std::vector<float> rstd0;
  for (int r = 0; r < world; ++r) {
    const QkNormParams& prm = ranks[r]->params;
    gather(prm.q.out, prm.q.out_stride, T, qs, p.q_width, r * qs, p.out(), q);
    gather(prm.k.out, prm.k.out_stride, T, ks, p.k_width, r * ks, p.out(), k);
    std::vector<float> rs(2 * T);
    if (T > 0) {
      SWIFTQK_CUDA_TRY(cudaMemcpy(rs.data(), ranks[r]->rstd.get(), rs.size() * sizeof(float),
                                  cudaMemcpyDeviceToHost));
    }
    if (r == 0) {
      rstd0 = rs;
    } else if (std::memcmp(rs.data(), rstd0.data(), rs.size() * sizeof(float)) != 0) {
      c.rstd_identical = false;
    }
  }
  compare_both(p, q, k, golds_of(p, 1, 0), c);
  if (c.wrong > 0) {
    c.first_error = "q max_abs " + std::to_string(c.q.max_abs) + " at " +
                    std::to_string(c.q.worst_index) + ", k max_abs " + std::to_string(c.k.max_abs) +
                    " at " + std::to_string(c.k.worst_index);
  }
  return c;
}

Check check_rank(const Problem& p, int world, int rank, const RankData& d) {
  Check c;
  const int64_t T = p.tokens, qs = p.q_width / world, ks = p.k_width / world;
  const QkNormParams& prm = d.params;
  std::vector<double> q(T * qs), k(T * ks);
  gather(prm.q.out, prm.q.out_stride, T, qs, qs, 0, p.out(), q);
  gather(prm.k.out, prm.k.out_stride, T, ks, ks, 0, p.out(), k);
  compare_both(p, q, k, golds_of(p, world, rank), c);
  if (c.wrong > 0) {
    c.first_error = "rank " + std::to_string(rank) + ": q max_abs " + std::to_string(c.q.max_abs) +
                    ", k max_abs " + std::to_string(c.k.max_abs);
  }
  return c;
}

bool outputs_untouched(const Problem& p, int world, const RankData& d) {
  const QkNormParams& prm = d.params;
  const std::size_t os = dtype_size(p.out());
  for (const ShardView* v : {&prm.q, &prm.k}) {
    std::vector<uint8_t> host(p.tokens * v->width * os);
    copy_2d(host.data(), v->width * os, v->out, v->out_stride * os, v->width * os, p.tokens,
            cudaMemcpyDeviceToHost, nullptr);
    SWIFTQK_CUDA_TRY(cudaDeviceSynchronize());
    for (uint8_t b : host) {
      if (b != 0xff) return false;
    }
  }
  (void)world;
  return true;
}

Census census_rank(const Problem& p, int world, int rank, const RankData& d) {
  const int64_t T = p.tokens, qs = p.q_width / world, ks = p.k_width / world;
  const QkNormParams& prm = d.params;
  std::vector<double> q(T * qs), k(T * ks);
  gather(prm.q.out, prm.q.out_stride, T, qs, qs, 0, p.out(), q);
  gather(prm.k.out, prm.k.out_stride, T, ks, ks, 0, p.out(), k);
  const std::vector<double> gq = p.gold_q(), gk = p.gold_k();
  Census c;
  // NaNs are counted, then replaced by the gold value, so one tolerance pass counts the rest.
  auto classify = [&](std::vector<double>& got, const std::vector<double>& gold, int64_t width,
                      int64_t full, int64_t col0) {
    std::vector<double> slice(got.size());
    int64_t nan = 0;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < width; ++j) {
        const double g = gold[t * full + col0 + j];
        slice[t * width + j] = g;
        if (std::isnan(got[t * width + j])) {
          ++nan;
          got[t * width + j] = g;
        }
      }
    }
    const int64_t wrong = ref::count_out_of_tolerance(got, slice, p.out(), p.order);
    c.nan += nan;
    c.wrong += wrong;
    c.correct += static_cast<int64_t>(got.size()) - nan - wrong;
  };
  classify(q, gq, qs, p.q_width, rank * qs);
  classify(k, gk, ks, p.k_width, rank * ks);
  return c;
}

}  // namespace swiftqk::testing
