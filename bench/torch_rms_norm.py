#!/usr/bin/env python3
"""Times the single-GPU PyTorch baseline: two torch.nn.functional.rms_norm calls (Q and K) on
the same shapes as swiftqk_bench, graph-replayed, median of many replays, inputs rotated so L2
does not flatter. With --swiftqk-json it prints SwiftQK TP-1 time against it, side by side.
Each configuration is checked before it is timed: the two calls' outputs on the first input set
against float64, element by element within two bf16 roundings (the normalised value and the
product by the weight); a configuration with a wrong element is not timed, and the run exits 1.

    python3 bench/torch_rms_norm.py --json results/torch.json --swiftqk-json results/latest.json
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import graph_timing  # noqa: E402
import model_shapes  # noqa: E402

MODELS = model_shapes.norm_shapes()  # name: (q width, k width, eps), from bench/models.json


def count_wrong(torch, f, x, w, eps):
    """Elements of f(x, (width,), w, eps) outside 2.25 u + 1e-5 of the float64 RMSNorm, relative
    to the reference (floored at 4 x the smallest normal bf16), u = 2^-8: two roundings, as the
    C++ reference's Llama-order bound (tests/support/reference.cpp)."""
    got = f(x, (x.shape[-1],), w, eps).double()
    x64, w64 = x.double(), w.double()
    ref = w64 * x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps)
    bound = (2.25 * 2.0**-8 + 1e-5) * ref.abs().clamp_min(4 * 2.0**-126)
    return int((((got - ref).abs() > bound) | ~torch.isfinite(got)).sum())


def time_torch(torch, q_width, k_width, eps, tokens, iters, launches):
    f = torch.nn.functional.rms_norm
    dev = "cuda"
    set_bytes = tokens * (q_width + k_width) * 4
    sets = max(1, min(8, (120 << 20) // max(set_bytes, 1) + 1))
    qs = [torch.randn(tokens, q_width, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    ks = [torch.randn(tokens, k_width, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
    wq = torch.rand(q_width, device=dev, dtype=torch.bfloat16) + 0.5
    wk = torch.rand(k_width, device=dev, dtype=torch.bfloat16) + 0.5
    wrong = count_wrong(torch, f, qs[0], wq, eps) + count_wrong(torch, f, ks[0], wk, eps)
    if wrong:
        return {"wrong": wrong}
    outs = []

    def body(i):
        outs.append(f(qs[i % sets], (q_width,), wq, eps))
        outs.append(f(ks[i % sets], (k_width,), wk, eps))

    times = graph_timing.replay_times_us(torch, body, iters, launches)
    return {
        "wrong": 0,
        "median_us": statistics.median(times),
        "p10_us": times[int(0.1 * len(times))],
        "p99_us": times[min(len(times) - 1, int(0.99 * len(times)))],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tokens", default="1,64,4096,16384")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--graph-launches", type=int, default=20)
    ap.add_argument("--json", default="")
    ap.add_argument("--swiftqk-json", default="", help="swiftqk_bench JSON to compare at TP 1")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch_rms_norm.py: PyTorch is not installed here; nothing to time.")
        return 0
    if not torch.cuda.is_available():
        print("torch_rms_norm.py: no CUDA GPU; nothing to time.")
        return 0
    rows, failed = [], 0
    for name in args.models.split(","):
        q, k, eps = MODELS[name]
        for t in (int(x) for x in args.tokens.split(",")):
            r = time_torch(torch, q, k, eps, t, args.iters, args.graph_launches)
            r.update(method="torch_rms_norm_x2", model=name, q_width=q, k_width=k, tp=1, tokens=t,
                     dtype="bf16", mode="graph", device=torch.cuda.get_device_name())
            if r["wrong"]:
                print(f"torch_rms_norm.py: {name} at {t} tokens: {r['wrong']} elements outside "
                      f"the bound against float64; not timed")
                failed += 1
                continue
            rows.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    ours = {}
    if args.swiftqk_json:
        for r in json.load(open(args.swiftqk_json)):
            if r["tp"] == 1 and r["method"] == "swiftqk":
                ours[(r["model"], r["tokens"])] = r["median_us"]
    print(f"{'model':<11} {'tokens':>6} {'torch_x2_us':>11} {'swiftqk_us':>10} {'ratio':>6}")
    worse = 0
    for r in rows:
        s = ours.get((r["model"], r["tokens"]))
        ratio = f"{s / r['median_us']:.2f}" if s else "-"
        if s and s > r["median_us"]:
            worse += 1
        print(f"{r['model']:<11} {r['tokens']:>6} {r['median_us']:>11.2f} "
              f"{(s if s else float('nan')):>10.2f} {ratio:>6}")
    if ours:
        print(f"SwiftQK TP-1 slower than torch rms_norm x2 at {worse} of {len(rows)} points")
    if failed:
        print(f"torch_rms_norm.py: {failed} configurations failed the check and were not timed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
