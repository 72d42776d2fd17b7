#!/usr/bin/env python3
"""Draws latency against tokens, one panel per model, one line per (method, TP), from the JSON
that swiftqk_bench and torch_rms_norm.py write (like the paper's Fig. 2(a)).

    python3 bench/plot_results.py results/latest.json [B.json ...] --out results/latency.png
"""
import argparse
import json
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("json", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", default="graph")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for f in args.json for r in json.load(open(f)) if r.get("mode", "graph") == args.mode]
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        lines = defaultdict(list)
        for r in rows:
            if r["model"] == model:
                lines[(r["method"], r["tp"])].append((r["tokens"], r["median_us"]))
        for (method, tp), pts in sorted(lines.items()):
            pts.sort()
            label = method if method.startswith("torch") else f"{method} TP{tp}"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(model)
        ax.set_xlabel("tokens")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel(f"median latency per call (us), {args.mode}")
    axes[0][-1].legend(fontsize=7)
    device = rows[0].get("device", "") if rows else ""
    gpus = max((r.get("gpus", 1) for r in rows), default=1)
    how = f"one process per GPU, {gpus} GPUs" if gpus > 1 else "TP > 1: virtual ranks on one GPU"
    fig.suptitle(f"QK-norm latency, {device} ({how})", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
