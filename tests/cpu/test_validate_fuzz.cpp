// Property-based fuzz test of validate_params and vector_bytes_for against an independent,
// brute-force oracle. Random QkNormParams are laid out over a host arena; the oracle never
// reads through the pointers: it works on the arena offsets the generator recorded, marks every
// byte each tensor touches in a byte map, and decides overlap by exact byte intersection. The
// test then requires validate_params to throw swiftqk::Error if and only if the oracle says the
// call is invalid, and vector_bytes_for to agree with a model of the 16-byte vector rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <bitset>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "swiftqk/error.hpp"
#include "swiftqk/qk_norm_params.hpp"
#include "swiftqk/types.hpp"

namespace swiftqk {
namespace {

constexpr uint64_t kSeed = 0x5eed'9c0f'fee0'2026ULL;
constexpr int kCases = 20000;
constexpr int kMaxReported = 5;  // stop after this many oracle/validator disagreements

constexpr int64_t kArenaBytes = 4 << 20;
constexpr int64_t kMargin = 64 << 10;  // room below the first region for negative shifts

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kFltMax = std::numeric_limits<float>::max();

// ---------------------------------------------------------------- the oracle's own tables

// Element sizes by DType value, written out independently of dtype_size / output_dtype_for.
// Index: 0 f32, 1 f16, 2 bf16, 3 fp8 e4m3 (whose output and weight are bf16).
constexpr int64_t kInSize[4] = {4, 2, 2, 1};
constexpr int64_t kOutSize[4] = {4, 2, 2, 2};
bool DTypeInRange(int dt) { return dt == 0 || dt == 1 || dt == 2 || dt == 3; }
int64_t InSizeOr2(int dt) { return DTypeInRange(dt) ? kInSize[dt] : 2; }
int64_t OutSizeOr2(int dt) { return DTypeInRange(dt) ? kOutSize[dt] : 2; }

// Methods are a growing list; a value is a Method when the enum has a name for it (to_string
// throws for any other value). Valid values are 0 .. kNumMethods - 1.
bool MethodHasName(int m) {
  try {
    return !to_string(static_cast<Method>(m)).empty();
  } catch (const Error&) {
    return false;
  }
}
int CountMethods() {
  int n = 0;
  while (n < 64 && MethodHasName(n)) ++n;
  return n;
}
const int kNumMethods = CountMethods();
bool MethodInRange(int m) { return m >= 0 && m < kNumMethods; }

// ---------------------------------------------------------------- a case, in arena offsets

struct Ptr {
  bool null = true;
  int64_t off = 0;  // byte offset from the (256-byte aligned) arena base
};

Ptr At(int64_t off) { return {false, off}; }

struct Shard {
  Ptr in, out, weight;
  int64_t width = 0, in_stride = 0, out_stride = 0;
  float in_scale = 1.0f;
};

struct Case {
  int world = 1;
  int dtype = 2;
  int order = 0;
  int method = 0;
  int64_t tokens = 0, q_full = 0, k_full = 0;
  float eps = 1e-6f;
  Shard q, k;
  Ptr rstd;
  std::string layout;         // how the generator placed the tensors
  std::string perturbations;  // what it broke afterwards
};

std::string PtrStr(const Ptr& p) {
  if (p.null) return "null";
  std::ostringstream s;
  s << "+0x" << std::hex << p.off;
  return s.str();
}

std::string FloatStr(float f) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(f));
  return buf;
}

std::string ShardStr(const char* name, const Shard& v) {
  std::ostringstream s;
  s << name << "{in=" << PtrStr(v.in) << " out=" << PtrStr(v.out) << " weight=" << PtrStr(v.weight)
    << " width=" << v.width << " in_stride=" << v.in_stride << " out_stride=" << v.out_stride
    << " in_scale=" << FloatStr(v.in_scale) << "}";
  return s.str();
}

std::string Describe(const Case& c) {
  std::ostringstream s;
  s << "world=" << c.world << " dtype=" << c.dtype << " order=" << c.order << " method=" << c.method
    << " tokens=" << c.tokens << " q_full=" << c.q_full << " k_full=" << c.k_full
    << " eps=" << FloatStr(c.eps) << "\n  " << ShardStr("q", c.q) << "\n  " << ShardStr("k", c.k)
    << "\n  rstd_out=" << PtrStr(c.rstd) << "\n  layout: " << c.layout
    << "\n  perturbations:" << (c.perturbations.empty() ? " none" : c.perturbations);
  return s.str();
}

// ---------------------------------------------------------------- deterministic generator

// Maps mt19937_64's raw output to ranges itself (not through std::uniform_*_distribution, whose
// output differs between standard libraries), so a seed gives the same cases everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : mt_(seed) {}
  uint64_t Next() { return mt_(); }
  int64_t Range(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool Chance(double p) { return static_cast<double>(Next() >> 11) * 0x1.0p-53 < p; }
  double Uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(Next() >> 11) * 0x1.0p-53;
  }
  template <typename T>
  T Pick(std::initializer_list<T> xs) {
    return *(xs.begin() + Range(0, static_cast<int64_t>(xs.size()) - 1));
  }

 private:
  std::mt19937_64 mt_;
};

int64_t RoundUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// Bump allocator over the arena with random gaps: sometimes adjacent, sometimes a few bytes
// apart (only element aligned), usually 16- or 256-byte aligned.
class Allocator {
 public:
  explicit Allocator(Rng& g) : g_(g) {}
  int64_t Alloc(int64_t bytes, int64_t elem) {
    int64_t off;
    const int64_t r = g_.Range(0, 9);
    if (r < 2) {
      off = RoundUp(cursor_, elem);  // adjacent to the previous region
    } else if (r < 4) {
      off = RoundUp(cursor_ + g_.Range(0, 40), elem);
    } else if (r < 8) {
      off = RoundUp(cursor_ + 16 * g_.Range(0, 3), 16);
    } else {
      off = RoundUp(cursor_ + 1, 256);
    }
    cursor_ = off + bytes;
    return off;
  }

