#include "cases.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <utility>
#include <vector>

#include "swiftqk/error.hpp"
#include "swiftqk/types.hpp"

namespace swiftqk::validate_fuzz {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

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
  c.method = static_cast<int>(g.Range(0, NumMethods() - 1));
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
        c.method = g.Pick({NumMethods(), -1, 1000});
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

}  // namespace

bool DTypeInRange(int dt) { return dt == 0 || dt == 1 || dt == 2 || dt == 3; }
int64_t InSizeOr2(int dt) { return DTypeInRange(dt) ? kInSize[dt] : 2; }
int64_t OutSizeOr2(int dt) { return DTypeInRange(dt) ? kOutSize[dt] : 2; }

int NumMethods() {
  static const int n = CountMethods();
  return n;
}
bool MethodInRange(int m) { return m >= 0 && m < NumMethods(); }

std::string Describe(const Case& c) {
  std::ostringstream s;
  s << "world=" << c.world << " dtype=" << c.dtype << " order=" << c.order << " method=" << c.method
    << " tokens=" << c.tokens << " q_full=" << c.q_full << " k_full=" << c.k_full
    << " eps=" << FloatStr(c.eps) << "\n  " << ShardStr("q", c.q) << "\n  " << ShardStr("k", c.k)
    << "\n  rstd_out=" << PtrStr(c.rstd) << "\n  layout: " << c.layout
    << "\n  perturbations:" << (c.perturbations.empty() ? " none" : c.perturbations);
  return s.str();
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

}  // namespace swiftqk::validate_fuzz
