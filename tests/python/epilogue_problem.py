"""Fused QK epilogue problems for the Python GPU tests (the twin of tests/support/
epilogue_problem.cpp): a full random problem on the CPU (all ranks' rows, weights, a real RoPE
table, positions out of order and repeated, slots across many blocks with some -1), one rank's
device tensors (Q, K, V as column views of one fused QKV tensor, a paged cache of its KV heads),
and the check of what the op wrote against the float64 gold, the cache compared bit for bit
outside the slots the call owns."""

import dataclasses
import math

import torch

from epilogue_reference import (cache_rows, cache_slot_mask, count_epilogue_wrong,
                                norm_rope_fp64, quantize_e4m3, rope_table)
from reference import random_rows

DEVICE = "cuda"
FP8 = torch.float8_e4m3fn


@dataclasses.dataclass
class Setup:
    """What a test varies. Heads are the model's (all ranks)."""
    tokens: int = 77
    q_heads: int = 8
    kv_heads: int = 4
    head_dim: int = 128
    rotary_dim: int = 128
    is_neox: bool = True
    headwise: bool = False
    order: str = "olmo2"
    weight_plus_one: bool = False
    dtype: torch.dtype = torch.bfloat16
    q_out_dtype: torch.dtype = None  # default: dtype
    cache_dtype: torch.dtype = None  # default: dtype
    cs_dtype: torch.dtype = torch.float32
    layout: str = "NHD"
    in_place: bool = True  # q_out is q (a model-dtype q_out only)
    k_out: bool = False
    block_size: int = 16
    max_position: int = 4096
    padding: float = 0.1  # fraction of tokens with slot -1
    eps: float = 1e-6
    seed: int = 1

    def __post_init__(self):
        self.q_out_dtype = self.q_out_dtype or self.dtype
        self.cache_dtype = self.cache_dtype or self.dtype

    def num_blocks(self):
        """Enough for every token, spread over 4x as many: most of the cache is untouched."""
        return 4 * math.ceil(self.tokens / self.block_size) + 1


def bits(t):
    """t's bits as integers of its element size (NaN patterns compare equal to themselves)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(ints[t.element_size()])


class Problem:
    """The full (unsharded) problem on the CPU, with its float64 gold."""

    def __init__(self, s: Setup):
        self.s = s
        g = torch.Generator().manual_seed(s.seed)
        qw, kw = s.q_heads * s.head_dim, s.kv_heads * s.head_dim
        wq_n, wk_n = (s.head_dim, s.head_dim) if s.headwise else (qw, kw)
        lo, hi = (-0.5, 1.0) if s.weight_plus_one else (0.25, 2.0)  # 1 + w in [0.5, 2)
        self.wq = (torch.rand(wq_n, generator=g) * (hi - lo) + lo).to(s.dtype)
        self.wk = (torch.rand(wk_n, generator=g) * (hi - lo) + lo).to(s.dtype)
        self.cos_sin = rope_table(s.max_position, s.rotary_dim, s.cs_dtype)
        self.positions = torch.randint(0, s.max_position, (s.tokens,), generator=g)
        if s.tokens > 2:
            self.positions[2] = self.positions[0]  # a repeat
        slots = torch.randperm(s.num_blocks() * s.block_size, generator=g)[:s.tokens]
        pad = torch.rand(s.tokens, generator=g) < s.padding
        self.slots = torch.where(pad, torch.full_like(slots, -1), slots)
        self.refill(s.seed * 7 + 3)

    def refill(self, seed):
        """Fresh Q, K and V (weights, table, positions and slots kept), their gold and the fp8
        scales from the gold's range (amax / 400: a few values saturate at most)."""
        s = self.s
        qw, kw = s.q_heads * s.head_dim, s.kv_heads * s.head_dim
        self.q = random_rows(s.tokens, qw, s.dtype, seed)
        self.k = random_rows(s.tokens, kw, s.dtype, seed + 1)
        self.v = random_rows(s.tokens, kw, s.dtype, seed + 2)
        self.regold()

    def regold(self):
        """The gold of the current values (after positions or slots were changed too)."""
        s = self.s
        rope = dict(head_dim=s.head_dim, rotary_dim=s.rotary_dim, is_neox=s.is_neox,
                    headwise=s.headwise, weight_plus_one=s.weight_plus_one, eps=s.eps)
        ok = (self.positions >= 0) & (self.positions < s.max_position)
        pos = torch.where(ok, self.positions, torch.zeros_like(self.positions))
        self.gq = norm_rope_fp64(self.q, self.wq, pos, self.cos_sin, **rope)
        self.gk = norm_rope_fp64(self.k, self.wk, pos, self.cos_sin, **rope)
        self.gq[~ok] = float("nan")  # a bad position's token has no expected value
        self.gk[~ok] = float("nan")
        amax = lambda x: float(x[~torch.isnan(x)].abs().max()) if x.numel() else 1.0  # noqa: E731
        self.q_scale = amax(self.gq) / 400
        self.k_scale = amax(self.gk) / 400
        self.v_scale = amax(self.v.double()) / 400


