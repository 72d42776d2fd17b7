"""The decode harness runs end to end (CPU, tiny shapes, torch methods) and reports sane rows."""

import json
import os
import subprocess
import sys

import pytest

HARNESS = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "e2e_decode.py")


def test_decode_harness_cpu_smoke(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "e2e.json"
    subprocess.run([sys.executable, HARNESS, "--device", "cpu", "--model", "tiny", "--layers", "1",
                    "--batch", "1,2", "--context", "8", "--iters", "3",
                    "--methods", "all_gather,minimax_eager,plain", "--json", str(out)],
                   check=True, timeout=300)
    rows = json.loads(out.read_text())
    assert {(r["method"], r["batch"]) for r in rows} == {
        (m, b) for m in ("all_gather", "minimax_eager", "plain") for b in (1, 2)}
    for r in rows:
        assert 0 < r["tpot_ms"] <= r["p99_ms"] and r["tokens_per_s"] > 0
