"""Python front of torch.ops.swiftqk.qk_epilogue (the fused QK epilogue: QK-norm, RoPE, paged
KV-cache write, fp8), and its fake kernel."""

import math
import struct
from typing import Optional, Tuple

import torch

from .ops import ORDERS

KV_LAYOUTS = ("NHD", "HND")

_P = "swiftqk.qk_epilogue: "
# The library's names of the dtypes (swiftqk::to_string(DType)), as validate_epilogue_params
# prints them.
_DTYPE_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
                torch.float8_e4m3fn: "f8e4m3"}


# How the C++ binding prints a dtype (c10's ScalarType names), so that both kernels' messages read
# alike; any other dtype as torch names it.
_C10_NAMES = {torch.float32: "Float", torch.float16: "Half", torch.bfloat16: "BFloat16",
              torch.float8_e4m3fn: "Float8_e4m3fn", torch.float64: "Double", torch.int64: "Long",
              torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
              torch.bool: "Bool"}


def _c10(dtype):
    return _C10_NAMES.get(dtype, str(dtype))


def _shape(t):
    return list(t.shape)


def _check_rows(name, t, tokens):
    torch._check(t.dim() == 2, lambda: (
        f"{_P}{name} must be 2-D [tokens, heads x head_dim], got {t.dim()}-D"))
    torch._check(t.shape[0] == tokens, lambda: (
        f"{_P}{name} has {t.shape[0]} tokens but q has {tokens}"))
    torch._check(t.shape[0] == 0 or t.stride(1) == 1, lambda: (
        f"{_P}{name} rows must be contiguous (stride 1 along the width)"))


def _row_stride(t):
    return t.stride(0) if t.shape[0] > 1 else t.shape[1]


def _check_dtype(name, t):
    torch._check(t.dtype in _DTYPE_NAMES, lambda: (
        f"{_P}{name} has dtype {_c10(t.dtype)}; expected bfloat16, float16, float8_e4m3fn or "
        "float32"))


def _check_scale(name, s, q):
    if s is None:
        return
    torch._check(s.device == q.device, lambda: (
        f"{_P}{name} is on {s.device} but q is on {q.device}"))
    torch._check(s.dtype == torch.float32 and s.numel() == 1, lambda: (
        f"{_P}{name} must be a float32 tensor of one element, got {_c10(s.dtype)} {_shape(s)}"))