 private:
  Rng& g_;
  int64_t cursor_ = kMargin;
};

int64_t ShardWidth(Rng& g) {
  const int64_t r = g.Range(0, 9);
  if (r < 4) return g.Pick<int64_t>({8, 16, 32, 64, 128});
  if (r < 7) return g.Range(1, 16);
  if (r < 9) return 8 * g.Range(1, 8);
  return g.Range(17, 200);
}

int64_t Padded(Rng& g, int64_t w) {
  const int64_t r = g.Range(0, 9);
  if (r < 6) return w;
  if (r < 8) return w + g.Range(1, 8);
  return w + 8 * g.Range(1, 8);
}

int64_t TensorBytes(int64_t rows, int64_t width, int64_t stride, int64_t elem) {
  return ((rows - 1) * stride + width) * elem;
}

// The clean part of a case: consistent scalars and one of a few realistic layouts.
Case GenerateClean(Rng& g) {
  Case c;
  c.world = g.Chance(0.93) ? g.Pick({1, 2, 3, 4, 8}) : g.Pick({0, 64, -1});
  c.dtype = static_cast<int>(g.Range(0, 3));
  c.order = static_cast<int>(g.Range(0, 1));
  c.method = static_cast<int>(g.Range(0, kNumMethods - 1));
  const int64_t t = g.Range(0, 99);
  c.tokens = t < 5 ? 0 : t < 22 ? 1 : t < 35 ? 2 : t < 70 ? g.Range(3, 8) : g.Range(9, 50);
  c.eps = g.Pick({1e-6f, 1e-5f, 1e-12f, std::numeric_limits<float>::denorm_min(), 1.0f, kFltMax});
  const int64_t world_for_widths = c.world >= 1 ? c.world : 2;
  c.q.width = ShardWidth(g);
  c.k.width = g.Chance(0.5) ? ShardWidth(g) : c.q.width;
  c.q_full = c.q.width * world_for_widths;
  c.k_full = c.k.width * world_for_widths;
  for (Shard* v : {&c.q, &c.k}) {
    v->in_scale = 1.0f;
    if (c.dtype == 3 && g.Chance(0.6)) {
      v->in_scale = g.Chance(0.2)
                        ? g.Pick({std::numeric_limits<float>::denorm_min(), kFltMax, 0.5f, 448.0f})
                        : static_cast<float>(g.Uniform(1e-3, 100.0));
    }
  }

  const int64_t is = kInSize[c.dtype], os = kOutSize[c.dtype];
  const int64_t rows = c.tokens > 0 ? c.tokens : 1;
  Allocator a(g);
  const int64_t mode = g.Range(0, 99);
  if (mode < 40) {
    c.layout = "separate buffers";
    for (Shard* v : {&c.q, &c.k}) {
      v->in_stride = Padded(g, v->width);
      v->out_stride = g.Chance(0.5) ? v->in_stride : Padded(g, v->width);
    }
    // Place the six tensors in a random order so every pair gets to be neighbours.
    std::vector<int> order = {0, 1, 2, 3, 4, 5};
    for (int i = 5; i > 0; --i) std::swap(order[i], order[g.Range(0, i)]);
    for (int which : order) {
      Shard& v = which % 2 == 0 ? c.q : c.k;
      switch (which / 2) {
        case 0:
          v.in = At(a.Alloc(TensorBytes(rows, v.width, v.in_stride, is), is));
          break;
        case 1:
          v.out = At(a.Alloc(TensorBytes(rows, v.width, v.out_stride, os), os));
          break;
        default:
          v.weight = At(a.Alloc(v.width * os, os));
          break;
      }
    }
  } else if (mode < 55) {
    c.layout = "separate buffers, normalised in place";
    for (Shard* v : {&c.q, &c.k}) {
      v->in_stride = v->out_stride = Padded(g, v->width);
      v->in = v->out = At(a.Alloc(TensorBytes(rows, v->width, v->in_stride, is), is));
      v->weight = At(a.Alloc(v->width * os, os));
    }
    if (g.Chance(0.3)) {  // one shard out of place
      Shard& v = g.Chance(0.5) ? c.q : c.k;
      v.out = At(a.Alloc(TensorBytes(rows, v.width, v.out_stride, os), os));
      c.layout += " (one shard out of place)";
    }
  } else {
    // Q and K as column views of a fused [T, Hq/N + 2 Hk/N (+ pad)] QKV buffer.
    const int64_t fused = c.q.width + 2 * c.k.width + (g.Chance(0.6) ? 0 : g.Range(1, 24));
    const int64_t in_base = a.Alloc(rows * fused * is, is);
    c.q.in = At(in_base);
    c.k.in = At(in_base + c.q.width * is);
    c.q.in_stride = c.k.in_stride = fused;
    if (mode < 80) {
      c.layout = "fused QKV, in place";
      c.q.out = c.q.in;
      c.k.out = c.k.in;
      c.q.out_stride = c.k.out_stride = fused;
    } else if (mode < 92) {
      c.layout = "fused QKV into a second fused buffer";
      const int64_t out_base = a.Alloc(rows * fused * os, os);
      c.q.out = At(out_base);
      c.k.out = At(out_base + c.q.width * os);
      c.q.out_stride = c.k.out_stride = fused;
    } else {
      c.layout = "fused QKV into plain buffers";
      for (Shard* v : {&c.q, &c.k}) {
        v->out_stride = Padded(g, v->width);
        v->out = At(a.Alloc(TensorBytes(rows, v->width, v->out_stride, os), os));
      }
    }
    c.q.weight = At(a.Alloc(c.q.width * os, os));
    c.k.weight = At(a.Alloc(c.k.width * os, os));
  }
  if (g.Chance(0.55)) c.rstd = At(a.Alloc(2 * rows * 4, 4));
  return c;
}

