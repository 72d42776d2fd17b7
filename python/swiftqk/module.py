"""A drop-in QK-norm module for tensor-parallel attention, with selectable methods so that users
can A/B them in their own engine.

Two kinds of method:
- the fused methods ("swiftqk", "minimax_fused"; ops.FUSED_METHODS) call the C++ op,
  torch.ops.swiftqk.qk_norm: SwiftQK's kernel and the MiniMax-fused (Lamport) baseline, the same
  code swiftqk_bench times.
- REFERENCE_METHODS ("all_gather", "minimax_eager") are torch references of the paper's other
  two baselines, written with torch.distributed collectives on the caller's process group: vLLM's
  all-gather of the rows, and vLLM's MiniMax fallback ([T, 2] fp32 partial sums, one
  all-reduce). They are not the C++ NCCL baselines that swiftqk_bench times (those need an NCCL
  communicator, which Python does not create); they run on CPU too, and "minimax_eager" is what a
  FallbackCommunicator (no working P2P) runs instead of the fused methods.
"""

import torch
import torch.distributed as dist
from torch import nn

from .distributed import FallbackCommunicator
from .ops import FUSED_METHODS, _out_dtype, qk_norm

REFERENCE_METHODS = ("all_gather", "minimax_eager")
METHODS = tuple(FUSED_METHODS) + REFERENCE_METHODS


def _scale_rows(x, w, rstd, order, out_dtype):
    """Applies 1/rms per row and the weight in the model's order (HF Olmo2 or Llama)."""
    x32 = x.float() * rstd
    if order == "olmo2":
        return (w.float() * x32).to(out_dtype)
    return (w * x32.to(out_dtype)).to(out_dtype)


class TPQKNorm(nn.Module):
    """Layerwise QK RMSNorm for one rank of a TP group.

    Args:
        q_weight, k_weight: the FULL norm weights [Hq], [Hk] (each rank keeps its slice).
        eps: added to mean(x^2) over the full width.
        order: "olmo2" (HF Olmo2: weight times the fp32 product, rounded once) or "llama"
            (OLMoE, MiniMax: the normalised value rounded, then times the weight).
        comm: a swiftqk.Communicator or FallbackCommunicator (communicator_from_group); the
            fused methods need one. The torch methods ("all_gather", "minimax_eager") can run
            without one, on `group` (or TP 1 when there is no group).
        method: "swiftqk" (default) or "minimax_fused" (the C++ op), or the torch references
            "all_gather" or "minimax_eager" (module docstring).
        group: the TP process group for the torch methods (default: the communicator's).
        enable_pdl: launch the fused methods with programmatic dependent launch (qk_norm_).
        deterministic: the TP-invariant mode (qk_norm_): the same output bits at every TP
            degree; method "swiftqk" with a swiftqk.Communicator only.
    forward(q, k) takes this rank's [T, Hq/N] and [T, Hk/N] shards (views of a fused QKV
    output allowed) and returns new normalised tensors.
    """

    def __init__(self, q_weight, k_weight, eps, order="olmo2", comm=None, method="swiftqk",
                 group=None, enable_pdl=False, deterministic=False):
        super().__init__()
        if deterministic and (method != "swiftqk" or isinstance(comm, FallbackCommunicator)):
            raise ValueError("deterministic=True needs method 'swiftqk' on a swiftqk.Communicator "
                             "(the torch references and the NCCL fallback sum in other orders)")
        if order not in ("olmo2", "llama"):
            raise ValueError(f"order must be 'olmo2' or 'llama', got {order!r}")
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if comm is not None:
            self.world, self.rank = comm.world_size, comm.rank
        elif group is not None:
            self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        else:
            self.world, self.rank = 1, 0
        hq, hk = q_weight.numel(), k_weight.numel()
        if hq % self.world or hk % self.world:
            raise ValueError(f"widths {hq}/{hk} are not divisible by the TP degree {self.world}")
        self.q_full, self.k_full, self.eps, self.order = hq, hk, float(eps), order
        self.comm, self.method, self.enable_pdl = comm, method, bool(enable_pdl)
        self.deterministic = bool(deterministic)
        self.group = comm.group if isinstance(comm, FallbackCommunicator) else group
        wq, wk = hq // self.world, hk // self.world
        self.register_buffer("q_weight", q_weight.detach()[self.rank * wq:(self.rank + 1) * wq]
                             .contiguous())
        self.register_buffer("k_weight", k_weight.detach()[self.rank * wk:(self.rank + 1) * wk]
                             .contiguous())

    def forward(self, q, k):
        method = self.method
        if isinstance(self.comm, FallbackCommunicator) and method in FUSED_METHODS:
            method = "minimax_eager"
        if method in FUSED_METHODS:
            if self.comm is None:
                raise ValueError("the fused methods need a communicator (even at TP 1)")
            return qk_norm(q, k, self.q_weight, self.k_weight, self.comm, self.q_full,
                           self.k_full, self.eps, self.order, method,
                           enable_pdl=self.enable_pdl, deterministic=self.deterministic)
        if method == "minimax_eager":
            return self._minimax_eager_reference(q, k)
        return self._all_gather_reference(q, k)

    def _minimax_eager_reference(self, q, k):
        """Torch reference of MiniMax eager (vLLM's MiniMax fallback): [T, 2] fp32 partial sums,
        one all-reduce over the group, then the scale."""
        stats = torch.stack([q.float().square().sum(-1), k.float().square().sum(-1)], dim=-1)
        if self.world > 1:
            dist.all_reduce(stats, group=self.group)
        rq = torch.rsqrt(stats[:, 0:1] / self.q_full + self.eps)
        rk = torch.rsqrt(stats[:, 1:2] / self.k_full + self.eps)
        # The fused op's output dtype: bf16 for fp8 inputs, so the output does not depend on
        # whether the group has P2P.
        return (_scale_rows(q, self.q_weight, rq, self.order, _out_dtype(q)),
                _scale_rows(k, self.k_weight, rk, self.order, _out_dtype(k)))

    def _all_gather_reference(self, q, k):
        """Torch reference of All-Gather (vLLM's OLMo2 path): gather the full rows, normalise
        them, keep this rank's slice."""
        def full_rstd(x, width):
            if self.world > 1:
                parts = [torch.empty_like(x) for _ in range(self.world)]
                dist.all_gather(parts, x.contiguous(), group=self.group)
                x = torch.cat(parts, dim=-1)
            return torch.rsqrt(x.float().square().sum(-1, keepdim=True) / width + self.eps)

        rq, rk = full_rstd(q, self.q_full), full_rstd(k, self.k_full)
        return (_scale_rows(q, self.q_weight, rq, self.order, q.dtype),
                _scale_rows(k, self.k_weight, rk, self.order, k.dtype))
