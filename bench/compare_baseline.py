#!/usr/bin/env python3
"""A new run against the baseline of its device kind (bench/baselines/h200.json, the rows behind
docs/performance.md): per configuration, the baseline's time, the new one and their ratio
(new / baseline: above 1 is slower), then the range and geometric mean of the ratios.

    python3 bench/compare_baseline.py results/tp.json [more.json ...]
        [--baseline bench/baselines/h200.json] [--set virtual_ranks] [--max-ratio 1.03]
    python3 bench/compare_baseline.py --dump tp2_two_gpus >results/base_tp2.json

A configuration is (method, model, dtype, mode, TP, GPUs, tokens) for the rows swiftqk_bench and
torch_rms_norm.py write, and (method, model, TP, batch, context, layers) for e2e_decode.py's; the
times compared are median_us, or tpot_ms for decode rows. A key the baseline file leaves out of a
row has the value in its "defaults". A configuration in several sets is compared with each (the
set is named in the first column); rows of the new run that no set holds are counted, not
compared. The exit code is 1 if a new row has wrong results or, with --max-ratio, if any ratio is
above it; 2 if no configuration of the new run is in the baseline.

--dump prints one set's rows as the benchmark JSON that the other scripts of bench/ read
(ratio_table.py, tp_scaling_table.py, precision_table.py, plot_results.py, plot_e2e.py), so the
tables of docs/performance.md can be printed again from the baseline itself.

The baseline file is replaced whole when a claim is measured again, never appended to.
"""
import argparse
import json
import math
import os
import sys

DEFAULT_BASELINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "baselines",
                                "h200.json")
KEY = ("method", "model", "dtype", "mode", "tp", "gpus", "tokens", "batch", "context", "layers")
METRICS = (("median_us", "us"), ("tpot_ms", "ms"))


def load_baseline(path):
    doc = json.load(open(path))
    defaults = doc.get("defaults", {})
    sets = {}
    for name, s in doc["sets"].items():
        sets[name] = dict(s, rows=[{**defaults, **r} for r in s["rows"]])
    return defaults, sets


def key(row, defaults):
    return tuple(row.get(k, defaults.get(k)) for k in KEY)


def metric(row):
    for name, unit in METRICS:
        if name in row:
            return name, unit
    return None, None


def point(row):
    if row.get("tokens") is not None:
        return str(row["tokens"])
    return f"batch {row.get('batch')}, context {row.get('context')}"


def compare(new_rows, defaults, sets, max_ratio=None, out=None):
    """Prints the table and the summary (to stdout unless told); returns the exit code."""
    out = out or sys.stdout
    base = {}  # key -> [(set name, row)]
    for name, s in sets.items():
        for r in s["rows"]:
            if metric(r)[0]:
                base.setdefault(key(r, defaults), []).append((name, r))
    print("| set | method | model | dtype | tp | gpus | tokens | baseline | new | new / baseline |",
          file=out)
    print("|---|---|---|---|---:|---:|---|---:|---:|---:|", file=out)
    ratios, unmatched, wrong, above = [], 0, 0, 0
    for r in new_rows:
        r = {**defaults, **r}
        name, unit = metric(r)
        matches = base.get(key(r, defaults), []) if name else []
        if not matches:
            unmatched += 1
            continue
        bad = int(r.get("wrong", 0))
        wrong += bad > 0
        for set_name, b in matches:
            if name not in b:
                continue
            ratio = r[name] / b[name]
            ratios.append(ratio)
            flag = ""
            if max_ratio is not None and ratio > max_ratio:
                above += 1
                flag = " SLOWER"
            if bad:
                flag += f" {bad} WRONG"
            print(f"| {set_name} | {r['method']} | {r['model']} | {r['dtype']} | {r['tp']} | "
                  f"{r['gpus']} | {point(r)} | {b[name]:.2f} {unit} | {r[name]:.2f} {unit} | "
                  f"{ratio:.3f}{flag} |", file=out)
    print(file=out)
    if not ratios:
        print(f"no configuration of the new run is in the baseline ({unmatched} rows)", file=out)
        return 2
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    line = (f"{len(ratios)} comparisons: new / baseline {min(ratios):.3f} to {max(ratios):.3f}, "
            f"geometric mean {geo:.3f}")
    if max_ratio is not None:
        line += f"; above {max_ratio}: {above}"
    print(line, file=out)
    if unmatched:
        print(f"{unmatched} rows of the new run have no baseline row", file=out)
    if wrong:
        print(f"{wrong} rows of the new run have WRONG results", file=out)
    return 1 if wrong or above else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("json", nargs="*", help="benchmark JSON of the new run")
    ap.add_argument("--baseline", default=DEFAULT_BASELINE)
    ap.add_argument("--set", default="", help="compare with these sets only (comma separated)")
    ap.add_argument("--max-ratio", type=float, default=None,
                    help="exit 1 if a configuration's new / baseline is above this")
    ap.add_argument("--dump", metavar="SET", default="",
                    help="print this set's rows as benchmark JSON instead")
    args = ap.parse_args(argv)
    defaults, sets = load_baseline(args.baseline)
    if args.dump:
        if args.dump not in sets:
            ap.error(f"no set '{args.dump}' in {args.baseline} (sets: {', '.join(sets)})")
        s = sets[args.dump]
        json.dump([dict(r, commit=s["commit"]) for r in s["rows"]], sys.stdout, indent=1)
        print()
        return 0
    if not args.json:
        ap.error("give the new run's JSON (or --dump SET)")
    if args.set:
        wanted = args.set.split(",")
        missing = [n for n in wanted if n not in sets]
        if missing:
            ap.error(f"no set {', '.join(missing)} in {args.baseline} (sets: {', '.join(sets)})")
        sets = {n: sets[n] for n in wanted}
    rows = [r for f in args.json for r in json.load(open(f))]
    return compare(rows, defaults, sets, args.max_ratio)


if __name__ == "__main__":
    sys.exit(main())
