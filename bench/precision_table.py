#!/usr/bin/env python3
"""The precision study (the paper's Fig. 2(b)) from swiftqk_bench JSON: per input dtype and
method, the max abs, mean abs and RMSE of the outputs against the float64 reference on the
same inputs, and whether SwiftQK is no worse than All-Gather on matching configurations.

    python3 bench/precision_table.py results/X.json [...]

Inputs (tests/support/problem.cpp): normal values, each row scaled by 10^u with u uniform in
[-1, 1) (never zeros); weights uniform in [0.25, 2); fp8-e4m3 inputs are the same values
divided by a per-tensor scale amax/448 and cast with saturation, the reference using the
dequantised values.
"""
import argparse
import json
import math
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("json", nargs="+")
    args = ap.parse_args()
    rows = [r for f in args.json for r in json.load(open(f))]
    groups = defaultdict(list)
    for r in rows:
        groups[(r["dtype"], r["method"])].append(r)
    print("| input dtype | method | configs | max abs | mean abs | RMSE |")
    print("|---|---|---:|---:|---:|---:|")
    for (dt, m), rs in sorted(groups.items()):
        mx = max(r["max_abs_err"] for r in rs)
        mean = sum(r["mean_abs_err"] for r in rs) / len(rs)
        rmse = math.sqrt(sum(r["rmse"] ** 2 for r in rs) / len(rs))
        print(f"| {dt} | {m} | {len(rs)} | {mx:.2e} | {mean:.2e} | {rmse:.2e} |")
    # SwiftQK against All-Gather on the same configuration (same inputs by construction).
    key = lambda r: (r["model"], r["tokens"], r["dtype"], r["tp"], r["order"])  # noqa: E731
    ag = {key(r): r for r in rows if r["method"] == "all_gather"}
    worse = [(key(r), r["rmse"], ag[key(r)]["rmse"]) for r in rows
             if r["method"] == "swiftqk" and key(r) in ag and r["rmse"] > ag[key(r)]["rmse"] * 1.01]
    compared = sum(1 for r in rows if r["method"] == "swiftqk" and key(r) in ag)
    print(f"\nSwiftQK vs All-Gather on {compared} matching configurations: "
          f"{'no worse (RMSE within 1%) everywhere' if not worse else f'worse at {worse}'}")
    return 1 if worse else 0


if __name__ == "__main__":
    raise SystemExit(main())