def _binding_checks(q, k, v, q_out, k_out, q_weight, k_weight, positions, cos_sin_cache, k_cache,
                    v_cache, slot_mapping, k_scale, v_scale, q_scale, head_dim, rotary_dim,
                    headwise, order, kv_layout):
    """What qk_epilogue_cuda (python/csrc/swiftqk_epilogue_torch.cpp) checks on the tensors, in
    its order and with its messages, short of the communicator (an int handle here)."""
    torch._check(q.dim() == 2, lambda: f"{_P}q must be 2-D [tokens, heads x head_dim], got "
                 f"{q.dim()}-D")
    tokens = q.shape[0]
    k_out_named = [("k_out", k_out)] if k_out is not None else []
    for name, t in [("q", q), ("k", k), ("v", v), ("q_out", q_out)] + k_out_named:
        _check_rows(name, t, tokens)
    others = [("k", k), ("v", v), ("q_out", q_out), ("q_weight", q_weight), ("k_weight", k_weight),
              ("positions", positions), ("cos_sin_cache", cos_sin_cache), ("k_cache", k_cache),
              ("v_cache", v_cache), ("slot_mapping", slot_mapping)]
    for name, t in others + k_out_named:
        torch._check(t.device == q.device, lambda: f"{_P}{name} is on {t.device} but q is on "
                     f"{q.device}")
    # Meta tensors stand in for CUDA ones (shape-only tracing); any other device is refused as
    # the CUDA kernel refuses it.
    torch._check(q.device.type in ("cuda", "meta"), lambda: (
        f"{_P}the tensors must be on a CUDA device, got {q.device}"))
    _check_dtype("q", q)
    for name, t in [("k", k), ("v", v), ("q_weight", q_weight), ("k_weight", k_weight)] + \
            k_out_named:
        torch._check(t.dtype == q.dtype, lambda: f"{_P}{name} has dtype {_c10(t.dtype)} but q has "
                     f"{_c10(q.dtype)}")

    torch._check(head_dim > 0, lambda: f"{_P}head_dim must be > 0, got {head_dim}")
    for name, t in (("q", q), ("k", k)):
        torch._check(t.shape[1] % head_dim == 0, lambda: (
            f"{_P}{name} has {t.shape[1]} columns, not a multiple of head_dim = {head_dim}"))
    torch._check(v.shape[1] == k.shape[1], lambda: (
        f"{_P}v has {v.shape[1]} columns but k has {k.shape[1]} (V has K's heads)"))
    torch._check(q_out.shape[1] == q.shape[1], lambda: (
        f"{_P}q_out has {q_out.shape[1]} columns but q has {q.shape[1]}"))
    if k_out is not None:
        torch._check(k_out.shape[1] == k.shape[1], lambda: (
            f"{_P}k_out has {k_out.shape[1]} columns but k has {k.shape[1]}"))
    for name, w, width in (("q_weight", q_weight, q.shape[1]), ("k_weight", k_weight, k.shape[1])):
        want = head_dim if headwise else width
        scope = "headwise: [head_dim]" if headwise else \
            "layerwise: this rank's slice of the norm weight"
        torch._check(w.dim() == 1 and w.shape[0] == want and w.is_contiguous(), lambda: (
            f"{_P}{name} must be a contiguous [{want}] weight ({scope}), got {_shape(w)}"))
    for name, t in (("positions", positions), ("slot_mapping", slot_mapping)):
        torch._check(t.dtype == torch.int64 and t.dim() == 1 and t.shape[0] == tokens
                     and t.is_contiguous(), lambda: (
                         f"{_P}{name} must be a contiguous int64 [tokens] = [{tokens}] tensor, got "
                         f"{_c10(t.dtype)} {_shape(t)}"))
    torch._check(cos_sin_cache.dim() == 2 and cos_sin_cache.is_contiguous(), lambda: (
        f"{_P}cos_sin_cache must be a contiguous 2-D [max_position, rotary_dim] table (cos half, "
        f"then sin half), got {_shape(cos_sin_cache)}"))
    torch._check(cos_sin_cache.shape[1] == rotary_dim, lambda: (
        f"{_P}cos_sin_cache has {cos_sin_cache.shape[1]} columns but rotary_dim is {rotary_dim}"))
    torch._check(order in (0, 1), lambda: f"{_P}order must be 0 (olmo2) or 1 (llama), got {order}")

    # cache_of
    torch._check(kv_layout in KV_LAYOUTS, lambda: (
        f'{_P}kv_layout must be "NHD" or "HND", got "{kv_layout}"'))
    torch._check(k_cache.dim() == 4, lambda: (
        f"{_P}k_cache must be 4-D (NHD: [num_blocks, block_size, kv_heads, head_dim]; HND: "
        f"[num_blocks, kv_heads, block_size, head_dim]), got {k_cache.dim()}-D"))
    torch._check(v_cache.shape == k_cache.shape and v_cache.stride() == k_cache.stride(), lambda: (
        f"{_P}v_cache must have k_cache's shape and strides (one geometry for both): k_cache is "
        f"{_shape(k_cache)} with strides {list(k_cache.stride())}, v_cache {_shape(v_cache)} "
        f"with strides {list(v_cache.stride())}"))
    torch._check(v_cache.dtype == k_cache.dtype, lambda: (
        f"{_P}v_cache has dtype {_c10(v_cache.dtype)} but k_cache has {_c10(k_cache.dtype)}"))
    nhd = kv_layout == "NHD"
    heads_at, slots_at = (2, 1) if nhd else (1, 2)
    kv_heads = k.shape[1] // head_dim
    torch._check(k_cache.shape[heads_at] == kv_heads and k_cache.shape[3] == head_dim, lambda: (
        f"{_P}k_cache is {_shape(k_cache)} in layout {kv_layout} but k has {kv_heads} KV heads of "
        f"head_dim {head_dim}"))
    torch._check(k_cache.stride(3) == 1, lambda: (
        f"{_P}k_cache's last dimension (head_dim) must have stride 1, got {k_cache.stride(3)}"))
    _check_dtype("k_cache", k_cache)
    _check_scale("k_scale", k_scale, q)
    _check_scale("v_scale", v_scale, q)
    _check_dtype("q_out", q_out)
    _check_scale("q_scale", q_scale, q)
    _check_dtype("cos_sin_cache", cos_sin_cache)
    return heads_at, slots_at


