#!/usr/bin/env python3
"""SwiftQK against the other methods, from swiftqk_bench JSON measured in one run: per model,
TP and token count, SwiftQK's median, each baseline's, and the latency reduction
1 - swiftqk / baseline (the paper's headline figures), plus SwiftQK's ratio to its floor
(local-only time + one NVLink round trip) where the run measured it (--procs on several GPUs).

    python3 bench/ratio_table.py results/X.json [--against all_gather,minimax_fused]
        [--target all_gather=0.85,minimax_fused=0.30] [--floor-target 1.2]

The last lines give the range of each reduction and how many points meet each target. Where
the floor was measured, each target's line also counts the points at which meeting it would take
SwiftQK under its local-only time plus half a round trip (one one-way signal, the least any
exchange between GPUs can add): there a faster exchange alone cannot meet it, only a faster
local kernel too. The local-only time is SwiftQK's own kernel on the shard, not a hardware bound,
so only points where SwiftQK takes at least that sum are counted (at large token counts it can
beat its own local-only run, which uses the layout of a rank alone).
"""
import argparse
import json
from collections import defaultdict


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("json", nargs="+")
    ap.add_argument("--against", default="all_gather,minimax_fused")
    ap.add_argument("--target", default="", help="method=min_reduction,... (e.g. all_gather=0.85)")
    ap.add_argument("--floor-target", type=float, default=1.2)
    args = ap.parse_args(argv)
    rows = [r for f in args.json for r in json.load(open(f))]
    against = [m for m in args.against.split(",") if m]
    targets = {k: float(v) for k, v in (t.split("=") for t in args.target.split(",") if t)}
    by = defaultdict(dict)
    for r in rows:
        by[(r["model"], r["tp"], r["tokens"], r["dtype"], r.get("mode", "graph"))][r["method"]] = r
    head = ["model", "tp", "tokens", "swiftqk us"]
    for m in against:
        head += [f"{m} us", f"reduction vs {m}"]
    has_floor = any("floor_ratio" in r for r in rows)
    if has_floor:
        head += ["local us", "round trip us", "swiftqk / floor"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    red = defaultdict(list)
    floors = []
    # Per target method: points with a measured floor, and those where the target asks for less
    # than SwiftQK's local-only time + half a round trip.
    bounded, below = defaultdict(int), defaultdict(int)
    for key in sorted(by, key=lambda k: (k[0], k[1], k[2])):
        g = by[key]
        if "swiftqk" not in g:
            continue
        s = g["swiftqk"]
        cells = [key[0], str(key[1]), str(key[2]), f"{s['median_us']:.2f}"]
        for m in against:
            if m in g:
                r = 1.0 - s["median_us"] / g[m]["median_us"]
                red[m].append(r)
                # Only where SwiftQK itself takes at least that sum: at large token counts it can
                # beat its own local-only run (another layout), and the sum bounds nothing there.
                bound = s["local_us"] + s["rtt_us"] / 2 if "local_us" in s and "rtt_us" in s else 0
                if m in targets and 0 < bound <= s["median_us"]:
                    bounded[m] += 1
                    below[m] += (1.0 - targets[m]) * g[m]["median_us"] < bound
                cells += [f"{g[m]['median_us']:.2f}", f"{100 * r:.1f}%"]
            else:
                cells += ["-", "-"]
        if has_floor:
            if "floor_ratio" in s:
                floors.append(s["floor_ratio"])
                cells += [f"{s['local_us']:.2f}", f"{s['rtt_us']:.2f}", f"{s['floor_ratio']:.2f}"]
            else:
                cells += ["-", "-", "-"]
        print("| " + " | ".join(cells) + " |")
    print()
    for m in against:
        v = red[m]
        if not v:
            continue
        line = f"reduction vs {m}: {100 * min(v):.1f}% to {100 * max(v):.1f}% over {len(v)} points"
        if m in targets:
            ok = sum(x >= targets[m] for x in v)
            line += f"; target >= {100 * targets[m]:.0f}%: met at {ok} of {len(v)}"
            if bounded[m]:
                line += (f"; it asks for less than local-only + half a round trip at {below[m]} of "
                         f"the {bounded[m]} points where SwiftQK takes at least that")
        print(line)
    if floors:
        ok = sum(x <= args.floor_target for x in floors)
        print(f"swiftqk / floor: {min(floors):.2f} to {max(floors):.2f}; target <= "
              f"{args.floor_target}: met at {ok} of {len(floors)}")


if __name__ == "__main__":
    main()
