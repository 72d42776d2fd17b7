// PyTorch binding of the fused QK epilogue (QK-norm, RoPE, paged KV-cache write, fp8): the
// schema-registered op torch.ops.swiftqk.qk_epilogue and its CUDA kernel, which turns tensors into
// QkEpilogueParams and calls launch_qk_epilogue on the current stream. What the tensors' shapes
// and dtypes decide is checked here; everything else is validate_epilogue_params' (run by the
// launch), whose refusals come back as RuntimeError. The fake kernel, which makes the same shape,
// dtype and device checks for torch.compile and meta tensors, is swiftqk/epilogue_ops.py.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>
#include <torch/library.h>
#include <torch/version.h>

#include <cstdint>
#include <string>

#include "communicator_registry.hpp"
#include "swiftqk/communicator.hpp"
#include "swiftqk/error.hpp"
#include "tensor_dtype.hpp"

namespace {

constexpr const char* kOp = "swiftqk.qk_epilogue: ";

swiftqk::DType dtype_of(const at::Tensor& t, const char* name) {
  return swiftqk_torch::dtype_of(t, kOp, name, "bfloat16, float16, float8_e4m3fn or float32");
}

// q, k, v, q_out, k_out: [tokens, heads x head_dim] with contiguous rows, any row stride.
void check_rows(const char* name, const at::Tensor& t, int64_t tokens) {
  TORCH_CHECK(t.dim() == 2, kOp, name, " must be 2-D [tokens, heads x head_dim], got ", t.dim(),
              "-D");
  TORCH_CHECK(t.size(0) == tokens, kOp, name, " has ", t.size(0), " tokens but q has ", tokens);
  TORCH_CHECK(t.size(0) == 0 || t.stride(1) == 1, kOp, name,
              " rows must be contiguous (stride 1 along the width)");
}

// Elements between rows, as qk_norm's binding takes them: one row's stride is its width.
int64_t row_stride(const at::Tensor& t) { return t.size(0) > 1 ? t.stride(0) : t.size(1); }

void check_device(const char* name, const at::Tensor& t, const at::Tensor& q) {
  TORCH_CHECK(t.device() == q.device(), kOp, name, " is on ", t.device(), " but q is on ",
              q.device());
}

void check_same_dtype(const char* name, const at::Tensor& t, const at::Tensor& q) {
  TORCH_CHECK(t.scalar_type() == q.scalar_type(), kOp, name, " has dtype ", t.scalar_type(),
              " but q has ", q.scalar_type());
}

void check_index(const char* name, const at::Tensor& t, int64_t tokens) {
  TORCH_CHECK(
      t.scalar_type() == at::kLong && t.dim() == 1 && t.size(0) == tokens && t.is_contiguous(), kOp,
      name, " must be a contiguous int64 [tokens] = [", tokens, "] tensor, got ", t.scalar_type(),
      " ", t.sizes());
}

void check_weight(const char* name, const at::Tensor& w, int64_t width, bool headwise) {
  TORCH_CHECK(w.dim() == 1 && w.size(0) == width && w.is_contiguous(), kOp, name,
              " must be a contiguous [", width, "] weight (",
              headwise ? "headwise: [head_dim]" : "layerwise: this rank's slice of the norm weight",
              "), got ", w.sizes());
}

// An fp8 scale: a device scalar read by the kernel (so a captured graph sees later values).
const float* scale_of(const char* name, const c10::optional<at::Tensor>& s, const at::Tensor& q) {
  if (!s.has_value()) return nullptr;
  check_device(name, *s, q);
  TORCH_CHECK(s->scalar_type() == at::kFloat && s->numel() == 1, kOp, name,
              " must be a float32 tensor of one element, got ", s->scalar_type(), " ", s->sizes());
  return s->data_ptr<float>();
}

// The cache geometry from the tensor: NHD [num_blocks, block_size, kv_heads, head_dim] or HND
// [num_blocks, kv_heads, block_size, head_dim], strides in elements as the tensor has them.
swiftqk::PagedKvCache cache_of(const at::Tensor& kc, const at::Tensor& vc, c10::string_view layout,
                               int64_t kv_heads, int64_t head_dim) {
  const bool nhd = layout == "NHD";
  TORCH_CHECK(nhd || layout == "HND", kOp, "kv_layout must be \"NHD\" or \"HND\", got \"",
              std::string(layout), "\"");
  TORCH_CHECK(kc.dim() == 4, kOp,
              "k_cache must be 4-D (NHD: [num_blocks, block_size, kv_heads, head_dim]; HND: "
              "[num_blocks, kv_heads, block_size, head_dim]), got ",
              kc.dim(), "-D");
  TORCH_CHECK(vc.sizes() == kc.sizes() && vc.strides() == kc.strides(), kOp,
              "v_cache must have k_cache's shape and strides (one geometry for both): k_cache is ",
              kc.sizes(), " with strides ", kc.strides(), ", v_cache ", vc.sizes(),
              " with strides ", vc.strides());
  TORCH_CHECK(vc.scalar_type() == kc.scalar_type(), kOp, "v_cache has dtype ", vc.scalar_type(),
              " but k_cache has ", kc.scalar_type());
  const int head_dim_index = nhd ? 2 : 1, slot_dim_index = nhd ? 1 : 2;
  TORCH_CHECK(kc.size(head_dim_index) == kv_heads && kc.size(3) == head_dim, kOp, "k_cache is ",
              kc.sizes(), " in layout ", std::string(layout), " but k has ", kv_heads,
              " KV heads of head_dim ", head_dim);
  TORCH_CHECK(kc.stride(3) == 1, kOp,
              "k_cache's last dimension (head_dim) must have stride 1, got ", kc.stride(3));
  swiftqk::PagedKvCache c;
  c.k = kc.data_ptr();
  c.v = vc.data_ptr();
  c.dtype = dtype_of(kc, "k_cache");
  c.num_blocks = kc.size(0);
  c.block_size = kc.size(slot_dim_index);
  c.block_stride = kc.stride(0);
  c.slot_stride = kc.stride(slot_dim_index);
  c.head_stride = kc.stride(head_dim_index);
  return c;
}

void qk_epilogue_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      at::Tensor& q_out, const c10::optional<at::Tensor>& k_out,
                      const at::Tensor& q_weight, const at::Tensor& k_weight,
                      const at::Tensor& positions, const at::Tensor& cos_sin_cache,
                      at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slot_mapping,
                      const c10::optional<at::Tensor>& k_scale,
                      const c10::optional<at::Tensor>& v_scale,
                      const c10::optional<at::Tensor>& q_scale, int64_t comm, int64_t head_dim,
                      int64_t rotary_dim, bool is_neox, bool headwise, bool weight_plus_one,
                      double eps, int64_t order, c10::string_view kv_layout, bool pdl,
                      bool deterministic) {
  swiftqk::Communicator& c = swiftqk_torch::communicator_of(comm, "swiftqk.qk_epilogue");
  TORCH_CHECK(q.dim() == 2, kOp, "q must be 2-D [tokens, heads x head_dim], got ", q.dim(), "-D");
  const int64_t tokens = q.size(0);
  check_rows("q", q, tokens);
  check_rows("k", k, tokens);
  check_rows("v", v, tokens);
  check_rows("q_out", q_out, tokens);
  if (k_out.has_value()) check_rows("k_out", *k_out, tokens);

  const struct {
    const char* name;
    const at::Tensor& t;
  } all[] = {{"k", k},
             {"v", v},
             {"q_out", q_out},
             {"q_weight", q_weight},
             {"k_weight", k_weight},
             {"positions", positions},
             {"cos_sin_cache", cos_sin_cache},
             {"k_cache", k_cache},
             {"v_cache", v_cache},
             {"slot_mapping", slot_mapping}};
  for (const auto& a : all) check_device(a.name, a.t, q);
  if (k_out.has_value()) check_device("k_out", *k_out, q);
  TORCH_CHECK(q.is_cuda(), kOp, "the tensors must be on a CUDA device, got ", q.device());
  TORCH_CHECK(q.device().index() == c.device(), kOp, "the tensors are on cuda:", q.device().index(),
              " but the communicator is on cuda:", c.device());

  const swiftqk::DType dtype = dtype_of(q, "q");
  check_same_dtype("k", k, q);
  check_same_dtype("v", v, q);
  check_same_dtype("q_weight", q_weight, q);
  check_same_dtype("k_weight", k_weight, q);
  if (k_out.has_value()) check_same_dtype("k_out", *k_out, q);

  TORCH_CHECK(head_dim > 0, kOp, "head_dim must be > 0, got ", head_dim);
  TORCH_CHECK(q.size(1) % head_dim == 0, kOp, "q has ", q.size(1),
              " columns, not a multiple of head_dim = ", head_dim);
  TORCH_CHECK(k.size(1) % head_dim == 0, kOp, "k has ", k.size(1),
              " columns, not a multiple of head_dim = ", head_dim);
  TORCH_CHECK(v.size(1) == k.size(1), kOp, "v has ", v.size(1), " columns but k has ", k.size(1),
              " (V has K's heads)");
  TORCH_CHECK(q_out.size(1) == q.size(1), kOp, "q_out has ", q_out.size(1), " columns but q has ",
              q.size(1));
  if (k_out.has_value()) {
    TORCH_CHECK(k_out->size(1) == k.size(1), kOp, "k_out has ", k_out->size(1),
                " columns but k has ", k.size(1));
  }
  const int64_t q_heads = q.size(1) / head_dim, kv_heads = k.size(1) / head_dim;
  check_weight("q_weight", q_weight, headwise ? head_dim : q.size(1), headwise);
  check_weight("k_weight", k_weight, headwise ? head_dim : k.size(1), headwise);
  check_index("positions", positions, tokens);
  check_index("slot_mapping", slot_mapping, tokens);
  TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.is_contiguous(), kOp,
              "cos_sin_cache must be a contiguous 2-D [max_position, rotary_dim] table (cos half, "
              "then sin half), got ",
              cos_sin_cache.sizes());
  TORCH_CHECK(cos_sin_cache.size(1) == rotary_dim, kOp, "cos_sin_cache has ", cos_sin_cache.size(1),
              " columns but rotary_dim is ", rotary_dim);
  TORCH_CHECK(order == 0 || order == 1, kOp, "order must be 0 (olmo2) or 1 (llama), got ", order);

  swiftqk::QkEpilogueParams p;
  p.cache = cache_of(k_cache, v_cache, kv_layout, kv_heads, head_dim);
  p.cache.k_scale = scale_of("k_scale", k_scale, q);
  p.cache.v_scale = scale_of("v_scale", v_scale, q);
  p.cache.slot_mapping = slot_mapping.data_ptr<int64_t>();
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.q_stride = row_stride(q);
  p.k_stride = row_stride(k);
  p.v_stride = row_stride(v);
  p.q_out = q_out.data_ptr();
  p.q_out_stride = row_stride(q_out);
  p.q_out_dtype = dtype_of(q_out, "q_out");
  p.q_out_scale = scale_of("q_scale", q_scale, q);
  if (k_out.has_value()) {
    p.k_out = k_out->data_ptr();
    p.k_out_stride = row_stride(*k_out);
  }
  p.q_weight = q_weight.data_ptr();
  p.k_weight = k_weight.data_ptr();
  p.weight_plus_one = weight_plus_one;
  p.dtype = dtype;
  p.tokens = tokens;
  p.num_q_heads = q_heads;
  p.num_kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.scope = headwise ? swiftqk::NormScope::kHeadwise : swiftqk::NormScope::kLayerwise;
  p.order = static_cast<swiftqk::NormOrder>(order);
  p.eps = static_cast<float>(eps);
  p.rope.positions = positions.data_ptr<int64_t>();
  p.rope.cos_sin_cache = cos_sin_cache.data_ptr();
  p.rope.cache_dtype = dtype_of(cos_sin_cache, "cos_sin_cache");
  p.rope.max_position = cos_sin_cache.size(0);
  p.rope.rotary_dim = rotary_dim;
  p.rope.style = is_neox ? swiftqk::RopeStyle::kNeox : swiftqk::RopeStyle::kGptj;
  p.pdl = pdl;
  p.deterministic = deterministic;
  const c10::cuda::CUDAGuard guard(q.device());
  // A bad position or slot is found by the kernel: it raises here at the next launch (the
  // launch checks the communicator first) or at comm.check_error(), as qk_norm's failures do.
  try {
    swiftqk::launch_qk_epilogue(c, p, c10::cuda::getCurrentCUDAStream().stream());
  } catch (const swiftqk::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(swiftqk, m) {
  // This op's fake kernel lives in its own Python module (swiftqk.ops has qk_norm's).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
  m.set_python_module("swiftqk.epilogue_ops");
#else
  m.impl_abstract_pystub("swiftqk.epilogue_ops");
#endif
  m.def(
      "qk_epilogue(Tensor q, Tensor k, Tensor v, Tensor(a!) q_out, Tensor(b!)? k_out, "
      "Tensor q_weight, Tensor k_weight, Tensor positions, Tensor cos_sin_cache, "
      "Tensor(c!) k_cache, Tensor(d!) v_cache, Tensor slot_mapping, Tensor? k_scale, "
      "Tensor? v_scale, Tensor? q_scale, int comm, int head_dim, int rotary_dim, bool is_neox, "
      "bool headwise, bool weight_plus_one, float eps, int order, str kv_layout, "
      "bool pdl=False, bool deterministic=False) -> ()");
}
TORCH_LIBRARY_IMPL(swiftqk, CUDA, m) { m.impl("qk_epilogue", &qk_epilogue_cuda); }
