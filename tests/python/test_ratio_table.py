"""bench/ratio_table.py: the reductions against each baseline, the targets met, and the points
where a target asks SwiftQK for less than its local-only time + half a round trip, checked on
synthetic runs whose figures are known, at and just past each threshold."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import ratio_table  # noqa: E402


def row(model, tokens, method, us, **floor):
    return dict(model=model, tp=2, tokens=tokens, dtype="bf16", mode="graph", method=method,
                median_us=us, **floor)


def floor(local, rtt, us):
    return dict(local_us=local, rtt_us=rtt, floor_ratio=us / (local + rtt))


def run(tmp_path, capsys, rows, *extra):
    p = tmp_path / "r.json"
    p.write_text(json.dumps(rows))
    ratio_table.main([str(p), "--target", "all_gather=0.85,minimax_fused=0.30", *extra])
    return capsys.readouterr().out


def test_targets_and_the_points_below_local_plus_half_a_round_trip(tmp_path, capsys):
    rows = [
        # local 2.5 + rtt 1.0 / 2 = 3.0. 30% off 4.2 asks for 2.94 (below); 85% off 30 asks for
        # 4.5 (not), and 1 - 4 / 30 = 86.7% meets it.
        row("a", 1, "swiftqk", 4.0, **floor(2.5, 1.0, 4.0)), row("a", 1, "minimax_fused", 4.2),
        row("a", 1, "all_gather", 30.0),
        # 30% off 5.0 asks for exactly 3.5 = 3.0 + 0.5: not below; 85% off 20 asks for 3.0 < 3.5.
        row("a", 64, "swiftqk", 4.5, **floor(3.0, 1.0, 4.5)), row("a", 64, "minimax_fused", 5.0),
        row("a", 64, "all_gather", 20.0),
        # SwiftQK (50) beats its own local-only run + half a round trip (52.5): not counted.
        row("a", 16384, "swiftqk", 50.0, **floor(52.0, 1.0, 50.0)),
        row("a", 16384, "minimax_fused", 80.0), row("a", 16384, "all_gather", 400.0),
    ]
    out = run(tmp_path, capsys, rows)
    assert "| a | 2 | 1 | 4.00 | 30.00 | 86.7% | 4.20 | 4.8% | 2.50 | 1.00 | 1.14 |" in out
    assert ("reduction vs all_gather: 77.5% to 87.5% over 3 points; target >= 85%: met at 2 of 3;"
            " it asks for less than local-only + half a round trip at 1 of the 2 points") in out
    assert ("reduction vs minimax_fused: 4.8% to 37.5% over 3 points; target >= 30%: met at 1 of "
            "3; it asks for less than local-only + half a round trip at 1 of the 2 points") in out
    assert "swiftqk / floor: 0.94 to 1.14; target <= 1.2: met at 3 of 3" in out


def test_without_a_floor_only_the_reductions_are_counted(tmp_path, capsys):
    rows = [row("b", 1, "swiftqk", 4.0), row("b", 1, "minimax_fused", 8.0),
            row("b", 1, "all_gather", 40.0)]
    out = run(tmp_path, capsys, rows)
    assert ("reduction vs minimax_fused: 50.0% to 50.0% over 1 points; target >= 30%: met at 1 "
            "of 1\n") in out
    assert "half a round trip" not in out and "local us" not in out and "swiftqk / floor" not in out
