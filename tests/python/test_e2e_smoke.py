"""The decode harness runs end to end (CPU, tiny shapes, torch methods; on a GPU, the swiftqk
method with and without the fused epilogue) and reports sane rows."""

import json
import os
import subprocess
import sys

import pytest

HARNESS = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "e2e_decode.py")


def test_decode_harness_cpu_smoke(tmp_path):
    pytest.importorskip("torch")
    from conftest import swiftqk_or_skip

    swiftqk_or_skip()  # the harness builds its layers on swiftqk.tp_attention
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


def test_decode_harness_fused_epilogue_gpu(tmp_path):
    pytest.importorskip("torch")
    from conftest import cuda_or_skip, swiftqk_or_skip

    swiftqk_or_skip()
    cuda_or_skip()
    rows = {}
    for flags in ([], ["--fused-epilogue"]):
        out = tmp_path / f"e2e{len(rows)}.json"
        subprocess.run([sys.executable, HARNESS, "--model", "tiny", "--layers", "2", "--batch",
                        "1,4", "--context", "64", "--iters", "5", "--methods", "swiftqk",
                        "--json", str(out)] + flags, check=True, timeout=300)
        rows.update({(r["method"], r["batch"]): r for r in json.loads(out.read_text())})
    assert set(rows) == {(m, b) for m in ("swiftqk", "swiftqk_epilogue") for b in (1, 4)}
    for r in rows.values():
        assert 0 < r["tpot_ms"] <= r["p99_ms"] and r["tokens_per_s"] > 0