// All pointer slots of a case, with the element size each is laid out in.
struct Slot {
  Ptr* ptr;
  const char* name;
  int64_t elem;
  Shard* shard;  // null for rstd_out
};

std::vector<Slot> Slots(Case& c) {
  const int64_t is = InSizeOr2(c.dtype), os = OutSizeOr2(c.dtype);
  return {{&c.q.in, "q.in", is, &c.q},         {&c.k.in, "k.in", is, &c.k},
          {&c.q.out, "q.out", os, &c.q},       {&c.k.out, "k.out", os, &c.k},
          {&c.q.weight, "q.weight", os, &c.q}, {&c.k.weight, "k.weight", os, &c.k},
          {&c.rstd, "rstd_out", 4, nullptr}};
}

// Breaks one thing, or moves something in a way that may or may not break the call.
void Perturb(Rng& g, Case& c) {
  std::vector<Slot> slots = Slots(c);
  auto note = [&](const std::string& s) { c.perturbations += " [" + s + "]"; };
  Shard& v = g.Chance(0.5) ? c.q : c.k;
  const char* vn = &v == &c.q ? "q" : "k";
  switch (g.Range(0, 16)) {
    case 0: {  // a null pointer
      Slot& s = slots[g.Range(0, 5)];
      *s.ptr = Ptr{};
      note(std::string(s.name) + " = null");
      break;
    }
    case 1: {  // misaligned by one (or a few) bytes
      Slot& s = slots[g.Range(0, 6)];
      if (s.ptr->null) break;
      const int64_t by = s.elem > 1 ? g.Range(1, s.elem - 1) : 1;
      s.ptr->off += by;
      note(std::string(s.name) + " += " + std::to_string(by) + " B");
      break;
    }
    case 2: {  // shifted by a few elements, a row, or a whole tensor
      Slot& s = slots[g.Range(0, 6)];
      if (s.ptr->null) break;
      const int64_t w = s.shard ? s.shard->width : 2 * std::max<int64_t>(c.tokens, 1);
      const int64_t st = s.shard ? std::max(s.shard->in_stride, s.shard->out_stride) : w;
      const int64_t n =
          g.Pick<int64_t>({1, 2, 3, w - 1, w, st, st * std::max<int64_t>(c.tokens, 1)});
      const int64_t by = (g.Chance(0.5) ? n : -n) * s.elem;
      s.ptr->off += by;
      note(std::string(s.name) + " += " + std::to_string(by) + " B");
      break;
    }
    case 3: {  // an output aimed at (or near) another tensor
      const int64_t ti = g.Pick<int64_t>({2, 3, 6});
      Slot& t = slots[ti];
      Slot& src = slots[g.Range(0, 6)];
      if (&t == &src || src.ptr->null) break;
      const int64_t sw = src.shard ? src.shard->width : 2;
      const int64_t n = g.Pick<int64_t>({0, 0, 0, 1, -1, 2, sw, sw - 1});
      *t.ptr = At(src.ptr->off + n * t.elem);
      if (t.shard && src.shard && g.Chance(0.5)) {
        Shard& tv = *t.shard;
        tv.out_stride = src.ptr == &src.shard->out || src.ptr == &src.shard->weight
                            ? src.shard->out_stride
                            : src.shard->in_stride;
        if (tv.out_stride < tv.width) tv.out_stride = tv.width;
      }
      note(std::string(t.name) + " = " + src.name + " + " + std::to_string(n) + " elems");
      break;
    }
    case 4: {  // an input or weight aimed into an output
      Slot& t = slots[g.Pick<int64_t>({0, 1, 4, 5})];
      Slot& src = slots[g.Pick<int64_t>({2, 3, 6})];
      if (src.ptr->null) break;
      const int64_t n = g.Pick<int64_t>({0, 1, 3, 8, 31});
      *t.ptr = At(src.ptr->off + n * t.elem);
      note(std::string(t.name) + " = " + src.name + " + " + std::to_string(n) + " elems");
      break;
    }
    case 5: {  // one stride changed (an in-place view stops being one)
      int64_t& st = g.Chance(0.5) ? v.in_stride : v.out_stride;
      const int64_t d = g.Pick<int64_t>({1, -1, 8, 16, v.width});
      st += d;
      note(std::string(vn) + " stride += " + std::to_string(d));
      break;
    }
    case 6: {  // a stride smaller than the width
      int64_t& st = g.Chance(0.5) ? v.in_stride : v.out_stride;
      st = g.Pick<int64_t>({v.width - 1, 0, -v.width, -1});
      note(std::string(vn) + " stride = " + std::to_string(st));
      break;
    }
    case 7: {  // a shard width that does not match full / world
      const int64_t w =
          g.Pick<int64_t>({v.width + 1, v.width - 1, 0, &v == &c.q ? c.q_full : c.k_full});
      v.width = w;
      if (g.Chance(0.5)) {
        v.in_stride = std::max(v.in_stride, w);
        v.out_stride = std::max(v.out_stride, w);
      }
      note(std::string(vn) + ".width = " + std::to_string(w));
      break;
    }
    case 8: {  // a full width that is not positive or not divisible
      int64_t& f = &v == &c.q ? c.q_full : c.k_full;
      f = g.Pick<int64_t>({0, -f, f + 1, f - 1, 2 * f});
      note(std::string(vn) + "_full = " + std::to_string(f));
      break;
    }
    case 9:
      c.world = g.Pick({0, -1, -8, 64, c.world + 1, 2 * c.world});
      note("world = " + std::to_string(c.world));
      break;
    case 10:
      c.tokens = g.Pick<int64_t>({-1, -2, -50, std::numeric_limits<int64_t>::min()});
      note("tokens = " + std::to_string(c.tokens));
      break;
    case 11:
      c.eps = g.Pick({0.0f, -0.0f, -1e-6f, kNaN, kInf, -kInf, -kFltMax});
      note("eps = " + FloatStr(c.eps));
      break;
    case 12:
      v.in_scale = g.Pick({0.0f, -0.0f, -0.5f, kNaN, kInf, -kInf, 0.5f, 2.0f});
      note(std::string(vn) + ".in_scale = " + FloatStr(v.in_scale));
      break;
    case 13:  // a DType out of range, or another valid one (sizes change under the layout)
      c.dtype = g.Chance(0.5) ? g.Pick({4, -1, 7, 255}) : static_cast<int>(g.Range(0, 3));
      note("dtype = " + std::to_string(c.dtype));
      break;
    case 14:  // a NormOrder or Method out of range
      if (g.Chance(0.5)) {
        c.order = g.Pick({2, -1, 5});
        note("order = " + std::to_string(c.order));
      } else {
        c.method = g.Pick({kNumMethods, -1, 1000});
        note("method = " + std::to_string(c.method));
      }
      break;
    case 15: {  // a whole shard view moved (in and out together: in place stays in place)
      const int64_t n = g.Pick<int64_t>({1, -1, 2, -3, v.width, -v.width, 5});
      if (!v.in.null) v.in.off += n * InSizeOr2(c.dtype);
      if (!v.out.null) v.out.off += n * OutSizeOr2(c.dtype);
      note(std::string(vn) + " view += " + std::to_string(n) + " elems");
      break;
    }
    default: {  // more rows than the layout was made for: rows run into the neighbours
      if (c.tokens < 0) break;
      const int64_t n = g.Range(1, 5);
      c.tokens += n;
      note("tokens += " + std::to_string(n));
      break;
    }
  }
}

