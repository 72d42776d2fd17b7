"""bench/plot_e2e.py's summary of the decode runs: how much lower SwiftQK's TPOT is than each
method's, per TP, over the points where both ran, with each model's range; checked on synthetic
rows whose reductions are known (no plotting: the summary needs no matplotlib)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import plot_e2e  # noqa: E402


def row(model, tp, batch, method, tpot_ms, context=512):
    return dict(model=model, tp=tp, context=context, batch=batch, method=method, tpot_ms=tpot_ms)


def test_ranges_per_tp_and_method_over_the_points_both_ran():
    rows = [
        row("a", 2, 1, "swiftqk", 0.8), row("a", 2, 1, "all_gather", 1.0),  # 20.0% lower
        row("a", 2, 32, "swiftqk", 0.9), row("a", 2, 32, "all_gather", 1.0),  # 10.0%
        row("b", 2, 1, "swiftqk", 1.0), row("b", 2, 1, "all_gather", 1.25),  # 20.0%
        row("b", 2, 1, "minimax_fused", 0.99),  # SwiftQK 1.0% slower: a negative reduction
        row("a", 4, 1, "swiftqk", 0.5), row("a", 4, 1, "all_gather", 2.0),  # 75.0%, TP 4 apart
        row("a", 2, 256, "all_gather", 5.0),  # no SwiftQK at this point: not counted
    ]
    assert plot_e2e.reduction_summary(rows) == [
        "TP 2, against all_gather: SwiftQK's TPOT 10.0% to 20.0% lower over 3 points "
        "(a 10.0 to 20.0%, b 20.0 to 20.0%)",
        "TP 2, against minimax_fused: SwiftQK's TPOT -1.0% to -1.0% lower over 1 points "
        "(b -1.0 to -1.0%)",
        "TP 4, against all_gather: SwiftQK's TPOT 75.0% to 75.0% lower over 1 points "
        "(a 75.0 to 75.0%)",
    ]
