"""Thin Python front of torch.ops.swiftqk.qk_norm."""

from typing import Optional, Tuple

import torch

ORDERS = {"olmo2": 0, "llama": 1}
FUSED_METHODS = {"swiftqk": 0, "minimax_fused": 1}


def _out_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.bfloat16 if t.dtype == torch.float8_e4m3fn else t.dtype


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
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Normalises this rank's q [T, Hq/N] and k [T, Hk/N] shards by the RMS of the full rows.

    Writes q_out/k_out (default: in place into q and k) and returns them. Every rank of the
    communicator's group must make the same call. ``comm`` is a swiftqk.Communicator.
    ``enable_pdl`` launches with programmatic dependent launch: the kernel may be scheduled
    while the previous kernel on the stream finishes, and waits for it before reading anything.
    Ignored unless both the GPU and the extension's build are sm_90 or later.
    """
    q_out = q if q_out is None else q_out
    k_out = k if k_out is None else k_out
    torch.ops.swiftqk.qk_norm(
        q, k, q_weight, k_weight, q_out, k_out, comm.handle, q_full_width, k_full_width,
        float(eps), ORDERS[order], FUSED_METHODS[method], float(q_scale), float(k_scale),
        bool(enable_pdl))
    return q_out, k_out


def qk_norm(q, k, q_weight, k_weight, comm, q_full_width, k_full_width, eps, order="olmo2",
            method="swiftqk", q_scale=1.0, k_scale=1.0, enable_pdl=False):
    """Out-of-place qk_norm_: returns new tensors (bf16 for fp8 inputs)."""
    q_out = torch.empty(q.shape, dtype=_out_dtype(q), device=q.device)
    k_out = torch.empty(k.shape, dtype=_out_dtype(k), device=k.device)
    return qk_norm_(q, k, q_weight, k_weight, comm, q_full_width, k_full_width, eps, order,
                    method, q_out, k_out, q_scale, k_scale, enable_pdl)