bool InsideArena(const Case& c) {
  const int64_t rows = c.tokens > 0 && c.tokens < 1000 ? c.tokens : 1;
  const int64_t is = InSizeOr2(c.dtype), os = OutSizeOr2(c.dtype);
  auto fits = [&](const Ptr& p, int64_t width, int64_t stride, int64_t elem, int64_t nrows) {
    if (p.null) return true;
    const int64_t w = std::abs(width), s = std::max(std::abs(stride), w);
    return p.off >= 0 && p.off + ((nrows - 1) * s + w) * elem <= kArenaBytes;
  };
  for (const Shard* v : {&c.q, &c.k}) {
    if (!fits(v->in, v->width, v->in_stride, is, rows) ||
        !fits(v->out, v->width, v->out_stride, os, rows) ||
        !fits(v->weight, v->width, v->width, os, 1)) {
      return false;
    }
  }
  return fits(c.rstd, 2 * rows, 2 * rows, 4, 1);
}

Case Generate(Rng& g, int* retries) {
  for (;;) {
    Case c = GenerateClean(g);
    if (g.Chance(0.55)) {
      const int64_t n = g.Pick<int64_t>({1, 1, 1, 2, 3});
      for (int64_t i = 0; i < n; ++i) Perturb(g, c);
    }
    if (InsideArena(c)) return c;
    ++*retries;
  }
}

// ---------------------------------------------------------------- the oracle

enum Rule : int {
  kWorld,
  kTokens,
  kEps,
  kOrder,
  kMethod,
  kDType,
  kQFullPositive,
  kQFullDivisible,
  kQWidth,
  kQInStride,
  kQOutStride,
  kQScalePositive,
  kQScaleOne,
  kKFullPositive,
  kKFullDivisible,
  kKWidth,
  kKInStride,
  kKOutStride,
  kKScalePositive,
  kKScaleOne,
  kNull,
  kMisaligned,
  kRstdMisaligned,
  kOutOverlapsOwnInput,    // partial in place
  kOutOverlapsOtherOut,    // q.out and k.out share a byte
  kOutOverlapsOtherInput,  // q.out / k.in or k.out / q.in
  kOutOverlapsWeight,
  kRstdOverlaps,
  kStridesDifferRangesMeet,  // the documented conservative rule (no byte shared), two [T, w]
  kStridesDifferVectorMeet,  // the same rule where one side is a weight or rstd_out
  kNumRules
};

const char* const kRuleNames[kNumRules] = {"world >= 1",
                                           "tokens >= 0",
                                           "eps finite > 0",
                                           "order in range",
                                           "method in range",
                                           "dtype in range",
                                           "q_full > 0",
                                           "q_full % world == 0",
                                           "q.width == q_full / world",
                                           "q.in_stride >= width",
                                           "q.out_stride >= width",
                                           "q.in_scale finite > 0",
                                           "q.in_scale == 1 unless fp8",
                                           "k_full > 0",
                                           "k_full % world == 0",
                                           "k.width == k_full / world",
                                           "k.in_stride >= width",
                                           "k.out_stride >= width",
                                           "k.in_scale finite > 0",
                                           "k.in_scale == 1 unless fp8",
                                           "pointer non-null",
                                           "pointer element aligned",
                                           "rstd_out 4-byte aligned",
                                           "out shares a byte with own in (not in place)",
                                           "q.out shares a byte with k.out",
                                           "out shares a byte with the other input",
                                           "out shares a byte with a weight",
                                           "rstd_out shares a byte with a tensor",
                                           "strides differ and [lo, hi) ranges meet",
                                           "as above, one side a weight or rstd_out"};

