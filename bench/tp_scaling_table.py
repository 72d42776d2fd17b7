#!/usr/bin/env python3
"""Virtual-rank scaling, side by side: for each run (swiftqk_bench JSON with --tp 1,...), the
median per (model, tokens, TP) and its ratio to TP 1 in the same run, then the scaling targets
counted per run: at --ratio-tokens tokens (default 4096) at most --max-ratio (1.15) times TP 1,
and at --small-tokens tokens or fewer (64) at most TP 1 + --max-extra-us (2 us).

    python3 bench/tp_scaling_table.py [NAME=]A.json [[NAME=]B.json ...] [--method swiftqk]

Runs are compared only with their own TP 1 (ratios of one run, never across runs); a point whose
TP 1 is missing from its run is shown without a ratio and not counted. A run with wrong results
(the benchmark's float64 check) is flagged in the header.
"""
import argparse
import json
import os
import sys


def load(spec, method):
    name, _, path = spec.rpartition("=")
    name = name or os.path.splitext(os.path.basename(path))[0]
    rows = [r for r in json.load(open(path)) if r.get("method") == method]
    points = {(r["model"], int(r["tokens"]), int(r["tp"])): float(r["median_us"]) for r in rows}
    wrong = sum(int(r.get("wrong", 0)) for r in rows)
    return name, points, wrong


def targets(points, ratio_tokens, max_ratio, small_tokens, max_extra_us):
    """Counts per run: (met, of) for the ratio target and for the small-token target, the worst
    small-token excess over TP 1, and the points that miss either target."""
    ratio_met = ratio_of = small_met = small_of = 0
    worst_extra = None
    misses = []
    for (model, tokens, tp), us in sorted(points.items()):
        base = points.get((model, tokens, 1))
        if tp == 1 or base is None:
            continue
        if tokens == ratio_tokens:
            ratio_of += 1
            if us / base <= max_ratio:
                ratio_met += 1
            else:
                misses.append(f"{model} TP {tp} at {tokens} tokens: {us / base:.3f}x")
        if tokens <= small_tokens:
            small_of += 1
            extra = us - base
            worst_extra = extra if worst_extra is None else max(worst_extra, extra)
            if extra <= max_extra_us:
                small_met += 1
            else:
                misses.append(f"{model} TP {tp} at {tokens} tokens: +{extra:.2f} us")
    return (ratio_met, ratio_of), (small_met, small_of), worst_extra, misses


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("runs", nargs="+", help="[NAME=]path.json")
    ap.add_argument("--method", default="swiftqk")
    ap.add_argument("--ratio-tokens", type=int, default=4096)
    ap.add_argument("--max-ratio", type=float, default=1.15)
    ap.add_argument("--small-tokens", type=int, default=64)
    ap.add_argument("--max-extra-us", type=float, default=2.0)
    ap.add_argument("--summary", action="store_true", help="only the counts, not the table")
    args = ap.parse_args(argv)

    runs = [load(spec, args.method) for spec in args.runs]
    keys = [] if args.summary else sorted({k for _, points, _ in runs for k in points})
    if not args.summary:
        print("median us (ratio to TP 1 of the same run); wrong results per run: " +
              ", ".join(f"{name}={wrong}" for name, _, wrong in runs))
        print("| model | tokens | tp | " + " | ".join(name for name, _, _ in runs) + " |")
        print("|---|---|---|" + "---|" * len(runs))
    for model, tokens, tp in keys:
        cells = []
        for _, points, _ in runs:
            us = points.get((model, tokens, tp))
            base = points.get((model, tokens, 1))
            if us is None:
                cells.append("-")
            elif tp == 1 or base is None:
                cells.append(f"{us:.2f}")
            else:
                cells.append(f"{us:.2f} ({us / base:.3f})")
        print(f"| {model} | {tokens} | {tp} | " + " | ".join(cells) + " |")
    if keys:
        print()
    for name, points, wrong in runs:
        (rm, ro), (sm, so), worst, misses = targets(points, args.ratio_tokens, args.max_ratio,
                                                     args.small_tokens, args.max_extra_us)
        line = (f"{name}: at most {args.max_ratio}x TP 1 at {args.ratio_tokens} tokens: {rm} of {ro}; "
                f"at most TP 1 + {args.max_extra_us} us at <= {args.small_tokens} tokens: {sm} of {so}")
        if worst is not None:
            line += f" (worst {worst:+.2f} us)"
        if wrong:
            line += f"; {wrong} WRONG results"
        print(line)
        for m in misses:
            print(f"  misses: {m}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