def _as_float32(x):
    """x as the C++ static_cast<float> makes it (inf past float's range)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _check_cache_geometry(k_cache, kv_heads, head_dim, heads_at, slots_at):
    """validate_epilogue.cpp's cache_span_elements: the dimensions taking more than one index,
    sorted by stride, nest (no two (block, slot, head, element) share an address)."""
    dims = [("1 (the element stride)", "head_dim", 1, head_dim),
            ("cache.head_stride", "num_kv_heads", k_cache.stride(heads_at), kv_heads),
            ("cache.slot_stride", "cache.block_size", k_cache.stride(slots_at),
             k_cache.shape[slots_at]),
            ("cache.block_stride", "cache.num_blocks", k_cache.stride(0), k_cache.shape[0])]
    dims = sorted((d for d in dims if d[3] > 1), key=lambda d: d[2])  # stable, as std::stable_sort
    for i, (sname, ename, stride, extent) in enumerate(dims):
        torch._check(stride > 0, lambda: (
            f"cache geometry: {sname} is 0 but {ename} is {extent}, so two of them share an "
            "address"))
        if i == 0:
            continue
        bs, be, bstride, bextent = dims[i - 1]
        span = bstride * bextent
        torch._check(stride >= span, lambda: (
            f"cache geometry: {sname} {stride} is smaller than {bs} x {be} = {bstride} x "
            f"{bextent} = {span}, so two (block, slot, head, element) share an address"))


def _validate_checks(q, k, q_out, k_out, cos_sin_cache, k_cache, k_scale, v_scale, q_scale,
                     head_dim, rotary_dim, headwise, weight_plus_one, eps, heads_at, slots_at):
    """validate_epilogue_params' checks that shapes, strides and dtypes decide (not the
    alignment and overlap checks, which need addresses), with its messages."""
    dtype, model = q.dtype, _DTYPE_NAMES[q.dtype]
    torch._check(dtype in (torch.bfloat16, torch.float16), lambda: (
        f"dtype: the epilogue takes bf16 or f16 models (q, k, v, weights), got {model}"))
    q_heads, kv_heads = q.shape[1] // head_dim, k.shape[1] // head_dim
    torch._check(q_heads > 0, lambda: f"num_q_heads must be > 0, got {q_heads}")
    torch._check(kv_heads > 0, lambda: f"num_kv_heads must be > 0, got {kv_heads}")
    torch._check(head_dim % 2 == 0, lambda: f"head_dim must be even, got {head_dim}")
    e = _as_float32(float(eps))
    torch._check(math.isfinite(e) and e > 0, lambda: f"eps must be finite and > 0, got {e:f}")
    torch._check(not weight_plus_one or headwise, lambda: (
        "weight_plus_one (Gemma-3's 1 + w) needs scope == NormScope::kHeadwise"))
    torch._check(q_out.dtype in (dtype, torch.float8_e4m3fn), lambda: (
        f"q_out_dtype must be the model dtype {model} or f8e4m3, got "
        f"{_DTYPE_NAMES[q_out.dtype]}"))
    widths = (("q_stride", q, "num_q_heads"), ("k_stride", k, "num_kv_heads"),
              ("v_stride", k, "num_kv_heads"), ("q_out_stride", q_out, "num_q_heads")) + (
                  (("k_out_stride", k_out, "num_kv_heads"),) if k_out is not None else ())
    for name, t, heads in widths:
        stride, width = _row_stride(t), t.shape[1]
        torch._check(stride >= width, lambda: (
            f"{name} {stride} is smaller than the row width {heads} x head_dim = {width}"))
    torch._check(2 <= rotary_dim <= head_dim and rotary_dim % 2 == 0, lambda: (
        f"rope.rotary_dim must be even and in [2, head_dim = {head_dim}], got {rotary_dim}"))
    max_position = cos_sin_cache.shape[0]
    torch._check(max_position >= 1, lambda: (
        f"rope.max_position must be >= 1, got {max_position}"))
    torch._check(cos_sin_cache.dtype in (torch.float32, dtype), lambda: (
        f"rope.cache_dtype must be f32 or the model dtype {model}, got "
        f"{_DTYPE_NAMES[cos_sin_cache.dtype]}"))
    torch._check(k_cache.dtype in (dtype, torch.float8_e4m3fn), lambda: (
        f"cache.dtype must be the model dtype {model} or f8e4m3, got "
        f"{_DTYPE_NAMES[k_cache.dtype]}"))
    blocks, block_size = k_cache.shape[0], k_cache.shape[slots_at]
    torch._check(blocks >= 1, lambda: f"cache.num_blocks must be >= 1, got {blocks}")
    torch._check(block_size >= 1, lambda: f"cache.block_size must be >= 1, got {block_size}")
    _check_cache_geometry(k_cache, kv_heads, head_dim, heads_at, slots_at)
    # The rest only when there is something to read and write (validate's early return).
    tokens = q.shape[0]
    torch._check(tokens == 0 or q_out.dtype != torch.float8_e4m3fn or q_scale is not None,
                 lambda: "q_out_scale (needed by an fp8 q_out) is null")
    fp8_cache = k_cache.dtype == torch.float8_e4m3fn
    torch._check(tokens == 0 or not fp8_cache or k_scale is not None,
                 lambda: "cache.k_scale (needed by an fp8 cache) is null")
    torch._check(tokens == 0 or not fp8_cache or v_scale is not None,
                 lambda: "cache.v_scale (needed by an fp8 cache) is null")


def _qk_epilogue_fake(q, k, v, q_out, k_out, q_weight, k_weight, positions, cos_sin_cache,
                      k_cache, v_cache, slot_mapping, k_scale, v_scale, q_scale, comm, head_dim,
                      rotary_dim, is_neox, headwise, weight_plus_one, eps, order, kv_layout,
                      pdl=False, deterministic=False):
    """What qk_epilogue_cuda and validate_epilogue_params refuse from shapes, strides, dtypes and
    devices, raised as the same RuntimeError with the same messages (the library's, behind its
    file:line prefix on the GPU). Not checked here: the communicator (and with it the
    deterministic mode's TP degree and widths, which need its world size), pointer alignment and
    overlaps between tensors (addresses), and the positions and slots themselves (the kernel's).
    The outputs are written in place, so there is nothing to return."""
    heads_at, slots_at = _binding_checks(
        q, k, v, q_out, k_out, q_weight, k_weight, positions, cos_sin_cache, k_cache, v_cache,
        slot_mapping, k_scale, v_scale, q_scale, head_dim, rotary_dim, headwise, order, kv_layout)
    _validate_checks(q, k, q_out, k_out, cos_sin_cache, k_cache, k_scale, v_scale, q_scale,
                     head_dim, rotary_dim, headwise, weight_plus_one, eps, heads_at, slots_at)


# register_fake is torch 2.4's name; impl_abstract is the same registration in older releases.
_register_fake = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract
_register_fake("swiftqk::qk_epilogue")(_qk_epilogue_fake)


def qk_epilogue(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    comm,
    head_dim: int,
    rotary_dim: Optional[int] = None,
    is_neox: bool = True,
    headwise: bool = False,
    weight_plus_one: bool = False,
    eps: float = 1e-6,
    order: str = "olmo2",
    kv_layout: str = "NHD",
    q_out: Optional[torch.Tensor] = None,
    k_out: Optional[torch.Tensor] = None,
    q_scale: Optional[torch.Tensor] = None,
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
    enable_pdl: bool = False,
    deterministic: bool = False,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The fused QK epilogue of one rank, in one launch on the current stream: QK-norm, RoPE,
    then Q written to q_out, and K and V written to their slots of a paged KV cache.

    Per token: (1) the norm with q_weight/k_weight, layerwise (one RMS over the full projected Q,
    one over the full K, across the TP group's ranks: OLMo 2/3, OLMoE, MiniMax-M2) or
    ``headwise`` (one RMS per head: Qwen3 with order "llama", Gemma-3 with
    ``weight_plus_one``, whose weight is 1 + w); (2) RoPE on every Q and K head, the first
    ``rotary_dim`` elements of each (``is_neox``: pairs (i, i + rotary_dim / 2), HF's
    rotate_half; else GPT-J's interleaved (2i, 2i + 1)), with cos and sin of the token's
    position; (3) Q to q_out, K (also to k_out when given) and V to ``slot_mapping[t]`` of the
    caches (-1: padding, nothing written), quantised where the cache or q_out is float8_e4m3fn
    (stored = value / scale, saturated to +-448).

    Args:
        q, k, v: this rank's [T, heads x head_dim] rows (last dim contiguous, any row stride:
            column views of the fused QKV projection are fine), bfloat16 or float16.
        q_weight, k_weight: layerwise, this rank's slices [Hq/N], [Hk/N] of the norm weights;
            headwise, [head_dim] each. The model dtype.
        positions: int64 [T], each in [0, max_position), any order, repeats allowed.
        cos_sin_cache: [max_position, rotary_dim], the cos half then the sin half of each row
            (vLLM's layout), float32 or the model dtype.
        k_cache, v_cache: [num_blocks, block_size, kv_heads, head_dim] (``kv_layout`` "NHD") or
            [num_blocks, kv_heads, block_size, head_dim] ("HND"), both with the same shape and
            strides; the model dtype or float8_e4m3fn. Slot s is block s // block_size, offset
            s % block_size.
        slot_mapping: int64 [T], each -1 or in [0, num_blocks x block_size).
        comm: a swiftqk.Communicator. Layerwise, every rank of its group makes the same call (and
            the group needs P2P); headwise exchanges nothing.
        head_dim, rotary_dim: rotary_dim defaults to cos_sin_cache's width (even, <= head_dim).
        order: "olmo2" (the fp32 product x * w rotated, 1/rms applied last, rounded once) or
            "llama" (the normalised value rounded, times w, rounded, then rotated).
        q_out: default q itself (in place); a separate [T, Hq/N x head_dim] tensor otherwise,
            in the model dtype or float8_e4m3fn (then ``q_scale`` is required).
        k_out: optional [T, Hk/N x head_dim] model-dtype tensor (may be k) for the normalised,
            rotated K, for attention backends that read this step's K from a tensor.
        q_scale, k_scale, v_scale: float32 one-element device tensors, the fp8 scales of q_out
            and of the two caches (read by the kernel, so a captured CUDA graph sees new values).
        enable_pdl: programmatic dependent launch (sm_90 and later), as for qk_norm_.
        deterministic: the TP-invariant mode, as for qk_norm_: a layerwise norm sums each row's
            squares in one canonical order, so every output bit is the same at TP 1, 2, 4, 8 and
            16 and for any token count (a power-of-two TP up to 16, and full Q and K widths that
            are multiples of 128 elements; every rank must pass the same). Headwise sums never
            depended on the split.

    Returns (q_out, k_out). Bad arguments raise RuntimeError before anything is written. A
    position or slot out of range is found by the kernel: nothing of that token is written (its
    q_out row is NaN), and the next call on ``comm``, or ``comm.check_error()``, raises a
    RuntimeError naming the token and the value, until ``comm.reset()``. Works under CUDA-graph
    capture and torch.compile.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {sorted(ORDERS)}, got {order!r}")
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    q_out = q if q_out is None else q_out
    if rotary_dim is None:
        rotary_dim = cos_sin_cache.shape[-1]
    torch.ops.swiftqk.qk_epilogue(
        q, k, v, q_out, k_out, q_weight, k_weight, positions, cos_sin_cache, k_cache, v_cache,
        slot_mapping, k_scale, v_scale, q_scale, comm.handle, int(head_dim), int(rotary_dim),
        bool(is_neox), bool(headwise), bool(weight_plus_one), float(eps), ORDERS[order],
        kv_layout, bool(enable_pdl), bool(deterministic))
    return q_out, k_out
