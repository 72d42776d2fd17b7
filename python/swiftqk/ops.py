"""Thin Python front of torch.ops.swiftqk.qk_norm, and its fake kernel."""

from typing import Optional, Tuple

import torch

from . import _C

# The op's int codes, as the C++ enums define them (swiftqk/types.hpp, exposed by _C).
ORDERS = dict(_C.ORDERS)
FUSED_METHODS = dict(_C.FUSED_METHODS)

_IN_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn)


def _out_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.bfloat16 if t.dtype == torch.float8_e4m3fn else t.dtype


def _check_shard(name, x, weight, out):
    """shard_of's checks (python/csrc/swiftqk_torch.cpp), with its messages."""
    torch._check(x.dim() == 2 and out.dim() == 2, lambda: (
        f"swiftqk.qk_norm: {name} and its output must be 2-D [tokens, local width]"))
    torch._check(x.shape == out.shape, lambda: (
        f"swiftqk.qk_norm: {name} is {list(x.shape)} but its output is {list(out.shape)}"))
    torch._check(x.shape[0] == 0 or (x.stride(1) == 1 and out.stride(1) == 1), lambda: (
        f"swiftqk.qk_norm: {name} rows must be contiguous (stride 1 along the width)"))
    torch._check(weight.dim() == 1 and weight.shape[0] == x.shape[1] and weight.is_contiguous(),
                 lambda: (f"swiftqk.qk_norm: {name}_weight must be a contiguous [{x.shape[1]}] "
                          "shard of the norm weight"))
    # Meta tensors stand in for CUDA ones (shape-only tracing); any other device is refused as
    # the CUDA kernel would refuse it.
    torch._check(x.device.type in ("cuda", "meta") and out.device == x.device
                 and weight.device == x.device, lambda: (
                     f"swiftqk.qk_norm: {name}, its weight and output must be on one CUDA device"))


def _qk_norm_fake(q, k, q_weight, k_weight, q_out, k_out, comm, q_full_width, k_full_width, eps,
                  order, method, q_scale=1.0, k_scale=1.0, pdl=False, deterministic=False):
    """What qk_norm_cuda checks before it launches, short of the communicator (an int handle
    here): the same conditions, the same messages, raised as the same RuntimeError. The outputs
    are written in place, so there is nothing to return."""
    if q.dim() >= 1 and k.dim() >= 1:  # otherwise the 2-D check below names the tensor
        torch._check(q.shape[0] == k.shape[0], lambda: (
            f"swiftqk.qk_norm: q has {q.shape[0]} tokens, k {k.shape[0]}"))
    for name, t in (("q", q), ("k", k)):
        torch._check(t.dtype in _IN_DTYPES, lambda: (
            f"swiftqk.qk_norm: {name} has dtype {t.dtype}; expected float32, float16, bfloat16 "
            "or float8_e4m3fn"))
    torch._check(k.dtype == q.dtype, lambda: "swiftqk.qk_norm: q and k dtypes differ")
    out_t = _out_dtype(q)
    torch._check(all(t.dtype == out_t for t in (q_out, k_out, q_weight, k_weight)), lambda: (
        f"swiftqk.qk_norm: outputs and weights must be {out_t}"))
    torch._check(order in ORDERS.values(), lambda: (
        "swiftqk.qk_norm: order must be 0 (olmo2) or 1 (llama)"))
    _check_shard("q", q, q_weight, q_out)
    _check_shard("k", k, k_weight, k_out)


# register_fake is torch 2.4's name; impl_abstract is the same registration in older releases.
_register_fake = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract
_register_fake("swiftqk::qk_norm")(_qk_norm_fake)


def qk_norm_(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    comm,
    q_full_width: int,
    k_full_width: int,
    eps: float,
    order: str = "olmo2",
    method: str = "swiftqk",
    q_out: Optional[torch.Tensor] = None,
    k_out: Optional[torch.Tensor] = None,
    q_scale: float = 1.0,
    k_scale: float = 1.0,
    enable_pdl: bool = False,
    deterministic: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Normalises this rank's q [T, Hq/N] and k [T, Hk/N] shards by the RMS of the full rows.

    Writes q_out/k_out (default: in place into q and k) and returns them. An output is either
    its input itself (in place; the schema's ``Tensor(a!)`` on the output then covers the input
    it aliases) or memory that overlaps neither input. fp8 inputs cannot be normalised in place:
    their outputs are bf16. Every rank of the communicator's group must make the same call.
    ``comm`` is a swiftqk.Communicator.
    ``enable_pdl`` launches with programmatic dependent launch: the kernel may be scheduled
    while the previous kernel on the stream finishes, and waits for it before reading anything.
    Ignored unless both the GPU and the extension's build are sm_90 or later.
    ``deterministic`` takes every sum of squares in one canonical order, so the outputs are
    bitwise the same at every TP degree in {1, 2, 4, 8, 16} (method "swiftqk"; full widths in
    multiples of 16 vectors of 16 bytes; docs/design.md, "Deterministic mode").
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {sorted(ORDERS)}, got {order!r}")
    if method not in FUSED_METHODS:
        raise ValueError(f"method must be one of {sorted(FUSED_METHODS)}, got {method!r}")
    for name, x, out in (("q", q, q_out), ("k", k, k_out)):
        if out is None and x.dtype == torch.float8_e4m3fn:
            raise ValueError(f"{name} is float8_e4m3fn and its output is bfloat16, so it cannot "
                             f"be normalised in place: pass {name}_out, or use qk_norm")
    q_out = q if q_out is None else q_out
    k_out = k if k_out is None else k_out
    torch.ops.swiftqk.qk_norm(
        q, k, q_weight, k_weight, q_out, k_out, comm.handle, q_full_width, k_full_width,
        float(eps), ORDERS[order], FUSED_METHODS[method], float(q_scale), float(k_scale),
        bool(enable_pdl), bool(deterministic))
    return q_out, k_out


def qk_norm(q, k, q_weight, k_weight, comm, q_full_width, k_full_width, eps, order="olmo2",
            method="swiftqk", q_scale=1.0, k_scale=1.0, enable_pdl=False, deterministic=False):
    """Out-of-place qk_norm_: returns new tensors (bf16 for fp8 inputs)."""
    q_out = torch.empty(q.shape, dtype=_out_dtype(q), device=q.device)
    k_out = torch.empty(k.shape, dtype=_out_dtype(k), device=k.device)
    return qk_norm_(q, k, q_weight, k_weight, comm, q_full_width, k_full_width, eps, order,
                    method, q_out, k_out, q_scale, k_scale, enable_pdl, deterministic)