// Text the error must contain when the oracle finds exactly this one problem.
const char* const kRuleNeedles[kNumRules] = {"TP degree",
                                             "tokens",
                                             "eps",
                                             "order",
                                             "method",
                                             "in_dtype",
                                             "q_full_width must be positive",
                                             "q_full_width",
                                             "q.width",
                                             "q.in_stride",
                                             "q.out_stride",
                                             "q.in_scale must be finite",
                                             "q.in_scale applies to fp8",
                                             "k_full_width must be positive",
                                             "k_full_width",
                                             "k.width",
                                             "k.in_stride",
                                             "k.out_stride",
                                             "k.in_scale must be finite",
                                             "k.in_scale applies to fp8",
                                             "is null",
                                             "is not aligned",
                                             "rstd_out is not aligned",
                                             "partly overlaps",
                                             "q.out and k.out overlap",
                                             "overlaps",
                                             "overlaps a weight",
                                             "rstd_out overlaps",
                                             "overlap",
                                             "overlap"};

using Verdict = std::bitset<kNumRules>;

// What one tensor touches: `rows` runs of `row_bytes` bytes, `stride_bytes` apart.
struct Region {
  int64_t off, rows, row_bytes, stride_bytes;
  int64_t lo() const { return off; }
  int64_t hi() const { return off + (rows - 1) * stride_bytes + row_bytes; }
};

// One bit per tensor per arena byte. Only the bytes a case marks are visited (and cleared).
class ByteMap {
 public:
  ByteMap() : bits_(kArenaBytes, 0) {}
  template <typename Fn>
  void ForEachByte(const Region& r, Fn&& fn) {
    for (int64_t row = 0; row < r.rows; ++row) {
      const int64_t start = r.off + row * r.stride_bytes;
      for (int64_t b = 0; b < r.row_bytes; ++b) fn(bits_[start + b]);
    }
  }
  void Mark(const Region& r, uint8_t bit) {
    ForEachByte(r, [bit](uint8_t& x) { x |= bit; });
  }
  // OR of the marks on the bytes r touches.
  uint8_t Seen(const Region& r) {
    uint8_t seen = 0;
    ForEachByte(r, [&seen](uint8_t& x) { seen |= x; });
    return seen;
  }
  void Clear(const Region& r) {
    ForEachByte(r, [](uint8_t& x) { x = 0; });
  }

 private:
  std::vector<uint8_t> bits_;
};

Verdict Oracle(const Case& c, ByteMap& map) {
  Verdict bad;
  // (a) scalar rules.
  if (!(c.world >= 1)) bad.set(kWorld);
  if (!(c.tokens >= 0)) bad.set(kTokens);
  if (!(c.eps > 0.0f && c.eps <= kFltMax)) bad.set(kEps);  // NaN fails both comparisons
  if (!(c.order == 0 || c.order == 1)) bad.set(kOrder);
  if (!MethodInRange(c.method)) bad.set(kMethod);
  if (!DTypeInRange(c.dtype)) bad.set(kDType);
  auto shard_rules = [&](const Shard& v, int64_t full, int first) {
    if (!(full > 0)) bad.set(first + 0);
    if (c.world >= 1 && full > 0) {
      if (full % c.world != 0) {
        bad.set(first + 1);
      } else if (v.width * c.world != full) {
        bad.set(first + 2);
      }
    }
    if (!(v.in_stride >= v.width)) bad.set(first + 3);
    if (!(v.out_stride >= v.width)) bad.set(first + 4);
    if (!(v.in_scale > 0.0f && v.in_scale <= kFltMax)) {
      bad.set(first + 5);
    } else if (c.dtype != 3 && v.in_scale != 1.0f) {
      bad.set(first + 6);
    }
  };
  shard_rules(c.q, c.q_full, kQFullPositive);
  shard_rules(c.k, c.k_full, kKFullPositive);
  if (c.tokens <= 0 || !DTypeInRange(c.dtype)) return bad;

  // (b) pointers, when there are rows to touch. Checked even after a scalar rule failed, so
  // that a case's list of problems is complete up to the byte maps.
  const int64_t is = kInSize[c.dtype], os = kOutSize[c.dtype];
  const std::pair<const Ptr*, int64_t> ptrs[] = {{&c.q.in, is},     {&c.k.in, is},
                                                 {&c.q.out, os},    {&c.k.out, os},
                                                 {&c.q.weight, os}, {&c.k.weight, os}};
  for (const auto& [p, elem] : ptrs) {
    if (p->null) {
      bad.set(kNull);
    } else if (p->off % elem != 0) {  // the arena base is 256-byte aligned
      bad.set(kMisaligned);
    }
  }
  if (!c.rstd.null && c.rstd.off % 4 != 0) bad.set(kRstdMisaligned);

  // (c) memory safety by byte maps. They need real shapes and addresses only (misaligned
  // pointers and the other scalars do not matter), so they are built whenever those exist.
  for (const Shard* v : {&c.q, &c.k}) {
    if (v->width <= 0 || v->in_stride < v->width || v->out_stride < v->width) return bad;
  }
  if (bad.test(kNull)) return bad;
  enum { QI, KI, QO, KO, QW, KW, R, N };
  Region reg[N] = {
      {c.q.in.off, c.tokens, c.q.width * is, c.q.in_stride * is},
      {c.k.in.off, c.tokens, c.k.width * is, c.k.in_stride * is},
      {c.q.out.off, c.tokens, c.q.width * os, c.q.out_stride * os},
      {c.k.out.off, c.tokens, c.k.width * os, c.k.out_stride * os},
      {c.q.weight.off, 1, c.q.width * os, c.q.width * os},
      {c.k.weight.off, 1, c.k.width * os, c.k.width * os},
      {c.rstd.off, 1, 2 * c.tokens * 4, 2 * c.tokens * 4},
  };
  const int n = c.rstd.null ? R : N;
  for (int i = 0; i < n; ++i) map.Mark(reg[i], static_cast<uint8_t>(1u << i));
  uint8_t seen[N] = {};
  for (int i = 0; i < n; ++i) seen[i] = map.Seen(reg[i]);
  for (int i = 0; i < n; ++i) map.Clear(reg[i]);
  auto shares = [&](int a, int b) { return (seen[a] >> b & 1u) != 0; };

  // In place: the output is exactly its input (same pointer, same stride, same element size).
  const bool q_in_place = c.q.out.off == c.q.in.off && c.q.out_stride == c.q.in_stride && is == os;
  const bool k_in_place = c.k.out.off == c.k.in.off && c.k.out_stride == c.k.in_stride && is == os;
  // Every written tensor against every other tensor.
  for (int o : {QO, KO, R}) {
    if (o >= n) continue;
    for (int x = 0; x < n; ++x) {
      if (x == o) continue;
      if ((o == QO && x == QI && q_in_place) || (o == KO && x == KI && k_in_place)) continue;
      int rule;
      if (o == R || x == R) {
        rule = kRstdOverlaps;
      } else if ((o == QO && x == QI) || (o == KO && x == KI)) {
        rule = kOutOverlapsOwnInput;
      } else if (x == QO || x == KO) {
        rule = kOutOverlapsOtherOut;
      } else if (x == QI || x == KI) {
        rule = kOutOverlapsOtherInput;
      } else {
        rule = kOutOverlapsWeight;
      }
      if (shares(o, x)) {
        bad.set(rule);
        continue;
      }
      // validate_params is conservative in one documented way: two tensors whose strides (in
      // bytes) differ are rejected when their [lo, hi) address ranges meet, even if they share
      // no byte. The oracle treats that as invalid too; any other disagreement is a bug. (A
      // weight or rstd_out is one dense row; its stride is its own length, as in validate.cpp.)
      const Region& a = reg[o];
      const Region& b = reg[x];
      if (a.stride_bytes != b.stride_bytes && a.lo() < b.hi() && b.lo() < a.hi()) {
        bad.set(a.rows > 1 && b.rows > 1 ? kStridesDifferRangesMeet : kStridesDifferVectorMeet);
      }
    }
  }
  return bad;
}

