#!/usr/bin/env python3
"""The shape fuzz's worst points from one or more swiftqk_bench JSON files (--fuzz-shapes, each
part of a split run made with --fuzz-first or --fuzz-tokens), merged by (seed, point), and the
issue's targets counted on them:
- TP N within --max-ratio (1.3) times its own TP 1 from 4096 tokens, on rows of at least 256
  elements a rank;
- TP N within TP 1 + --max-extra-us (1.5 us) at 64 tokens or fewer;
- TP 1 at --min-copy (85%) of the copy bandwidth or more from 4096 tokens.

    python3 bench/fuzz_table.py results/fuzz_a.json results/fuzz_b.json [--worst 10]

Prints markdown tables (the format of docs/performance.md, "Shape fuzz"). A point whose two
rows (TP 1, then its TP) are not both present is left out and counted; a run with wrong results
is named in the header and exits non-zero.
"""
import argparse
import json
import sys


def pairs_of(paths):
    rows = {}
    for path in paths:
        for r in json.load(open(path)):
            if "fuzz_point" not in r:
                continue
            rows.setdefault((int(r["fuzz_seed"]), int(r["fuzz_point"])), []).append(r)
    pairs, partial, wrong = [], 0, 0
    for key in sorted(rows):
        rs = rows[key]
        wrong += sum(int(r.get("wrong", 0)) for r in rs)
        tp1 = [r for r in rs if int(r["tp"]) == 1]
        tpn = [r for r in rs if int(r["tp"]) > 1]
        if not tp1 or not tpn:
            partial += 1
            continue
        a, b = tp1[-1], tpn[-1]
        pairs.append(dict(seed=key[0], point=key[1], q=int(a["q_width"]), k=int(a["k_width"]),
                          dtype=a["dtype"], order=a["order"], tp=int(b["tp"]),
                          tokens=int(a["tokens"]), tp1=float(a["median_us"]),
                          tpn=float(b["median_us"]), copy=100.0 * float(a["frac_of_copy"])))
    return pairs, partial, wrong


def row(p, value):
    return (f"| {value} | {p['tp1']:.2f} | {p['tpn']:.2f} | {p['q']} | {p['k']} | {p['dtype']} | "
            f"{p['order']} | {p['tp']} | {p['tokens']} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+")
    ap.add_argument("--worst", type=int, default=10)
    ap.add_argument("--max-ratio", type=float, default=1.3)
    ap.add_argument("--max-extra-us", type=float, default=1.5)
    ap.add_argument("--min-copy", type=float, default=85.0)
    a = ap.parse_args(argv)
    pairs, partial, wrong = pairs_of(a.json)
    print(f"{len(pairs)} fuzz points with both rows ({partial} partial left out); "
          f"wrong results: {wrong}")
    head = "| TP 1 (us) | TP N (us) | Q | K | dtype | order | TP | tokens |"
    rule = "|---:|---:|---:|---:|---:|---|---|---:|---:|"

    big = [p for p in pairs if p["tokens"] >= 4096]
    # The ratio target holds on rows of at least 256 elements a rank (both tensors).
    ratio_pts = [p for p in big if min(p["q"], p["k"]) // p["tp"] >= 256]
    small = [p for p in pairs if p["tokens"] <= 64]
    tables = [
        ("TP N / TP 1 from 4096 tokens", big, lambda p: p["tpn"] / p["tp1"], True,
         lambda v: f"{v:.2f}x"),
        ("TP N - TP 1 at 64 tokens or fewer", small, lambda p: p["tpn"] - p["tp1"], True,
         lambda v: f"+{v:.2f} us"),
    ]
    for title, pts, key, desc, fmt in tables:
        print(f"\n| worst: {title} " + head)
        print(rule)
        for p in sorted(pts, key=key, reverse=desc)[:a.worst]:
            print(row(p, fmt(key(p))))
    print("\n| worst: TP 1 share of copy bandwidth from 4096 tokens | TP 1 (us) | Q | K | dtype | "
          "order | tokens |")
    print("|---:|---:|---:|---:|---|---|---:|")
    for p in sorted(big, key=lambda p: p["copy"])[:a.worst]:
        print(f"| {p['copy']:.1f}% | {p['tp1']:.2f} | {p['q']} | {p['k']} | {p['dtype']} | "
              f"{p['order']} | {p['tokens']} |")

    met_ratio = sum(p["tpn"] / p["tp1"] <= a.max_ratio for p in ratio_pts)
    met_small = sum(p["tpn"] - p["tp1"] <= a.max_extra_us for p in small)
    met_copy = sum(p["copy"] >= a.min_copy for p in big)
    print(f"\ntargets: TP N <= {a.max_ratio}x TP 1 from 4096 tokens (rows >= 256 a rank) at "
          f"{met_ratio} of {len(ratio_pts)}; TP N <= TP 1 + {a.max_extra_us} us at 64 tokens or "
          f"fewer at {met_small} of {len(small)}; TP 1 >= {a.min_copy}% of copy from 4096 "
          f"tokens at {met_copy} of {len(big)}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
