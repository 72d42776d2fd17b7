"""The decode harness runs end to end (CPU, tiny shapes, torch methods, TP 1 and TP 2 as gloo
processes; on a GPU, the swiftqk method with and without the fused epilogue), checks every
configuration against float64 before timing it, and fails the run when the check fails (its
negative control doubles a norm weight)."""

import json
import os
import subprocess
import sys

import pytest

HARNESS = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "e2e_decode.py")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TINY = ["--device", "cpu", "--model", "tiny", "--layers", "1", "--context", "8", "--iters", "2"]


def _assert_checked(r):
    """A timed row says its check passed, within the fp32 or bf16 bound the harness states."""
    assert r["checked"] and 0 <= r["max_rel_err"] <= r["tolerance"], r
    assert r["tolerance"] < 0.04, r  # 8 units of bf16 rounding at most


def _tp2(tmp_path, *extra):
    """The harness at TP 2 on CPU: two gloo processes under torch.distributed.run."""
    out = tmp_path / "tp2.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           HARNESS, *TINY, "--batch", "1,3", "--methods", "all_gather,minimax_eager",
           "--json", str(out), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600), out


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
        _assert_checked(r)


def test_decode_harness_tp2_cpu_checks_each_ranks_heads(tmp_path):
    pytest.importorskip("torch")
    from conftest import swiftqk_or_skip

    swiftqk_or_skip()
    p, out = _tp2(tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert {(r["method"], r["batch"], r["tp"]) for r in rows} == {
        (m, b, 2) for m in ("all_gather", "minimax_eager") for b in (1, 3)}
    for r in rows:
        _assert_checked(r)


def test_a_wrong_norm_weight_fails_the_check_and_is_not_timed(tmp_path):
    pytest.importorskip("torch")
    from conftest import swiftqk_or_skip

    swiftqk_or_skip()
    out = tmp_path / "bad.json"
    p = subprocess.run([sys.executable, HARNESS, *TINY, "--batch", "2", "--methods",
                        "all_gather,plain", "--json", str(out), "--corrupt-norm"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    assert "2 of 2 configurations failed the check" in p.stdout, p.stdout[-3000:]
    rows = json.loads(out.read_text())
    assert len(rows) == 2
    for r in rows:
        assert not r["checked"] and r["max_rel_err"] > r["tolerance"] and "tpot_ms" not in r, r
    # At TP 2 only rank 0's shard is doubled; rank 1's heads are right, and the run still fails.
    p, out = _tp2(tmp_path, "--corrupt-norm")
    assert p.returncode != 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert all(not r["checked"] for r in json.loads(out.read_text()))


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
        _assert_checked(r)
