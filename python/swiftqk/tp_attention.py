"""A tensor-parallel attention block built on TPQKNorm: column-parallel fused QKV projection,
layerwise QK-norm over the full Q and K widths, RoPE, causal attention, row-parallel output
projection with an all-reduce. Used to check this package against Hugging Face's Olmo2/OLMoE
attention and by the end-to-end decode harness. With ``fused_epilogue=True`` the norm, RoPE and
the write of K and V into a paged KV cache are one call of swiftqk.qk_epilogue, and attention
reads K and V back from that cache."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ._C import Communicator
from .epilogue_ops import qk_epilogue
from .module import TPQKNorm


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class TPAttention(nn.Module):
    """One rank's share of an attention layer with layerwise QK-norm.

    Weights are the FULL (unsharded) ones in nn.Linear layout [out, in]; the rank keeps its
    heads. ``world``/``rank`` come from the communicator (or the group for the torch methods).

    ``fused_epilogue=True`` (bf16 or f16 weights, method "swiftqk", a swiftqk.Communicator with
    P2P) runs the QK-norm, the NeoX RoPE and the KV-cache write as one swiftqk.qk_epilogue call:
    ``cos_sin_cache`` [max_position, head_dim] is then the rotary table (cos half, sin half of
    each row, as vLLM keeps it), and forward takes ``positions`` and a swiftqk.PagedKVCache in
    place of cos and sin.

    ``deterministic=True`` takes the norm's sums of squares in the canonical order (TPQKNorm's,
    and the epilogue's with ``fused_epilogue``), so the layer's norm outputs are the same bits at
    every TP degree.
    """

    def __init__(self, wq, wk, wv, wo, q_norm_weight, k_norm_weight, num_heads, num_kv_heads,
                 head_dim, eps, order="olmo2", comm=None, method="swiftqk", group=None,
                 fused_epilogue=False, cos_sin_cache=None, deterministic=False):
        super().__init__()
        if fused_epilogue:
            if method != "swiftqk" or not isinstance(comm, Communicator):
                raise ValueError("fused_epilogue=True needs method 'swiftqk' and a "
                                 "swiftqk.Communicator (the epilogue exchanges through P2P; "
                                 "there is no torch or NCCL version of it)")
            if cos_sin_cache is None:
                raise ValueError("fused_epilogue=True needs cos_sin_cache [max_position, "
                                 "head_dim] (cos half, then sin half)")
        self.fused_epilogue = bool(fused_epilogue)
        self.register_buffer("cos_sin_cache", cos_sin_cache)
        self.norm = TPQKNorm(q_norm_weight, k_norm_weight, eps, order, comm, method, group,
                             deterministic=deterministic)
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

    def forward(self, x, cos=None, sin=None, *, positions=None, kv_cache=None):
        """x [B, S, hidden]; cos/sin [B, S, head_dim] (HF rotary embedding output). With
        fused_epilogue: positions [B, S] int64 and kv_cache, a PagedKVCache of B sequences with
        this rank's KV heads, instead of cos and sin."""
        if self.fused_epilogue:
            return self._forward_fused(x, positions, kv_cache)
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

    def _forward_fused(self, x, positions, kv_cache):
        """Norm, RoPE and the cache write in one qk_epilogue call (Q normalised and rotated in
        place in the QKV output), then causal attention over what the cache holds: each query
        sees the keys at positions up to its own. Needs every earlier position of each sequence
        written (as a prefill, then decode steps, do)."""
        if positions is None or kv_cache is None:
            raise ValueError("fused_epilogue=True: forward needs positions and kv_cache")
        b, s, _ = x.shape
        qkv = (x @ self.w_qkv.T).reshape(b * s, -1)
        q, k, v = torch.split(qkv, self.widths, dim=-1)
        qk_epilogue(q, k, v, q_weight=self.norm.q_weight, k_weight=self.norm.k_weight,
                    positions=positions.reshape(-1).contiguous(),
                    cos_sin_cache=self.cos_sin_cache, k_cache=kv_cache.k, v_cache=kv_cache.v,
                    slot_mapping=kv_cache.slot_mapping(positions), comm=self.norm.comm,
                    head_dim=self.d, eps=self.norm.eps, order=self.norm.order,
                    kv_layout=kv_cache.layout, k_scale=kv_cache.k_scale,
                    v_scale=kv_cache.v_scale, enable_pdl=self.norm.enable_pdl,
                    deterministic=self.norm.deterministic)
        q = q.view(b, s, self.h, self.d).transpose(1, 2)
        k, v = kv_cache.read(x.dtype)  # [B, hkv, max_seq_len, d]
        keys = torch.arange(k.shape[2], device=x.device)
        mask = (keys.view(1, 1, -1) <= positions.unsqueeze(-1)).unsqueeze(1)  # [B, 1, S, L]
        if self.hkv != self.h:
            k = k.repeat_interleave(self.h // self.hkv, dim=1)
            v = v.repeat_interleave(self.h // self.hkv, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        o = o.transpose(1, 2).reshape(b, s, self.h * self.d) @ self.w_o.T
        if self.world > 1:
            dist.all_reduce(o, group=self.group)
        return o
