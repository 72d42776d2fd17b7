#!/usr/bin/env python3
"""Draws latency against tokens, one panel per model, one line per (method, TP), from the JSON
that swiftqk_bench and torch_rms_norm.py write (like the paper's Fig. 2(a)).

    python3 bench/plot_results.py results/latest.json [B.json ...] --out results/latency.png

Any such JSON plots: graph or eager mode or both, one method or several, one TP or several, one
model or several. Where rows differ in mode, dtype, PDL, norm order, GPU count or input file, the
legend names what differs. Colour follows the method, line style and marker the TP; eager lines
have hollow markers. Needs matplotlib (pip install 'swiftqk[bench]').
"""
import argparse
import json
import os
import sys
from collections import defaultdict

# What else can tell two series of one (method, TP) apart, and how the legend names it.
VARIANTS = (
    ("mode", lambda v: str(v)),
    ("dtype", lambda v: str(v)),
    ("pdl", lambda v: "PDL" if v else "no PDL"),
    ("order", lambda v: f"{v} order"),
    ("gpus", lambda v: f"{v} GPU" + ("s" if v != 1 else "")),
    ("source", lambda v: str(v)),
)
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (1, 1)))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def load_rows(paths):
    """The rows with a latency to plot (soak rows and rows without tokens are left out), each
    tagged with the file it came from."""
    rows = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        if isinstance(data, dict):  # a single row
            data = [data]
        for r in data:
            if not isinstance(r, dict) or "median_us" not in r or "tokens" not in r:
                continue
            rows.append(dict(r, source=os.path.splitext(os.path.basename(path))[0]))
    return rows


def series(rows, mode=None):
    """{model: {key: [(tokens, median_us), ...]}} with key (method, tp, variants) and the list
    of variant fields that differ between rows (the ones the legend must name)."""
    if mode is not None:
        rows = [r for r in rows if r.get("mode", "graph") == mode]
    # Token count 0 (a no-op call) has no place on a log axis.
    rows = [r for r in rows if r["tokens"] > 0]
    # A field the legend names: one whose values differ (rows without it, e.g. the PyTorch
    # baseline's, do not count), and the input file only where two files hold the same series.
    varying = [name for name, _ in VARIANTS if name != "source"
               and len({r.get(name) for r in rows if r.get(name) is not None}) > 1]
    point = lambda r: (r.get("model"), r.get("method"), r.get("tp"), r["tokens"],  # noqa: E731
                       *(r.get(v) for v in varying))
    sources = defaultdict(set)
    for r in rows:
        sources[point(r)].add(r["source"])
    if any(len(s) > 1 for s in sources.values()):
        varying.append("source")
    out = defaultdict(lambda: defaultdict(list))
    for r in rows:
        key = (r.get("method", "?"), r.get("tp", 1), tuple(r.get(v) for v in varying))
        out[r.get("model", "?")][key].append((r["tokens"], r["median_us"]))
    for lines in out.values():
        for pts in lines.values():
            pts.sort()
    return out, varying


def label_of(key, varying):
    method, tp, values = key
    words = [method if str(method).startswith("torch") else f"{method} TP{tp}"]
    fmt = dict(VARIANTS)
    words += [fmt[name](v) for name, v in zip(varying, values) if v is not None]
    return ", ".join(words)


def plot(rows, out, mode=None):
    """Writes the figure to `out`; returns the legend's labels in order."""
    try:
        import matplotlib
    except ImportError:
        sys.exit("plot_results.py needs matplotlib: pip install 'swiftqk[bench]' "
                 "(or pip install matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    by_model, varying = series(rows, mode)
    if not by_model:
        sys.exit("plot_results.py: no rows with a latency and a positive token count"
                 + (f" in mode {mode}" if mode else ""))
    models = sorted(by_model)
    keys = sorted({k for lines in by_model.values() for k in lines}, key=str)
    methods = sorted({k[0] for k in keys}, key=str)
    tps = sorted({k[1] for k in keys})
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {m: colours[i % len(colours)] for i, m in enumerate(methods)}
    style = {tp: (LINESTYLES[i % len(LINESTYLES)], MARKERS[i % len(MARKERS)])
             for i, tp in enumerate(tps)}

    n_labels = len(keys)
    ncol = min(n_labels, max(1, 2 * len(models)), 6)
    legend_rows = -(-n_labels // ncol)
    fig, axes = plt.subplots(1, len(models), squeeze=False,
                             figsize=(4.2 * len(models) + 0.6, 3.6 + 0.22 * legend_rows))
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    handles = {}
    for ax, model in zip(axes[0], models):
        for key in keys:
            pts = by_model[model].get(key)
            if not pts:
                continue
            method, tp, values = key
            eager = "mode" in varying and values[varying.index("mode")] == "eager"
            linestyle, marker = style[tp]
            (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colour[method],
                              linestyle=linestyle, marker=marker, ms=4, lw=1.0 if eager else 1.5,
                              markerfacecolor="none" if eager else colour[method],
                              label=label_of(key, varying))
            handles.setdefault(line.get_label(), line)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(plain)
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(model)
        ax.set_xlabel("tokens")
        ax.grid(True, which="both", alpha=0.3)
    shown = mode or "/".join(sorted({r.get("mode", "graph") for r in rows}))
    axes[0][0].set_ylabel(f"median latency per call (us), {shown}")
    labels = list(handles)
    # One legend for all panels, below them, so that it covers no line.
    fig.legend([handles[k] for k in labels], labels, loc="lower center", ncol=ncol, fontsize=8,
               frameon=False)
    device = next((r["device"] for r in rows if r.get("device")), "")
    gpus = max((r.get("gpus", 1) for r in rows), default=1)
    how = (f"one process per GPU, {gpus} GPUs" if gpus > 1
           else "TP > 1: virtual ranks on one GPU" if any(r.get("tp", 1) > 1 for r in rows)
           else "TP 1")
    fig.suptitle(f"QK-norm latency, {device} ({how})" if device else f"QK-norm latency ({how})",
                 fontsize=10)
    height = 3.6 + 0.22 * legend_rows
    fig.tight_layout(rect=(0, min(0.5, (0.22 * legend_rows + 0.15) / height), 1, 0.95))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return labels


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="swiftqk_bench or torch_rms_norm.py JSON files")
    ap.add_argument("--out", required=True, help="image to write (PNG, SVG or PDF)")
    ap.add_argument("--mode", choices=("graph", "eager"), default=None,
                    help="plot only this mode (default: every mode in the files)")
    args = ap.parse_args(argv)
    labels = plot(load_rows(args.json), args.out, args.mode)
    print(f"wrote {args.out} ({len(labels)} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
