"""bench/transformers_tp.py, the end-to-end comparison of transformers' own TP plan with
SwiftQK's, on CPU: TP 2 as two gloo processes under torch.distributed.run, a tiny random model
(fp32, the torch methods). It must write a row per variant and batch, find the rewritten model's
logits equal to the stock plan's within fp32 rounding, and fail (exit 1, naming the variant) when
a norm weight is wrong. Skips without torch, transformers, accelerate (tp_plan needs it) or the
built extension."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed here")
pytest.importorskip("transformers", reason="transformers is not installed here")
pytest.importorskip("accelerate", reason="accelerate is not installed here (tp_plan needs it)")

from conftest import swiftqk_or_skip  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

# fp32 on both sides: the rewritten model sums in other orders (the fused QKV GEMM, the norm over
# shards, o_proj's all-reduce), a few fp32 ulps (2^-24) each; 1e-5 of the logits' RMS leaves
# over 100 ulps of room, and a doubled norm weight moves them by far more.
FP32_TOL = 1e-5


def _run(tmp_path, *extra):
    swiftqk_or_skip()
    out = tmp_path / "out.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(ROOT, "bench", "transformers_tp.py"), "--device", "cpu", "--model",
           "tiny", "--layers", "2", "--batch", "1,2", "--prompt", "8", "--steps", "2", "--iters",
           "1", "--methods", "minimax_eager,all_gather", "--workdir", str(tmp_path / "ckpt"),
           "--json", str(out), *extra]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    return p, out


def test_tp2_on_cpu_writes_every_row_and_agrees(tmp_path):
    p, out = _run(tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["variant"], r["batch"]) for r in rows] == [
        (v, b) for v in ("stock", "minimax_eager", "all_gather") for b in (1, 2)]
    for r in rows:
        assert r["tp"] == 2 and r["prefill_ms"] > 0 and r["tpot_ms"] > 0, r
        if r["variant"] != "stock":
            assert r["agrees"] and r["rel_rms_vs_stock"] <= FP32_TOL, r
            assert r["argmax_agree"] == 1.0, r
    assert "tiny, 2 layers, TP 2" in p.stdout


def test_a_wrong_norm_weight_fails_the_run(tmp_path):
    p, out = _run(tmp_path, "--corrupt-norm")
    assert p.returncode != 0
    assert "DISAGREES: minimax_eager batch 1" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert all(not r["agrees"] for r in rows if r["variant"] != "stock"), rows