class Rank:
    """One rank's device tensors for a Problem: qkv [T, (q + 2 kv) local width] with q, k, v its
    column views, the caches of its KV heads, and the op's other inputs."""

    def __init__(self, p: Problem, world=1, rank=0):
        s = self.s = p.s
        self.p, self.world, self.rank = p, world, rank
        self.qh, self.kh = s.q_heads // world, s.kv_heads // world
        self.qw, self.kw = self.qh * s.head_dim, self.kh * s.head_dim
        self.qkv = torch.empty(s.tokens, self.qw + 2 * self.kw, dtype=s.dtype, device=DEVICE)
        self.q, self.k, self.v = torch.split(self.qkv, (self.qw, self.kw, self.kw), dim=-1)
        in_place = s.in_place and s.q_out_dtype == s.dtype
        self.q_out = self.q if in_place else torch.empty(s.tokens, self.qw, dtype=s.q_out_dtype,
                                                         device=DEVICE)
        self.k_out = torch.empty(s.tokens, self.kw, dtype=s.dtype, device=DEVICE) if s.k_out \
            else None
        self.wq = (p.wq if s.headwise else self._cols(p.wq[None], self.qw)[0]).to(DEVICE)
        self.wk = (p.wk if s.headwise else self._cols(p.wk[None], self.kw)[0]).to(DEVICE)
        self.cos_sin = p.cos_sin.to(DEVICE)
        self.positions = torch.empty(s.tokens, dtype=torch.int64, device=DEVICE)
        self.slots = torch.empty(s.tokens, dtype=torch.int64, device=DEVICE)
        shape = ((s.num_blocks(), s.block_size, self.kh, s.head_dim) if s.layout == "NHD" else
                 (s.num_blocks(), self.kh, s.block_size, s.head_dim))
        self.k_cache = torch.empty(shape, dtype=s.cache_dtype, device=DEVICE)
        self.v_cache = torch.empty(shape, dtype=s.cache_dtype, device=DEVICE)
        self.scales = torch.empty(3, dtype=torch.float32, device=DEVICE)
        self.upload()

    def _cols(self, full, width):
        """This rank's columns [rank * width, (rank + 1) * width) of full [T, world * width]."""
        return full[:, self.rank * width:(self.rank + 1) * width]

    def upload(self):
        """Copies the problem's current values into the (possibly captured) device tensors."""
        p = self.p
        self.q.copy_(self._cols(p.q, self.qw))
        self.k.copy_(self._cols(p.k, self.kw))
        self.v.copy_(self._cols(p.v, self.kw))
        self.positions.copy_(p.positions)
        self.slots.copy_(p.slots)
        self.scales.copy_(torch.tensor([p.q_scale, p.k_scale, p.v_scale]))

    def poison(self, seed):
        """Random bits, never zero bytes, over both caches; NaN over q_out (out of place) and
        k_out; then the caches' state is recorded for check()."""
        g = torch.Generator().manual_seed(seed)
        for c in (self.k_cache, self.v_cache):
            b = torch.randint(1, 256, (c.numel() * c.element_size(),), dtype=torch.uint8,
                              generator=g)
            c.view(-1).view(torch.uint8).copy_(b)
        for t in (self.q_out if self.q_out is not self.q else None, self.k_out):
            if t is not None:
                t.view(torch.uint8).fill_(0xFF)
        self.before = (self.k_cache.clone(), self.v_cache.clone())

    def scale_args(self):
        s = self.s
        fp8_cache = s.cache_dtype == FP8
        return dict(q_scale=self.scales[0:1] if s.q_out_dtype == FP8 else None,
                    k_scale=self.scales[1:2] if fp8_cache else None,
                    v_scale=self.scales[2:3] if fp8_cache else None)

    def kwargs(self, comm):
        """swiftqk.qk_epilogue's arguments after q, k, v."""
        s = self.s
        return dict(q_weight=self.wq, k_weight=self.wk, positions=self.positions,
                    cos_sin_cache=self.cos_sin, k_cache=self.k_cache, v_cache=self.v_cache,
                    slot_mapping=self.slots, comm=comm, head_dim=s.head_dim,
                    rotary_dim=s.rotary_dim, is_neox=s.is_neox, headwise=s.headwise,
                    weight_plus_one=s.weight_plus_one, eps=s.eps, order=s.order,
                    kv_layout=s.layout, q_out=self.q_out, k_out=self.k_out, **self.scale_args())

    def call(self, swiftqk, comm):
        return swiftqk.qk_epilogue(self.q, self.k, self.v, **self.kwargs(comm))

    def op_args(self, handle):
        """The positional arguments of torch.ops.swiftqk.qk_epilogue (for opcheck)."""
        s, sc = self.s, self.scale_args()
        return (self.q, self.k, self.v, self.q_out, self.k_out, self.wq, self.wk, self.positions,
                self.cos_sin, self.k_cache, self.v_cache, self.slots, sc["k_scale"],
                sc["v_scale"], sc["q_scale"], handle, s.head_dim, s.rotary_dim, s.is_neox,
                s.headwise, s.weight_plus_one, s.eps, 0 if s.order == "olmo2" else 1, s.layout,
                False)

    def check(self, bad_tokens=()):
        """What this rank wrote against the gold: a list of problems (empty when right). Q at
        every good token; K (and k_out) and V at every good token's slot; every other cache
        element bit-for-bit unchanged; bad tokens' Q rows NaN and their slots untouched."""
        s, p = self.s, self.p
        errors = []
        rope = (s.dtype, s.order, s.head_dim, s.rotary_dim, s.is_neox)
        bad = torch.zeros(s.tokens, dtype=torch.bool)
        bad[list(bad_tokens)] = True
        gq, gk = self._cols(p.gq, self.qw).clone(), self._cols(p.gk, self.kw).clone()
        gq[bad], gk[bad] = float("nan"), float("nan")
        q_scale = self.scales[0:1] if s.q_out_dtype == FP8 else None
        q_out = self.q_out.cpu()
        n = count_epilogue_wrong(q_out, gq, *rope, scale=q_scale)
        if n:
            errors.append(f"q_out: {n} elements wrong")
        if bad.any() and not torch.isnan(q_out[bad].double()).all():
            errors.append("q_out rows of bad tokens are not NaN")
        if self.k_out is not None:
            n = count_epilogue_wrong(self.k_out.cpu(), gk, *rope)
            if n:
                errors.append(f"k_out: {n} elements wrong")
        written = (p.slots >= 0) & ~bad
        slots = p.slots[written].to(DEVICE)
        fp8 = s.cache_dtype == FP8
        k_rows = cache_rows(self.k_cache, slots, s.layout, s.block_size).cpu()
        n = count_epilogue_wrong(k_rows, gk[written], *rope,
                                 scale=self.scales[1:2] if fp8 else None)
        if n:
            errors.append(f"k_cache: {n} elements wrong at the tokens' slots")
        v_rows = cache_rows(self.v_cache, slots, s.layout, s.block_size).cpu()
        v_want = self._cols(p.v, self.kw)[written]  # a copy, or one quantisation
        if fp8:
            v_want = quantize_e4m3(v_want, self.scales[2:3].cpu())
        if not torch.equal(bits(v_rows), bits(v_want)):
            errors.append("v_cache: rows at the tokens' slots are not V (or its fp8 value)")
        mask = cache_slot_mask(self.k_cache, slots, s.layout, s.block_size)
        for name, after, before in (("k_cache", self.k_cache, self.before[0]),
                                    ("v_cache", self.v_cache, self.before[1])):
            if not torch.equal(bits(after)[~mask], bits(before)[~mask]):
                errors.append(f"{name}: elements outside the call's slots changed")
        return errors