// vector_bytes_for's rules, modelled: 16 when every width and stride is a whole number of
// 16-byte input vectors, inputs are 16-byte aligned and outputs and weights are aligned to
// min(16, the bytes of one vector's worth of outputs); else the input element size.
int ModelVectorBytes(const Case& c) {
  const int64_t is = kInSize[c.dtype], os = kOutSize[c.dtype];
  const int64_t vec = 16 / is;
  const int64_t out_align = std::min<int64_t>(16, vec * os);
  auto addr = [](const Ptr& p) { return p.null ? int64_t{0} : p.off; };
  bool ok = true;
  for (const Shard* v : {&c.q, &c.k}) {
    ok = ok && v->width % vec == 0 && v->in_stride % vec == 0 && v->out_stride % vec == 0;
    ok = ok && addr(v->in) % 16 == 0 && addr(v->out) % out_align == 0 &&
         addr(v->weight) % out_align == 0;
  }
  return ok ? 16 : static_cast<int>(is);
}

// ---------------------------------------------------------------- running a case

class Arena {
 public:
  Arena() : bytes_(kArenaBytes + 256) {
    const uintptr_t raw = reinterpret_cast<uintptr_t>(bytes_.data());
    base_ = bytes_.data() + ((256 - raw % 256) % 256);  // 256-byte aligned, still in the arena
  }
  void* At(const Ptr& p) { return p.null ? nullptr : base_ + p.off; }

 private:
  std::vector<uint8_t> bytes_;
  uint8_t* base_ = nullptr;
};

QkNormParams Materialize(const Case& c, Arena& arena) {
  QkNormParams p;
  p.tokens = c.tokens;
  p.q_full_width = c.q_full;
  p.k_full_width = c.k_full;
  p.in_dtype = static_cast<DType>(c.dtype);
  p.eps = c.eps;
  p.order = static_cast<NormOrder>(c.order);
  p.method = static_cast<Method>(c.method);
  for (auto [dst, src] : {std::pair<ShardView*, const Shard*>{&p.q, &c.q}, {&p.k, &c.k}}) {
    dst->in = arena.At(src->in);
    dst->out = arena.At(src->out);
    dst->weight = arena.At(src->weight);
    dst->width = src->width;
    dst->in_stride = src->in_stride;
    dst->out_stride = src->out_stride;
    dst->in_scale = src->in_scale;
  }
  p.rstd_out = static_cast<float*>(arena.At(c.rstd));
  return p;
}

// what() must read "<path>validate.cpp:<line>: <descriptive message>".
::testing::AssertionResult WellFormed(const Error& e) {
  const std::string what = e.what();
  const std::string tag = "validate.cpp:";
  const std::size_t at = what.find(tag);
  if (at == std::string::npos) return ::testing::AssertionFailure() << "no file:line in " << what;
  std::size_t i = at + tag.size();
  const std::size_t digits = i;
  while (i < what.size() && std::isdigit(static_cast<unsigned char>(what[i]))) ++i;
  if (i == digits || what.compare(i, 2, ": ") != 0) {
    return ::testing::AssertionFailure() << "no line number in " << what;
  }
  const std::string message = what.substr(i + 2);
  int letters = 0;
  for (char ch : message) letters += std::isalpha(static_cast<unsigned char>(ch)) ? 1 : 0;
  if (letters < 8) return ::testing::AssertionFailure() << "message too terse: " << what;
  const std::string file = e.file();
  if (e.line() <= 0 || file.size() < 12 ||
      file.compare(file.size() - 12, 12, "validate.cpp") != 0) {
    return ::testing::AssertionFailure() << "file()/line() are " << file << ":" << e.line();
  }
  return ::testing::AssertionSuccess();
}

