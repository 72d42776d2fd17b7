"""A tensor-parallel attention block built on TPQKNorm: column-parallel fused QKV projection,
layerwise QK-norm over the full Q and K widths, RoPE, causal attention, row-parallel output
projection with an all-reduce. Used to check this package against Hugging Face's Olmo2/OLMoE
attention and by the end-to-end decode harness."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .module import TPQKNorm


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class TPAttention(nn.Module):
    """One rank's share of an attention layer with layerwise QK-norm.

    Weights are the FULL (unsharded) ones in nn.Linear layout [out, in]; the rank keeps its
    heads. ``world``/``rank`` come from the communicator (or the group for the torch methods).
    """

    def __init__(self, wq, wk, wv, wo, q_norm_weight, k_norm_weight, num_heads, num_kv_heads,
                 head_dim, eps, order="olmo2", comm=None, method="swiftqk", group=None):
        super().__init__()
        self.norm = TPQKNorm(q_norm_weight, k_norm_weight, eps, order, comm, method, group)
        world, rank = self.norm.world, self.norm.rank
        if num_heads % world or num_kv_heads % world:
            raise ValueError(f"{num_heads} query / {num_kv_heads} KV heads do not divide over "
                             f"TP {world}; replicated KV heads are not supported yet")
        self.world, self.rank, self.group = world, rank, self.norm.group
        self.h, self.hkv, self.d = num_heads // world, num_kv_heads // world, head_dim
        wq_s, wk_s = self.h * head_dim, self.hkv * head_dim
        rows = lambda w, n: w.detach()[rank * n:(rank + 1) * n]  # noqa: E731
        # One fused projection, as engines do: q and k below are column views of its output.
        self.register_buffer("w_qkv", torch.cat([rows(wq, wq_s), rows(wk, wk_s), rows(wv, wk_s)]))
        self.register_buffer("w_o", wo.detach()[:, rank * wq_s:(rank + 1) * wq_s].contiguous())
        self.widths = (wq_s, wk_s, wk_s)

    def forward(self, x, cos, sin):
        """x [B, S, hidden]; cos/sin [B, S, head_dim] (HF rotary embedding output)."""
        b, s, _ = x.shape
        qkv = (x @ self.w_qkv.T).reshape(b * s, -1)
        q, k, v = torch.split(qkv, self.widths, dim=-1)  # strided views of the fused output
        q, k = self.norm(q, k)
        q = q.view(b, s, self.h, self.d).transpose(1, 2)
        k = k.view(b, s, self.hkv, self.d).transpose(1, 2)
        v = v.reshape(b, s, self.hkv, self.d).transpose(1, 2)
        c, sn = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = q * c + rotate_half(q) * sn, k * c + rotate_half(k) * sn
        if self.hkv != self.h:
            k = k.repeat_interleave(self.h // self.hkv, dim=1)
            v = v.repeat_interleave(self.h // self.hkv, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o = o.transpose(1, 2).reshape(b, s, self.h * self.d) @ self.w_o.T
        if self.world > 1:
            dist.all_reduce(o, group=self.group)
        return o
