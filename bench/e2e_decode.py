#!/usr/bin/env python3
"""End-to-end tensor-parallel decode step with layerwise QK-norm: TPOT and tokens/s per QK-norm
method (the paper's Fig. 2(c)).

An OLMo2-13B-, OLMo3-32B- or OLMoE-shaped decoder with random weights (nothing downloaded):
per layer RMSNorm, TPAttention (fused QKV column-parallel projection, QK-norm, RoPE, attention
over a KV cache of the given context length, row-parallel output + all-reduce), RMSNorm and a
SwiGLU MLP (column/row parallel + all-reduce). OLMoE's MoE is replaced by a dense MLP as wide as
its active experts (8 x 1024), which keeps the per-token matrix work. The decode step for a
batch is captured into a CUDA graph and replayed; TPOT = one replay.

    torchrun --nproc-per-node N bench/e2e_decode.py --model olmo2-13b --layers 8   # N GPUs
    python3 bench/e2e_decode.py --model olmo2-13b                                  # TP 1

Methods: swiftqk, minimax_fused (the fused kernel), all_gather, minimax_eager (torch
collectives), and at TP 1 "plain" (torch.nn.functional.rms_norm, the single-GPU baseline).
On CPU (--device cpu, tiny shapes) it runs eagerly as a smoke test.

--fused-epilogue (GPU): the swiftqk method's QK-norm, RoPE and KV-cache write become one
swiftqk.qk_epilogue call per layer (rows named "swiftqk_epilogue"). Its cache is the same dense
[batch, kv_heads, context, head_dim] tensor the other methods use, seen as a paged HND cache with
one block of `context` slots per sequence (block table: sequence b -> block b), so attention
reads the same bytes; the new token takes the last slot of its sequence's block, as elsewhere.

Every (method, batch, context) is checked before it is timed: one eager call of the first
layer's QK path (projection, layerwise QK-norm over the full Q and K widths, RoPE at the decode
position, the write of K and V into the cache) on the step's own input, against a float64
reference of the full (unsharded) weights, sliced to this rank's heads: this rank's Q heads and
the cache slot its new K and V took. The error is the largest difference over the largest
reference value; the bound is CHECK_ULPS units of rounding of the dtype (the projection, the
norm and the RoPE each round). A configuration that fails is not timed, and the run exits 1.
--corrupt-norm (the check's negative control) doubles rank 0's Q-norm weight shard of the first
layer, so every configuration must fail.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_shapes  # noqa: E402

# hidden, heads, kv heads, head_dim, MLP width, eps, norm order, layers: the models of
# bench/models.json with a decoder entry, and "tiny", a smoke-test shape that is no model.
MODELS = {**model_shapes.decoder_shapes(), "tiny": (256, 8, 8, 32, 512, 1e-6, "olmo2", 2)}


_KV_CACHES = {}

# The check's bound in units of rounding (u = 2^-8 bf16, 2^-24 fp32), over the largest reference
# value. Against the largest normalised element, the projection's output and the norm's output
# (u/2 each, one more u/2 in the Llama order) reach a rotated element through |cos| + |sin| <=
# sqrt 2, and the table's cos and sin and RoPE's two products and sum add about 2 u: 4.2 u at
# most; a rotation can leave the largest reference value 1/sqrt 2 of that element, so 6 u, and
# 8 u leaves a margin. A doubled norm weight, a missing exchange (sqrt TP) or a wrong head or
# position is off by far more. The floor covers fp32's sums over the hidden width (CPU runs).
CHECK_ULPS = 8
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


def rope_table(positions, rotary_dim, device):
    """A real rotary table (base 10000) as qk_epilogue takes it: [positions, rotary_dim], the
    cos half then the sin half of each row."""
    inv = 10000.0 ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    f = torch.arange(positions, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([f.cos(), f.sin()], dim=-1).float().to(device)


class Layer(torch.nn.Module):
    def __init__(self, cfg, method, comm, group, rank, world, batch, ctx, dtype, device,
                 fused_epilogue=False, cos_sin=None, keep_full=False):
        super().__init__()
        from swiftqk.tp_attention import TPAttention

        hidden, heads, kv, hd, inter, eps, order, _ = cfg
        g = lambda *s: (torch.randn(*s, dtype=dtype, device=device) * 0.02)  # noqa: E731
        self.eps, self.world, self.group, self.rank = eps, world, group, rank
        self.ln1 = torch.ones(hidden, dtype=dtype, device=device)
        self.ln2 = torch.ones(hidden, dtype=dtype, device=device)
        qn = torch.rand(heads * hd, dtype=dtype, device=device) + 0.5
        kn = torch.rand(kv * hd, dtype=dtype, device=device) + 0.5
        wq, wk, wv = g(heads * hd, hidden), g(kv * hd, hidden), g(kv * hd, hidden)
        # The check's reference needs the unsharded weights (every rank draws the same ones);
        # copies, since the layer's shards may share their storage.
        self.full = tuple(t.clone() for t in (wq, wk, wv, qn, kn)) if keep_full else None
        norm_method = "all_gather" if method == "plain" else method
        self.attn = TPAttention(wq, wk, wv, g(hidden, heads * hd), qn, kn, heads, kv, hd, eps,
                                order, comm, norm_method, group)
        if method == "plain":  # single-GPU: the norm is torch's own rms_norm over full rows
            self.attn.norm.forward = lambda q, k: (
                F.rms_norm(q, (q.shape[-1],), self.attn.norm.q_weight, eps),
                F.rms_norm(k, (k.shape[-1],), self.attn.norm.k_weight, eps))
        i = inter // world
        self.w_up = g(2 * i, hidden)
        self.w_down = g(hidden, i)
        # KV cache of `ctx` positions per sequence (decode attends over all of them). One cache
        # is shared by all layers: each layer still reads a whole cache (far beyond L2, so no
        # layer is flattered), and batch 256 x 4096 positions fits on one GPU at TP 1.
        key = (batch, self.attn.hkv, ctx, hd, dtype, device)
        if key not in _KV_CACHES:
            _KV_CACHES[key] = (torch.randn(*key[:4], dtype=dtype, device=device),
                               torch.randn(*key[:4], dtype=dtype, device=device))
        self.k_cache, self.v_cache = _KV_CACHES[key]
        self.fused = fused_epilogue and method == "swiftqk"
        if self.fused:  # the cache as HND blocks of ctx slots, sequence b in block b
            self.cos_sin = cos_sin
            self.positions = torch.full((batch,), ctx - 1, dtype=torch.int64, device=device)
            self.slots = torch.arange(batch, dtype=torch.int64, device=device) * ctx + ctx - 1

    def qk(self, h, cos, sin):
        """The QK path: projection, QK-norm, RoPE and the write of K and V into the cache's
        last position; returns Q as [batch, heads, 1, head_dim]."""
        b = h.shape[0]
        a = self.attn
        qkv = (h @ a.w_qkv.T).reshape(b, -1)
        q, k, v = torch.split(qkv, a.widths, dim=-1)
        if self.fused:
            import swiftqk

            swiftqk.qk_epilogue(q, k, v, q_weight=a.norm.q_weight, k_weight=a.norm.k_weight,
                                positions=self.positions, cos_sin_cache=self.cos_sin,
                                k_cache=self.k_cache, v_cache=self.v_cache,
                                slot_mapping=self.slots, comm=a.norm.comm, head_dim=a.d,
                                eps=self.eps, order=a.norm.order, kv_layout="HND")
            q = q.view(b, a.h, 1, a.d)  # normalised and rotated in place
        else:
            q, k = a.norm(q, k)
            q = q.view(b, a.h, 1, a.d)
            k = k.view(b, a.hkv, 1, a.d)
            q = q * cos + torch.cat((-q[..., a.d // 2:], q[..., :a.d // 2]), -1) * sin
            k = k * cos + torch.cat((-k[..., a.d // 2:], k[..., :a.d // 2]), -1) * sin
            self.k_cache[:, :, -1:].copy_(k)  # the new token takes the last cache position
            self.v_cache[:, :, -1:].copy_(v.reshape(b, a.hkv, 1, a.d))
        return q

    def forward(self, x, cos, sin):
        h = F.rms_norm(x, (x.shape[-1],), self.ln1, self.eps)
        q = self.qk(h, cos, sin)
        a, b = self.attn, x.shape[0]
        kk, vv = self.k_cache, self.v_cache
        if a.hkv != a.h:
            kk = kk.repeat_interleave(a.h // a.hkv, dim=1)
            vv = vv.repeat_interleave(a.h // a.hkv, dim=1)
        o = F.scaled_dot_product_attention(q, kk, vv).reshape(b, a.h * a.d) @ a.w_o.T
        if self.world > 1:
            dist.all_reduce(o, group=self.group)
        x = x + o
        h = F.rms_norm(x, (x.shape[-1],), self.ln2, self.eps)
        gate, up = (h @ self.w_up.T).chunk(2, dim=-1)
        m = (F.silu(gate) * up) @ self.w_down.T
        if self.world > 1:
            dist.all_reduce(m, group=self.group)
        return x + m


def rope_at(table, position, dtype):
    """cos and sin of one position, NeoX layout ([1, 1, 1, rotary_dim]: each half twice), as the
    unfused path multiplies them in."""
    half = table.shape[1] // 2
    c, s = table[position, :half], table[position, half:]
    return (torch.cat([c, c]).to(dtype).view(1, 1, 1, -1),
            torch.cat([s, s]).to(dtype).view(1, 1, 1, -1))


def check_qk(layer, x, table, position):
    """The largest error of this rank's Q heads and new cache K and V (after one call of the
    layer's QK path on the step's input x) over the largest float64 reference value."""
    a, b = layer.attn, x.shape[0]
    h = F.rms_norm(x, (x.shape[-1],), layer.ln1, layer.eps)
    cos, sin = rope_at(table, position, x.dtype)
    q = layer.qk(h, cos, sin).reshape(b, a.h, a.d)
    got_k, got_v = layer.k_cache[:, :, -1], layer.v_cache[:, :, -1]
    wq, wk, wv, qn, kn = (t.double() for t in layer.full)
    h64 = h.double()

    def normed(w, nw):  # the layerwise norm over the full width
        y = h64 @ w.T
        return nw * y * torch.rsqrt(y.square().mean(-1, keepdim=True) + layer.eps)

    half = table.shape[1] // 2
    c64 = table[position, :half].double().repeat(2)
    s64 = table[position, half:].double().repeat(2)

    def rope(y, heads):
        y = y.view(b, heads, a.d)
        return y * c64 + torch.cat((-y[..., a.d // 2:], y[..., :a.d // 2]), -1) * s64

    hq, hkv = a.h * a.world, a.hkv * a.world
    r = layer.rank
    ref = (rope(normed(wq, qn), hq)[:, r * a.h:(r + 1) * a.h],
           rope(normed(wk, kn), hkv)[:, r * a.hkv:(r + 1) * a.hkv],
           (h64 @ wv.T).view(b, hkv, a.d)[:, r * a.hkv:(r + 1) * a.hkv])
    err = 0.0
    for got, want in zip((q, got_k, got_v), ref):
        e = (got.double() - want).abs().max() / want.abs().max()
        err = max(err, e.item() if torch.isfinite(e) else math.inf)
    return err


def run(args, method, batch, ctx, rank, world, group, comm, device):
    import swiftqk  # noqa: F401

    cfg = MODELS[args.model]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    _KV_CACHES.clear()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    fused = args.fused_epilogue and method == "swiftqk"
    # One rotary table for both paths: the fused epilogue reads the decode position's row, the
    # unfused path multiplies in the same row's cos and sin.
    table = rope_table(ctx, cfg[3], device)
    layers = [Layer(cfg, method, comm, group, rank, world, batch, ctx, dtype, device, fused,
                    table if fused else None, keep_full=i == 0)
              for i in range(args.layers or cfg[7])]
    x = torch.randn(batch, cfg[0], dtype=dtype, device=device)
    cos, sin = rope_at(table, ctx - 1, dtype)
    if args.corrupt_norm and rank == 0:
        with torch.no_grad():
            layers[0].attn.norm.q_weight.mul_(2)
    with torch.no_grad():
        err = check_qk(layers[0], x, table, ctx - 1)
    tol = CHECK_ULPS * UNIT_ROUNDOFF[dtype] + 1e-5
    if world > 1:  # every rank times only what every rank checked
        flag = torch.tensor([err], dtype=torch.float64, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        err = flag.item()
    if not err <= tol:
        return {"method": "swiftqk_epilogue" if fused else method, "model": args.model,
                "tp": world, "batch": batch, "context": ctx, "checked": False,
                "max_rel_err": err, "tolerance": tol, "device": str(device)}

    def step():
        y = x
        for layer in layers:
            y = layer(y, cos, sin)
        return y

    times = []
    if device.type == "cuda":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        for _ in range(5):
            g.replay()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(args.iters)]
        for a, b in ev:
            a.record()
            g.replay()
            b.record()
        torch.cuda.synchronize()
        times = [a.elapsed_time(b) for a, b in ev]
    else:
        for _ in range(args.iters):
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    tpot = statistics.median(times)
    return {"method": "swiftqk_epilogue" if fused else method, "model": args.model, "tp": world,
            "batch": batch, "context": ctx, "checked": True, "max_rel_err": err,
            "tolerance": tol, "layers": len(layers), "tpot_ms": tpot,
            "p99_ms": times[min(len(times) - 1, math.ceil(0.99 * len(times)) - 1)],
            "tokens_per_s": batch / tpot * 1e3, "device": str(device)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="olmo2-13b", choices=sorted(MODELS))
    ap.add_argument("--layers", type=int, default=8, help="decoder layers (0: the model's own)")
    ap.add_argument("--batch", default="1,8,32,128,256")
    ap.add_argument("--context", default="512,4096")
    ap.add_argument("--methods", default="swiftqk,minimax_fused,all_gather,minimax_eager,plain")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--json", default="")
    ap.add_argument("--fused-epilogue", action="store_true",
                    help="swiftqk: QK-norm + RoPE + KV-cache write in one swiftqk.qk_epilogue "
                         "call (rows 'swiftqk_epilogue'; GPU only)")
    ap.add_argument("--corrupt-norm", action="store_true",
                    help="the negative control of the check: double rank 0's Q-norm weight shard "
                         "of the first layer, so every configuration must fail (exit 1)")
    args = ap.parse_args()
    if args.fused_epilogue and args.device != "cuda":
        ap.error("--fused-epilogue needs --device cuda (the epilogue is a CUDA kernel)")
    if args.fused_epilogue and "swiftqk" not in args.methods.split(","):
        ap.error("--fused-epilogue changes the swiftqk method: add swiftqk to --methods")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) \
        if args.device == "cuda" else torch.device("cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("e2e_decode.py: no CUDA GPU on this machine; use --device cpu for a smoke test")
        return 0
    group, comm = None, None
    if world > 1 or args.device == "cuda":
        if args.device == "cuda":
            torch.cuda.set_device(device)
        if world > 1:
            dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
            group = dist.group.WORLD
    methods = args.methods.split(",")
    if args.device == "cuda" and any(m in ("swiftqk", "minimax_fused") for m in methods):
        import swiftqk

        comm = (swiftqk.communicator_from_group(group, device.index) if world > 1
                else swiftqk.create_local_group([device.index])[0])
        if args.fused_epilogue and not isinstance(comm, swiftqk.Communicator):
            print(f"e2e_decode.py: --fused-epilogue needs CUDA P2P between the ranks, which this "
                  f"group lacks ({comm.reason})")
            return 2
    rows, combos = [], [(m, b, c) for m in methods for b in map(int, args.batch.split(","))
                        for c in map(int, args.context.split(","))]
    for i, (m, b, c) in enumerate(combos):
        if m == "plain" and world > 1:
            continue
        if m in ("swiftqk", "minimax_fused") and comm is None:
            continue  # the fused kernel needs a GPU
        r = run(args, m, b, c, rank, world, group, comm, device)
        rows.append(r)
        if rank == 0 and not r["checked"]:
            print(f"[{i + 1}/{len(combos)}] {r['method']:<16} batch {b:>4} ctx {c:>5}: WRONG, "
                  f"error {r['max_rel_err']:.3e} > {r['tolerance']:.3e} against float64; "
                  f"not timed", flush=True)
        elif rank == 0:
            print(f"[{i + 1}/{len(combos)}] {r['method']:<16} batch {b:>4} ctx {c:>5}: TPOT "
                  f"{r['tpot_ms']:8.3f} ms (p99 {r['p99_ms']:.3f}), {r['tokens_per_s']:9.0f} tok/s"
                  f" (checked: error {r['max_rel_err']:.1e})", flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if world > 1:
        dist.destroy_process_group()
    wrong = [r for r in rows if not r["checked"]]
    if wrong and rank == 0:
        print(f"e2e_decode.py: {len(wrong)} of {len(rows)} configurations failed the check "
              f"against float64 and were not timed")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