std::string RuleList(const Verdict& v) {
  std::string s;
  for (int r = 0; r < kNumRules; ++r) {
    if (v.test(r)) s += std::string(s.empty() ? "" : ", ") + kRuleNames[r];
  }
  return s.empty() ? "none" : s;
}

struct Outcome {
  bool threw = false;
  std::string what;
  std::string other;  // a non-swiftqk exception, if any
  int line = 0;
};

Outcome RunValidate(const QkNormParams& p, int world) {
  Outcome o;
  try {
    validate_params(p, world);
  } catch (const Error& e) {
    o.threw = true;
    o.what = e.what();
    o.line = e.line();
    EXPECT_TRUE(WellFormed(e));
  } catch (const std::exception& e) {
    o.threw = true;
    o.other = e.what();
  }
  return o;
}

// ---------------------------------------------------------------- the fuzz test

TEST(ValidateFuzz, ValidatorAgreesWithByteMapOracle) {
  Rng g(kSeed);
  Arena arena;
  ByteMap map;
  int retries = 0, valid = 0, invalid = 0, mismatches = 0, cases = 0;
  int vec16 = 0, vec_scalar = 0, sole_checked = 0, in_place_valid = 0;
  int decided_by_conservative_2d = 0, decided_by_conservative_vector = 0;
  int rule_hits[kNumRules] = {};
  std::map<int, int> lines_hit;
  for (; cases < kCases && mismatches < kMaxReported; ++cases) {
    const Case c = Generate(g, &retries);
    const Verdict bad = Oracle(c, map);
    const QkNormParams p = Materialize(c, arena);
    const Outcome o = RunValidate(p, c.world);
    ASSERT_TRUE(o.other.empty()) << "non-swiftqk exception: " << o.other << "\n  " << Describe(c);
    for (int r = 0; r < kNumRules; ++r) rule_hits[r] += bad.test(r) ? 1 : 0;
    if (o.threw) ++lines_hit[o.line];
    if (o.threw != bad.any()) {
      ++mismatches;
      ADD_FAILURE() << "case " << cases << ": oracle says "
                    << (bad.any() ? "invalid (" + RuleList(bad) + ")" : "valid")
                    << ", validate_params " << (o.threw ? "threw: " + o.what : "accepted") << "\n  "
                    << Describe(c);
      continue;
    }
    if (bad.none()) {
      ++valid;
      if (c.tokens > 0 && !c.q.in.null && c.q.in.off == c.q.out.off) ++in_place_valid;
      const int want = ModelVectorBytes(c);
      const int got = vector_bytes_for(p);
      ++(want == 16 ? vec16 : vec_scalar);
      if (got != want) {
        ++mismatches;
        ADD_FAILURE() << "case " << cases << ": vector_bytes_for = " << got << ", model says "
                      << want << "\n  " << Describe(c);
      }
      continue;
    }
    ++invalid;
    Verdict exact = bad;
    exact.reset(kStridesDifferRangesMeet).reset(kStridesDifferVectorMeet);
    if (exact.none()) {  // rejected only because of the documented conservative rule
      decided_by_conservative_2d += bad.test(kStridesDifferRangesMeet);
      decided_by_conservative_vector += !bad.test(kStridesDifferRangesMeet);
    }
    if (bad.count() == 1) {
      int r = 0;
      while (!bad.test(r)) ++r;
      ++sole_checked;
      EXPECT_NE(o.what.find(kRuleNeedles[r]), std::string::npos)
          << "the only problem is \"" << kRuleNames[r] << "\" but what() = " << o.what << "\n  "
          << Describe(c);
    }
  }

  std::cout << "[ fuzz     ] seed 0x" << std::hex << kSeed << std::dec << ": " << cases
            << " cases (" << retries << " regenerated to stay in the arena), " << valid
            << " valid (" << in_place_valid << " q in place), " << invalid << " invalid, "
            << mismatches << " disagreements\n"
            << "[ fuzz     ] " << kNumMethods
            << " Methods; vector_bytes_for on valid cases: " << vec16 << " x 16, " << vec_scalar
            << " x element size\n"
            << "[ fuzz     ] " << sole_checked << " invalid cases with one problem had what() "
            << "checked\n"
            << "[ fuzz     ] invalid only by the different-strides rule: "
            << decided_by_conservative_2d << " (two [T, w] tensors), "
            << decided_by_conservative_vector << " (a weight or rstd_out in a row gap)\n"
            << "[ fuzz     ] " << lines_hit.size() << " distinct throw sites hit in validate.cpp\n";
  for (int r = 0; r < kNumRules; ++r) {
    std::cout << "[ fuzz     ]   " << rule_hits[r] << "\t" << kRuleNames[r] << "\n";
  }
  EXPECT_EQ(mismatches, 0);
  if (mismatches > 0) return;  // the loop stopped early; the coverage below would be noise
  EXPECT_EQ(cases, kCases);
  EXPECT_GE(valid, kCases / 5);
  EXPECT_GE(invalid, kCases / 5);
  EXPECT_GE(vec16, kCases / 50);
  EXPECT_GE(vec_scalar, kCases / 50);
  EXPECT_GE(in_place_valid, kCases / 50);
  for (int r = 0; r < kNumRules; ++r) {
    EXPECT_GT(rule_hits[r], 0) << "rule never violated: " << kRuleNames[r];
  }
}

// The generator is deterministic: the same seed gives the same cases.
TEST(ValidateFuzz, GeneratorIsDeterministic) {
  Rng a(kSeed), b(kSeed);
  int ra = 0, rb = 0;
  for (int i = 0; i < 200; ++i) {
    ASSERT_EQ(Describe(Generate(a, &ra)), Describe(Generate(b, &rb))) << "case " << i;
  }
}

// ---------------------------------------------------------------- hand-picked regressions

