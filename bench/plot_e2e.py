#!/usr/bin/env python3
"""Draws TPOT against batch size, one panel per (model, TP, context), one line per QK-norm
method, from the JSON that e2e_decode.py writes (like the paper's Fig. 2(c)), and prints each
method's TPOT relative to SwiftQK's, then per TP and method the range of those reductions (each
model's too), the figures the paper quotes (29.5% against All-Gather, 14.3% against MiniMax fused).

    python3 bench/plot_e2e.py results/e2e_tp2_*.json [...] --out results/e2e.png
"""
import argparse
import json
from collections import defaultdict


def reductions(rows):
    """(row, percent) for every other method's row that has a SwiftQK row at the same point:
    how much lower SwiftQK's TPOT is, in the order of the printed table."""
    point = lambda r: (r["model"], r["tp"], r["context"], r["batch"])  # noqa: E731
    swift = {point(r): r["tpot_ms"] for r in rows if r["method"] == "swiftqk"}
    return [(r, 100 * (1 - swift[point(r)] / r["tpot_ms"]))
            for r in sorted(rows, key=lambda r: (*point(r), r["method"]))
            if r["method"] != "swiftqk" and point(r) in swift]


def reduction_summary(rows):
    """Lines 'TP t, against M: a% to b% lower over n points (model a-b%, ...)': how much lower
    SwiftQK's TPOT is than method M's, over the points where both ran."""
    red = defaultdict(lambda: defaultdict(list))  # (tp, method) -> model -> reductions
    for r, pct in reductions(rows):
        red[(r["tp"], r["method"])][r["model"]].append(pct)
    lines = []
    for (tp, method), per_model in sorted(red.items()):
        every = [v for vs in per_model.values() for v in vs]
        models = ", ".join(f"{m} {min(v):.1f} to {max(v):.1f}%"
                           for m, v in sorted(per_model.items()))
        lines.append(f"TP {tp}, against {method}: SwiftQK's TPOT {min(every):.1f}% to "
                     f"{max(every):.1f}% lower over {len(every)} points ({models})")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("json", nargs="+")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for f in args.json for r in json.load(open(f))]
    panels = sorted({(r["model"], r["tp"], r["context"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (model, tp, ctx) in zip(axes[0], panels):
        lines = defaultdict(list)
        for r in rows:
            if (r["model"], r["tp"], r["context"]) == (model, tp, ctx):
                lines[r["method"]].append((r["batch"], r["tpot_ms"]))
        for method, pts in sorted(lines.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=method)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{model}, TP {tp}, context {ctx}", fontsize=9)
        ax.set_xlabel("batch")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("TPOT (ms), median of graph replays")
    axes[0][-1].legend(fontsize=7)
    layers = rows[0].get("layers", "?") if rows else "?"
    fig.suptitle(f"Decode step with layerwise QK-norm ({layers} layers, random weights)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    print("| model | TP | context | batch | method | TPOT ms | SwiftQK's TPOT lower by |")
    print("|---|---:|---:|---:|---|---:|---:|")
    for r, pct in reductions(rows):
        print(f"| {r['model']} | {r['tp']} | {r['context']} | {r['batch']} | {r['method']} | "
              f"{r['tpot_ms']:.3f} | {pct:.1f}% |")
    print()
    for line in reduction_summary(rows):
        print(line)


if __name__ == "__main__":
    main()
