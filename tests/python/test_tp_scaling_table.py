"""bench/tp_scaling_table.py counts the virtual-rank scaling targets from benchmark JSON: checked
on synthetic runs whose ratios and small-token excesses are known, at and just past each
threshold."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import tp_scaling_table  # noqa: E402


def row(model, tokens, tp, us, wrong=0, method="swiftqk"):
    return dict(model=model, tokens=tokens, tp=tp, median_us=us, wrong=wrong, method=method)


def write(tmp_path, name, rows):
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(rows))
    return str(p)


def test_counts_each_target_at_and_past_its_threshold(tmp_path, capsys):
    rows = [
        row("a", 4096, 1, 20.0), row("a", 4096, 2, 23.0), row("a", 4096, 4, 23.2),  # 1.15, 1.16
        row("a", 64, 1, 3.0), row("a", 64, 2, 5.0), row("a", 64, 4, 5.1),  # +2.0, +2.1
        row("b", 4096, 2, 30.0),  # no TP 1 in this run: shown, not counted
        row("a", 4096, 8, 1.0, method="all_gather"),  # another method: ignored
    ]
    tp_scaling_table.main([f"x={write(tmp_path, 'r', rows)}"])
    out = capsys.readouterr().out
    assert "x: at most 1.15x TP 1 at 4096 tokens: 1 of 2" in out
    assert "at most TP 1 + 2.0 us at <= 64 tokens: 1 of 2 (worst +2.10 us)" in out
    assert "misses: a TP 4 at 4096 tokens: 1.160x" in out
    assert "misses: a TP 4 at 64 tokens: +2.10 us" in out
    assert "| b | 4096 | 2 | 30.00 |" in out
    assert "all_gather" not in out and "| a | 4096 | 8 |" not in out


def test_runs_are_compared_with_their_own_tp1_and_wrong_results_are_flagged(tmp_path, capsys):
    fast = write(tmp_path, "fast", [row("m", 4096, 1, 10.0), row("m", 4096, 2, 11.0)])
    slow = write(tmp_path, "slow", [row("m", 4096, 1, 20.0), row("m", 4096, 2, 25.0, wrong=3)])
    tp_scaling_table.main([fast, slow])
    out = capsys.readouterr().out
    assert "| m | 4096 | 2 | 11.00 (1.100) | 25.00 (1.250) |" in out
    assert "fast: at most 1.15x TP 1 at 4096 tokens: 1 of 1" in out
    assert "slow: at most 1.15x TP 1 at 4096 tokens: 0 of 1" in out
    assert "3 WRONG results" in out and "wrong results per run: fast=0, slow=3" in out


def test_summary_prints_the_counts_without_the_table(tmp_path, capsys):
    run = write(tmp_path, "r", [row("m", 4096, 1, 10.0), row("m", 4096, 2, 12.0)])
    tp_scaling_table.main(["--summary", f"virtual ranks={run}"])
    out = capsys.readouterr().out
    assert "| m |" not in out
    assert out.startswith("virtual ranks: at most 1.15x TP 1 at 4096 tokens: 0 of 1")
    assert "misses: m TP 2 at 4096 tokens: 1.200x" in out
