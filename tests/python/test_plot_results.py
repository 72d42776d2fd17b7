"""bench/plot_results.py on synthetic benchmark JSON of every shape the benchmark writes: eager
only, one method, one TP, one model, soak rows and token count 0 mixed in, several files."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import plot_results  # noqa: E402

pytest.importorskip("matplotlib",
                    reason="matplotlib is not installed (pip install 'swiftqk[bench]')")


def row(method="swiftqk", model="olmo2-13b", tp=1, tokens=64, us=10.0, mode="graph", **extra):
    return dict(method=method, model=model, tp=tp, tokens=tokens, median_us=us, mode=mode,
                dtype="bf16", order="olmo2", pdl=False, gpus=1, device="NVIDIA H200", **extra)


def write(tmp_path, name, rows):
    path = tmp_path / name
    path.write_text(json.dumps(rows))
    return str(path)


def plot(tmp_path, *files, mode=None):
    out = str(tmp_path / "latency.png")
    labels = plot_results.plot(plot_results.load_rows(files), out, mode)
    assert os.path.getsize(out) > 1000
    return labels


def test_eager_only_one_method_one_tp(tmp_path):
    f = write(tmp_path, "eager.json", [row(tokens=t, us=5 + t / 100, mode="eager")
                                       for t in (1, 64, 4096)])
    assert plot(tmp_path, f) == ["swiftqk TP1"]


def test_a_single_point(tmp_path):
    assert plot(tmp_path, write(tmp_path, "one.json", [row()])) == ["swiftqk TP1"]


def test_soak_rows_and_zero_tokens_are_left_out(tmp_path):
    soak = dict(method="swiftqk", mode="soak", model="olmoe", tp=2, tokens=64,
                first_median_us=3.0, last_median_us=3.1, drift=0.03)
    f = write(tmp_path, "mixed.json", [soak, row(tokens=0, us=2.0), row(tokens=16, us=4.0)])
    assert plot(tmp_path, f) == ["swiftqk TP1"]


def test_both_modes_and_methods_and_tps_are_told_apart(tmp_path):
    rows = [row(method=m, tp=tp, tokens=t, us=tp + t / 1000, mode=mode, model=model)
            for m in ("swiftqk", "minimax_fused") for tp in (1, 2, 4) for t in (1, 4096)
            for mode in ("graph", "eager") for model in ("olmoe", "olmo2-13b")]
    labels = plot(tmp_path, write(tmp_path, "all.json", rows))
    assert len(labels) == 2 * 3 * 2 and len(set(labels)) == len(labels)
    assert "minimax_fused TP4, eager" in labels and "swiftqk TP1, graph" in labels
    assert plot(tmp_path, write(tmp_path, "all.json", rows), mode="eager") == sorted(
        f"{m} TP{tp}" for m in ("minimax_fused", "swiftqk") for tp in (1, 2, 4))


def test_torch_baseline_beside_swiftqk_and_the_same_series_from_two_files(tmp_path):
    torch_rows = [dict(method="torch_rms_norm_x2", model="olmo2-13b", tp=1, tokens=t,
                       median_us=20.0, mode="graph", dtype="bf16", device="NVIDIA H200")
                  for t in (1, 64)]
    a = write(tmp_path, "latest.json", [row(tokens=t) for t in (1, 64)])
    b = write(tmp_path, "latest_torch.json", torch_rows)
    assert plot(tmp_path, a, b) == ["swiftqk TP1", "torch_rms_norm_x2"]
    c = write(tmp_path, "before.json", [row(tokens=t, us=12.0) for t in (1, 64)])
    assert plot(tmp_path, a, c) == ["swiftqk TP1, before", "swiftqk TP1, latest"]


def test_no_plottable_rows_is_a_clear_error(tmp_path):
    f = write(tmp_path, "eager.json", [row(mode="eager")])
    with pytest.raises(SystemExit, match="no rows with a latency"):
        plot(tmp_path, f, mode="graph")


def test_command_line(tmp_path, capsys):
    f = write(tmp_path, "eager.json", [row(mode="eager", tokens=t) for t in (1, 2)])
    out = str(tmp_path / "x.png")
    assert plot_results.main([f, "--out", out]) == 0
    assert "wrote" in capsys.readouterr().out and os.path.exists(out)
