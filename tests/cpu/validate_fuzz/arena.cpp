#include "arena.hpp"

#include <utility>

#include "swiftqk/types.hpp"

namespace swiftqk::validate_fuzz {

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

}  // namespace swiftqk::validate_fuzz
