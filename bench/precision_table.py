#!/usr/bin/env python3
"""The precision study (the paper's Fig. 2(b)) from swiftqk_bench JSON and, beside it, the rows
of bench/precision_study.py (independent paths: torch_rms_norm, hf_rmsnorm): per input dtype and
method, the max abs, mean abs and RMSE of the outputs against the float64 reference, and whether
SwiftQK is no worse than All-Gather on matching configurations.

    python3 bench/precision_table.py results/X.json [results/precision_study.json ...]

Inputs (tests/support/problem.cpp): normal values, each row scaled by 10^u with u uniform in
[-1, 1) (never zeros); weights uniform in [0.25, 2); fp8-e4m3 inputs are the same values
divided by a per-tensor scale amax/448 and cast with saturation. precision_study.py draws the
same distribution with torch's generator: other values.

Two references for fp8 rows. max abs, mean abs and RMSE are against the float64 output of the
dequantised inputs: the method's own error. The e2e columns, printed when some row has them
(max_abs_err_e2e, mean_abs_err_e2e, rmse_e2e: fp8 rows only), are against the float64 output of
the values before quantisation: what fp8 costs end to end, the quantisation included, as the
paper reports it. Other dtypes have no e2e figures: their stored values are the inputs.

Per group, max abs is the largest over the configurations, mean abs their mean and RMSE the root
of their mean square. SwiftQK and All-Gather match by (model, tokens, dtype, tp, order): the same
inputs. Against an independent path they match by (model, tokens, dtype), other draws of the same
distribution, so only the pooled figures compare.
"""
import argparse
import json
import math
from collections import defaultdict

E2E = "_e2e"
INDEPENDENT = ("torch_rms_norm", "hf_rmsnorm")  # the methods of precision_study.py


def pooled(rows, suffix=""):
    """(max abs, mean abs, RMSE) of rows, each one configuration."""
    mx = max(r["max_abs_err" + suffix] for r in rows)
    mean = sum(r["mean_abs_err" + suffix] for r in rows) / len(rows)
    rmse = math.sqrt(sum(r["rmse" + suffix] ** 2 for r in rows) / len(rows))
    return mx, mean, rmse


def cells(figures):
    return " | ".join(f"{v:.2e}" for v in figures)


def table(rows):
    """The Markdown table, a line a string, and after it a note on any group whose rows carry the
    e2e figures only in part (JSON written before they existed)."""
    groups = defaultdict(list)
    for r in rows:
        groups[(r["dtype"], r["method"])].append(r)
    e2e = any("rmse" + E2E in r for r in rows)
    head = "| input dtype | method | configs | max abs | mean abs | RMSE |"
    rule = "|---|---|---:|---:|---:|---:|"
    if e2e:
        head += " max abs e2e | mean abs e2e | RMSE e2e |"
        rule += "---:|---:|---:|"
    lines, partial = [head, rule], []
    for (dt, m), rs in sorted(groups.items()):
        line = f"| {dt} | {m} | {len(rs)} | {cells(pooled(rs))} |"
        if e2e:
            with_e2e = [r for r in rs if "rmse" + E2E in r]
            line += f" {cells(pooled(with_e2e, E2E))} |" if with_e2e else " - | - | - |"
            if with_e2e and len(with_e2e) < len(rs):
                partial.append(f"{dt} {m}: e2e over {len(with_e2e)} of {len(rs)} configurations")
        lines.append(line)
    if partial:
        lines += ["", "Rows without e2e figures (JSON that predates them): " + "; ".join(partial)]
    return lines


def independent_lines(rows):
    """SwiftQK's pooled RMSE against each independent path's, per dtype, on the (model, tokens)
    that both have."""
    out = []
    for m in INDEPENDENT:
        for dt in sorted({r["dtype"] for r in rows if r["method"] == m}):
            ind = [r for r in rows if r["method"] == m and r["dtype"] == dt]
            ours = [r for r in rows if r["method"] == "swiftqk" and r["dtype"] == dt]
            both = {(r["model"], r["tokens"]) for r in ind} & {(r["model"], r["tokens"])
                                                              for r in ours}
            if not both:
                continue
            ind = [r for r in ind if (r["model"], r["tokens"]) in both]
            ours = [r for r in ours if (r["model"], r["tokens"]) in both]
            text = []
            for suffix in ("", E2E):
                if all("rmse" + suffix in r for r in ind + ours):
                    a, b = pooled(ours, suffix)[2], pooled(ind, suffix)[2]
                    text.append(f"RMSE{suffix.replace('_', ' ')} {a:.2e} vs {b:.2e} "
                                f"(ratio {a / b:.2f})")
            out.append(f"SwiftQK vs {m}, {dt}, on {len(both)} (model, tokens) both have: "
                       + "; ".join(text) + " (other draws of the same distribution)")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("json", nargs="+")
    args = ap.parse_args(argv)
    rows = [r for f in args.json for r in json.load(open(f))]
    print("\n".join(table(rows)))
    # SwiftQK against All-Gather on the same configuration (same inputs by construction).
    key = lambda r: (r["model"], r["tokens"], r["dtype"], r["tp"], r["order"])  # noqa: E731
    ag = {key(r): r for r in rows if r["method"] == "all_gather"}
    worse = [(key(r), r["rmse"], ag[key(r)]["rmse"]) for r in rows
             if r["method"] == "swiftqk" and key(r) in ag and r["rmse"] > ag[key(r)]["rmse"] * 1.01]
    compared = sum(1 for r in rows if r["method"] == "swiftqk" and key(r) in ag)
    ind = independent_lines(rows)
    if ind:
        print()
        print("\n".join(ind))
    if compared:
        print(f"\nSwiftQK vs All-Gather on {compared} matching configurations: "
              f"{'no worse (RMSE within 1%) everywhere' if not worse else f'worse at {worse}'}")
    return 1 if worse else 0


if __name__ == "__main__":
    raise SystemExit(main())
