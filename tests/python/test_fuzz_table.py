"""bench/fuzz_table.py merges the parts of a split shape fuzz by (seed, point) and counts the
issue's targets: checked on synthetic runs whose ratios, excesses and bandwidth shares are
known, at and just past each threshold."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import fuzz_table  # noqa: E402


def pair(point, q, k, tp, tokens, tp1_us, tpn_us, copy=0.9, wrong=0, seed=1):
    base = dict(fuzz_seed=seed, fuzz_point=point, q_width=q, k_width=k, dtype="bf16",
                order="olmo2", tokens=tokens, method="swiftqk", wrong=wrong)
    return [dict(base, tp=1, median_us=tp1_us, frac_of_copy=copy),
            dict(base, tp=tp, median_us=tpn_us, frac_of_copy=copy / 2)]


def write(tmp_path, name, rows):
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(rows))
    return str(p)


def test_parts_merge_and_targets_count_at_and_past_each_threshold(tmp_path, capsys):
    part_a = (pair(0, 4096, 4096, 2, 4096, 10.0, 13.0, copy=0.85)  # 1.30x: met; 85%: met
              + pair(1, 4096, 4096, 4, 8192, 10.0, 13.1, copy=0.849)  # 1.31x: missed
              + pair(2, 1024, 4096, 8, 5000, 10.0, 30.0))  # 128 a rank: not counted
    part_b = (pair(3, 2048, 2048, 2, 64, 3.0, 4.5)  # +1.5 us: met
              + pair(4, 2048, 2048, 8, 1, 3.0, 4.51)  # +1.51 us: missed
              + pair(5, 2048, 2048, 2, 100, 3.0, 9.0)  # neither bucket
              + pair(6, 2048, 2048, 2, 64, 3.0, 4.0)[:1])  # its TP-N row is missing
    rc = fuzz_table.main([write(tmp_path, "a", part_a), write(tmp_path, "b", part_b)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "6 fuzz points with both rows (1 partial left out); wrong results: 0" in out
    assert ("TP N <= 1.3x TP 1 from 4096 tokens (rows >= 256 a rank) at 1 of 2; "
            "TP N <= TP 1 + 1.5 us at 64 tokens or fewer at 1 of 2; "
            "TP 1 >= 85.0% of copy from 4096 tokens at 2 of 3") in out
    # The worst ratio first, the 128-element rows included in the table though not counted.
    ratios = [line for line in out.splitlines() if line.startswith("| 3.00x")]
    assert ratios == ["| 3.00x | 10.00 | 30.00 | 1024 | 4096 | bf16 | olmo2 | 8 | 5000 |"]
    assert "| +1.51 us | 3.00 | 4.51 |" in out
    assert "| 84.9% | 10.00 |" in out


def test_wrong_results_fail_the_table(tmp_path, capsys):
    rc = fuzz_table.main([write(tmp_path, "w", pair(0, 4096, 4096, 2, 4096, 10, 11, wrong=3))])
    assert rc == 1
    assert "wrong results: 6" in capsys.readouterr().out


def test_other_rows_are_ignored(tmp_path, capsys):
    rows = pair(0, 4096, 4096, 2, 4096, 10, 11) + [dict(model="olmoe", tp=1, median_us=1.0)]
    assert fuzz_table.main([write(tmp_path, "m", rows)]) == 0
    assert "1 fuzz points with both rows (0 partial left out)" in capsys.readouterr().out


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
