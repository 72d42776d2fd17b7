#!/usr/bin/env python3
"""Times the fused QK epilogue (swiftqk.qk_epilogue, TP 1) against the PyTorch chain users have:
torch's rms_norm over the whole Q and K rows, Hugging Face's apply_rotary_pos_emb, then an index
copy of K and V into a paged NHD cache; eager and under torch.compile. Every path is first
checked against a float64 reference of the same inputs (the chain within bf16 rounding of each
of its steps); then each is graph-replayed, median of many replays, inputs rotated so L2 does not
flatter.

    python3 bench/epilogue_torch.py --json results/epilogue_torch.json
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import graph_timing  # noqa: E402
import model_shapes  # noqa: E402

HEAD_DIM = 128
MAX_POSITION = 8192
BLOCK = 16


def rope_table(torch, rotary_dim, device):
    """vLLM's cos_sin_cache: [max_position, rotary_dim], the cos half then the sin half."""
    inv = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    f = torch.outer(torch.arange(MAX_POSITION, dtype=torch.float64), inv)
    return torch.cat([f.cos(), f.sin()], dim=-1).float().to(device)


def make_inputs(torch, q_heads, kv_heads, rotary_dim, tokens, sets, seed):
    dev = "cuda"
    g = torch.Generator(device="cpu").manual_seed(seed)
    qw, kw = q_heads * HEAD_DIM, kv_heads * HEAD_DIM
    blocks = 4 * ((tokens + BLOCK - 1) // BLOCK) + 1
    out = []
    for _ in range(sets):
        qkv = torch.randn(tokens, qw + 2 * kw, generator=g).to(dev, torch.bfloat16)
        slots = torch.randperm(blocks * BLOCK, generator=g)[:tokens].to(dev)
        positions = torch.randint(0, MAX_POSITION, (tokens,), generator=g).to(dev)
        out.append(dict(qkv=qkv, slots=slots, positions=positions,
                        k_cache=torch.zeros(blocks, BLOCK, kv_heads, HEAD_DIM, device=dev,
                                            dtype=torch.bfloat16),
                        v_cache=torch.zeros(blocks, BLOCK, kv_heads, HEAD_DIM, device=dev,
                                            dtype=torch.bfloat16)))
    wq = (torch.rand(qw, generator=g) + 0.5).to(dev, torch.bfloat16)
    wk = (torch.rand(kw, generator=g) + 0.5).to(dev, torch.bfloat16)
    return out, wq, wk, rope_table(torch, rotary_dim, dev)


def views(x, qw, kw):
    return x[:, :qw], x[:, qw:qw + kw], x[:, qw + kw:]


def torch_chain(torch, apply_rotary_pos_emb, q_heads, kv_heads, rotary_dim, eps):
    """rms_norm over the full rows, HF's rotation (the first rotary_dim of each head), index copy."""
    qw, kw, half = q_heads * HEAD_DIM, kv_heads * HEAD_DIM, rotary_dim // 2

    def run(qkv, positions, slots, k_cache, v_cache, wq, wk, cos_sin):
        q, k, v = views(qkv, qw, kw)
        q = torch.nn.functional.rms_norm(q, (qw,), wq, eps).view(-1, q_heads, HEAD_DIM)
        k = torch.nn.functional.rms_norm(k, (kw,), wk, eps).view(-1, kv_heads, HEAD_DIM)
        cs = cos_sin[positions]
        cos = torch.cat([cs[:, :half], cs[:, :half]], -1).to(q.dtype)
        sin = torch.cat([cs[:, half:], cs[:, half:]], -1).to(q.dtype)
        # HF's layout is [batch, heads, tokens, dim]; unsqueeze_dim=1 broadcasts over heads.
        qr, kr = apply_rotary_pos_emb(q[..., :rotary_dim].transpose(0, 1).unsqueeze(0),
                                      k[..., :rotary_dim].transpose(0, 1).unsqueeze(0),
                                      cos.unsqueeze(0), sin.unsqueeze(0))
        q = torch.cat([qr[0].transpose(0, 1), q[..., rotary_dim:]], -1)
        k = torch.cat([kr[0].transpose(0, 1), k[..., rotary_dim:]], -1)
        k_cache.view(-1, kv_heads, HEAD_DIM).index_copy_(0, slots, k)
        v_cache.view(-1, kv_heads, HEAD_DIM).index_copy_(0, slots, v.view(-1, kv_heads, HEAD_DIM))
        return q

    return run


def gold(torch, inp, wq, wk, cos_sin, q_heads, kv_heads, rotary_dim, eps):
    """float64: norm over the full rows, NeoX rotation of each head's first rotary_dim."""
    qw, kw, half = q_heads * HEAD_DIM, kv_heads * HEAD_DIM, rotary_dim // 2
    q, k, v = (t.double() for t in views(inp["qkv"], qw, kw))

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()

    cs = cos_sin.double()[inp["positions"]]
    c, s = cs[:, None, :half], cs[:, None, half:]

    def rot(x, heads):
        x = x.view(-1, heads, HEAD_DIM).clone()
        a, b = x[..., :half].clone(), x[..., half:rotary_dim].clone()
        x[..., :half], x[..., half:rotary_dim] = a * c - b * s, b * c + a * s
        return x

    return rot(norm(q, wq), q_heads), rot(norm(k, wk), kv_heads), v.view(-1, kv_heads, HEAD_DIM)


def check(torch, got_q, k_cache, v_cache, inp, ref, kv_heads, bound):
    """Largest error of Q and of the cache rows at the slots, relative to the pair's magnitude."""
    gq, gk, gv = ref
    kc = k_cache.view(-1, kv_heads, HEAD_DIM)[inp["slots"]].double()
    vc = v_cache.view(-1, kv_heads, HEAD_DIM)[inp["slots"]].double()
    wrong = 0
    for got, want in ((got_q.double().view_as(gq), gq), (kc, gk), (vc, gv)):
        scale = want.abs().amax(-1, keepdim=True)  # a head's largest value
        wrong += int(((got - want).abs() > bound * scale).sum())
    return wrong


def time_graph(torch, body, iters, launches):
    return statistics.median(graph_timing.replay_times_us(torch, body, iters, launches))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="olmoe,olmo2-13b,olmo3-32b,minimax-m2")
    ap.add_argument("--tokens", default="1,64,2048,4096,16384")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--launches", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to time")
        return 0
    import swiftqk
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    shapes = model_shapes.norm_shapes()
    comm = swiftqk.create_local_group([0])[0]
    rows, total_wrong = [], 0
    print(f"{'model':<11} {'tokens':>6} {'swiftqk_us':>10} {'eager_us':>9} {'compiled_us':>11} "
          f"{'x_eager':>7} {'x_compiled':>10} {'wrong':>5}")
    for name in args.models.split(","):
        q_width, k_width, eps = shapes[name]
        q_heads, kv_heads = q_width // HEAD_DIM, k_width // HEAD_DIM
        rotary_dim = 64 if name == "minimax-m2" else HEAD_DIM
        qw, kw = q_width, k_width
        chain = torch_chain(torch, apply_rotary_pos_emb, q_heads, kv_heads, rotary_dim, eps)
        compiled = torch.compile(chain, fullgraph=True)  # one recompile, dynamic, at the second size
        for tokens in (int(t) for t in args.tokens.split(",")):
            per_set = tokens * (qw + 2 * kw) * 2 * 2
            sets = max(1, min(8, (120 << 20) // max(per_set, 1) + 1))
            inputs, wq, wk, cos_sin = make_inputs(torch, q_heads, kv_heads, rotary_dim, tokens,
                                                  sets, seed=tokens)

            def fused(i):
                inp = inputs[i % sets]
                q, k, v = views(inp["qkv"], qw, kw)
                swiftqk.qk_epilogue(q, k, v, q_weight=wq, k_weight=wk,
                                    positions=inp["positions"], cos_sin_cache=cos_sin,
                                    k_cache=inp["k_cache"], v_cache=inp["v_cache"],
                                    slot_mapping=inp["slots"], comm=comm, head_dim=HEAD_DIM,
                                    rotary_dim=rotary_dim, eps=eps, order="olmo2")

            def of(fn):
                def body(i):
                    inp = inputs[i % sets]
                    fn(inp["qkv"], inp["positions"], inp["slots"], inp["k_cache"],
                       inp["v_cache"], wq, wk, cos_sin)
                return body

            # Checks first, each on fresh copies of set 0 (the fused op works in place).
            wrong = 0
            ref = gold(torch, inputs[0], wq, wk, cos_sin, q_heads, kv_heads, rotary_dim, eps)
            saved = {k: v.clone() for k, v in inputs[0].items()}
            fused(0)
            torch.cuda.synchronize()
            comm.check_error()
            # bf16: the fused op rounds once (Olmo2 order) after fp32 math: 2^-8 of the head's
            # largest value; the chain rounds after the norm, each rotation product and the sum.
            wrong += check(torch, views(inputs[0]["qkv"], qw, kw)[0], inputs[0]["k_cache"],
                           inputs[0]["v_cache"], inputs[0], ref, kv_heads, 2.0 ** -8)
            for fn in (chain, compiled):
                for k, v in saved.items():
                    inputs[0][k].copy_(v)
                q = fn(inputs[0]["qkv"], inputs[0]["positions"], inputs[0]["slots"],
                       inputs[0]["k_cache"], inputs[0]["v_cache"], wq, wk, cos_sin)
                wrong += check(torch, q, inputs[0]["k_cache"], inputs[0]["v_cache"], inputs[0],
                               ref, kv_heads, 2.0 ** -6)
            total_wrong += wrong
            t_fused = time_graph(torch, fused, args.iters, args.launches)
            t_eager = time_graph(torch, of(chain), args.iters, args.launches)
            t_comp = time_graph(torch, of(compiled), args.iters, args.launches)
            row = dict(model=name, tokens=tokens, swiftqk_us=t_fused, eager_us=t_eager,
                       compiled_us=t_comp, x_eager=t_eager / t_fused, x_compiled=t_comp / t_fused,
                       wrong=wrong, torch=torch.__version__)
            rows.append(row)
            print(f"{name:<11} {tokens:>6} {t_fused:>10.2f} {t_eager:>9.2f} {t_comp:>11.2f} "
                  f"{row['x_eager']:>7.2f} {row['x_compiled']:>10.2f} {wrong:>5}", flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)
    if total_wrong:
        print(f"{total_wrong} wrong elements: FAILED")
        return 1
    print(f"all {len(rows)} configurations verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