// A valid bf16 TP 2 call over the arena: Q 16 / K 16 local widths 8 / 8, dense, 4 tokens.
class ValidateRegression : public ::testing::Test {
 protected:
  void* at(int64_t off) { return arena_.At(At(off)); }
  QkNormParams Valid() {
    QkNormParams p;
    p.in_dtype = DType::kBF16;
    p.tokens = 4;
    p.q_full_width = p.k_full_width = 16;
    p.q = {at(0x1000), at(0x2000), at(0x3000), 8, 8, 8, 1.0f};
    p.k = {at(0x4000), at(0x5000), at(0x6000), 8, 8, 8, 1.0f};
    p.rstd_out = static_cast<float*>(at(0x7000));
    return p;
  }
  static ::testing::AssertionResult Rejects(const QkNormParams& p, const std::string& needle) {
    try {
      validate_params(p, 2);
    } catch (const Error& e) {
      if (std::string(e.what()).find(needle) != std::string::npos) {
        return ::testing::AssertionSuccess();
      }
      return ::testing::AssertionFailure() << "what() = " << e.what();
    }
    return ::testing::AssertionFailure() << "accepted";
  }

 private:
  Arena arena_;
};

// An extent ends after the last row's width, not after a whole last stride: a tensor may start
// in the padding that would follow its neighbour's last row, but not one element earlier.
TEST_F(ValidateRegression, NeighbourMayStartRightAfterTheLastRowsWidth) {
  QkNormParams p = Valid();
  p.q.out_stride = 24;                       // padded rows: q.out covers 3 * 48 + 16 bytes
  p.k.in = at(0x2000 + 3 * 24 * 2 + 8 * 2);  // right after q.out's last element
  EXPECT_NO_THROW(validate_params(p, 2));
  p.k.in = at(0x2000 + 3 * 24 * 2 + 8 * 2 - 2);  // on q.out's last element
  EXPECT_TRUE(Rejects(p, "q.out overlaps k.in"));
}

// Equal strides in BYTES are compared exactly even when the element sizes differ: fp8 Q and K
// columns of a fused buffer with the bf16 Q output written into the same buffer's V columns.
TEST_F(ValidateRegression, Fp8FusedInputWithBf16OutputInItsSpareColumns) {
  QkNormParams p = Valid();
  p.in_dtype = DType::kF8E4M3;
  p.q_full_width = p.k_full_width = 32;  // local widths 16 / 16
  const int64_t fused = 64;              // [Q 16 | K 16 | V 32] bytes per row
  p.q = {at(0x1000), at(0x1000 + 32), at(0x3000), 16, fused, fused / 2, 1.0f};
  p.k = {at(0x1000 + 16), at(0x5000), at(0x6000), 16, fused, 16, 1.0f};
  EXPECT_NO_THROW(validate_params(p, 2));  // q.out fills bytes [32, 64) of every row exactly
  p.q.out = at(0x1000 + 30);               // one bf16 element into K's columns
  EXPECT_TRUE(Rejects(p, "q.out overlaps k.in"));
  p.q.out = at(0x1000 + 32 + 2);  // one element later: its last spills into the next row's Q
  EXPECT_TRUE(Rejects(p, "q.out partly overlaps q.in"));
}

// The documented conservative rule: a weight lying wholly in the padding between two rows of
// an output shares no byte with it, but the strides differ and the address ranges meet, so the
// call is rejected. The fuzz oracle models this; if validate.cpp becomes exact, flip both.
TEST_F(ValidateRegression, WeightInAnOutputsRowPaddingIsRejectedConservatively) {
  QkNormParams p = Valid();
  p.q.out_stride = 32;           // rows of 16 bytes, 64 bytes apart
  p.k.weight = at(0x2000 + 16);  // bytes [16, 32) of q.out's first row gap
  EXPECT_TRUE(Rejects(p, "an output overlaps a weight"));
  p.k.weight = at(0x2000 + 3 * 64 + 16);  // just after q.out's last row: fine
  EXPECT_NO_THROW(validate_params(p, 2));
}

// In place needs the same stride even when there is one row (so the bytes are the same): the
// brief's rule and validate.cpp agree on rejecting it.
TEST_F(ValidateRegression, OneRowInPlaceWithAnotherStrideIsRejected) {
  QkNormParams p = Valid();
  p.tokens = 1;
  p.q.out = const_cast<void*>(p.q.in);
  p.q.out_stride = 16;
  EXPECT_TRUE(Rejects(p, "q.out partly overlaps q.in"));
  p.q.out_stride = p.q.in_stride;
  EXPECT_NO_THROW(validate_params(p, 2));
}

// Regression (found while fuzzing): extent_of computed a tensor's end in wrapping uintptr_t
// arithmetic, so a tensor whose rows wrap the address space passed the overlap checks: here
// q.out's second row is at q.out + (2^63 - 16) * 2 bytes == q.out - 32 (mod 2^64) == k.in.
TEST_F(ValidateRegression, ExtentsThatWrapTheAddressSpaceAreRejected) {
  QkNormParams p = Valid();
  p.tokens = 2;
  p.q.out = at(0x4000 + 32);
  p.q.out_stride = std::numeric_limits<int64_t>::max() - 15;
  EXPECT_THROW(validate_params(p, 2), Error);
  p = Valid();
  p.rstd_out = nullptr;
  p.tokens = int64_t{1} << 62;
  EXPECT_THROW(validate_params(p, 2), Error);
}

// Regression: with rstd_out set and tokens > INT64_MAX / 2, `2 * p.tokens` was signed overflow
// (undefined behaviour, reported by UBSan).
TEST_F(ValidateRegression, HugeTokensWithRstdOutAreRejectedWithoutOverflow) {
  QkNormParams p = Valid();
  p.tokens = (int64_t{1} << 62) + 1;
  EXPECT_THROW(validate_params(p, 2), Error);
}

}  // namespace
}  // namespace swiftqk
