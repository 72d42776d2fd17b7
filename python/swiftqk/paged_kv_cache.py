"""The smallest honest paged KV cache: what swiftqk.qk_epilogue writes into and attention reads
back, for TPAttention's fused path and the tests. Not an engine's allocator: every sequence owns
a fixed run of consecutive blocks from the start (no allocation, eviction or sharing)."""

import math
from typing import Optional

import torch

from .epilogue_ops import KV_LAYOUTS


class PagedKVCache:
    """One rank's K and V caches for ``num_seqs`` sequences of up to ``max_seq_len`` tokens.

    Layout ("NHD", FlashAttention's): k and v are [num_blocks, block_size, kv_heads, head_dim];
    ("HND"): [num_blocks, kv_heads, block_size, head_dim]. Sequence b owns blocks
    ``block_table[b] = [b * blocks_per_seq, (b + 1) * blocks_per_seq)``; its token at position p
    lives in slot ``block_table[b, p // block_size] * block_size + p % block_size``:

        blocks:  | seq 0: 0 1 .. n-1 | seq 1: n .. 2n-1 | ...      n = blocks_per_seq

    The caches start as zeros, so slots nobody has written hold finite values (attention masks
    them, and a masked NaN would still poison its product with a zero weight). An fp8 cache
    (dtype float8_e4m3fn) needs k_scale and v_scale, float32 one-element device tensors.
    """

    def __init__(self, num_seqs: int, max_seq_len: int, kv_heads: int, head_dim: int, *,
                 block_size: int = 16, layout: str = "NHD", dtype=torch.bfloat16, device=None,
                 k_scale: Optional[torch.Tensor] = None, v_scale: Optional[torch.Tensor] = None):
        if layout not in KV_LAYOUTS:
            raise ValueError(f"layout must be one of {KV_LAYOUTS}, got {layout!r}")
        if dtype == torch.float8_e4m3fn and (k_scale is None or v_scale is None):
            raise ValueError("a float8_e4m3fn cache needs k_scale and v_scale")
        self.num_seqs, self.max_seq_len = num_seqs, max_seq_len
        self.kv_heads, self.head_dim, self.block_size = kv_heads, head_dim, block_size
        self.layout, self.dtype = layout, dtype
        self.k_scale, self.v_scale = k_scale, v_scale
        self.blocks_per_seq = math.ceil(max_seq_len / block_size)
        num_blocks = num_seqs * self.blocks_per_seq
        shape = ((num_blocks, block_size, kv_heads, head_dim) if layout == "NHD" else
                 (num_blocks, kv_heads, block_size, head_dim))
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_table = torch.arange(num_blocks, dtype=torch.int64, device=device).view(
            num_seqs, self.blocks_per_seq)

    def slot_mapping(self, positions: torch.Tensor) -> torch.Tensor:
        """The slots of the tokens at ``positions`` [num_seqs, S] (row b: sequence b), as the
        contiguous int64 [num_seqs x S] that qk_epilogue takes."""
        blocks = self.block_table.gather(1, torch.div(positions, self.block_size,
                                                      rounding_mode="floor"))
        return (blocks * self.block_size + positions % self.block_size).reshape(-1).contiguous()

    def _read(self, cache, scale, dtype):
        n, bps, bs = self.num_seqs, self.blocks_per_seq, self.block_size
        blocks = cache.index_select(0, self.block_table.reshape(-1))
        if self.layout == "NHD":  # [n * bps, bs, h, d] -> [n, h, bps * bs, d]
            x = blocks.view(n, bps * bs, self.kv_heads, self.head_dim).transpose(1, 2)
        else:  # [n * bps, h, bs, d] -> [n, h, bps * bs, d]
            x = blocks.view(n, bps, self.kv_heads, bs, self.head_dim).transpose(1, 2).reshape(
                n, self.kv_heads, bps * bs, self.head_dim)
        x = x[:, :, :self.max_seq_len]
        if self.dtype == torch.float8_e4m3fn:
            return (x.float() * scale).to(dtype)
        return x.to(dtype)

    def read(self, dtype=None):
        """K and V of every position of every sequence, [num_seqs, kv_heads, max_seq_len,
        head_dim] in position order, gathered through the block table (dequantised to ``dtype``,
        default the cache's own, from an fp8 cache)."""
        dtype = dtype or (torch.bfloat16 if self.dtype == torch.float8_e4m3fn else self.dtype)
        return self._read(self.k, self.k_scale, dtype), self._read(self.v, self.v_scale, dtype)
