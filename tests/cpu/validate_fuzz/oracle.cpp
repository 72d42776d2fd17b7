#include "oracle.hpp"

#include <algorithm>
#include <utility>

namespace swiftqk::validate_fuzz {

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

int ModelVectorBytes(const Case& c) {
  const int64_t is = kInSize[c.dtype], os = kOutSize[c.dtype];
  auto addr = [](const Ptr& p) { return p.null ? int64_t{0} : p.off; };
  for (const int64_t bytes : {16, 8, 4}) {
    const int64_t vec = bytes / is;
    if (vec < 2) break;  // one element a vector is the scalar path
    const int64_t out_align = std::min<int64_t>(16, vec * os);
    bool ok = true;
    for (const Shard* v : {&c.q, &c.k}) {
      ok = ok && v->width % vec == 0 && v->in_stride % vec == 0 && v->out_stride % vec == 0;
      ok = ok && addr(v->in) % bytes == 0 && addr(v->out) % out_align == 0 &&
           addr(v->weight) % out_align == 0;
    }
    if (ok) return static_cast<int>(bytes);
  }
  return static_cast<int>(is);
}

std::string RuleList(const Verdict& v) {
  std::string s;
  for (int r = 0; r < kNumRules; ++r) {
    if (v.test(r)) s += std::string(s.empty() ? "" : ", ") + kRuleNames[r];
  }
  return s.empty() ? "none" : s;
}

}  // namespace swiftqk::validate_fuzz
