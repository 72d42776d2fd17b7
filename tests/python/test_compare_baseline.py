"""bench/compare_baseline.py: a new run against a baseline file, per configuration, checked on a
synthetic baseline and run whose ratios are known; and the shipped bench/baselines/h200.json,
whose sets must print the figures docs/performance.md quotes."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import compare_baseline  # noqa: E402
import ratio_table  # noqa: E402
import tp_scaling_table  # noqa: E402


def bench_row(tokens, us, **kw):
    return dict(method="swiftqk", model="olmoe", tp=2, tokens=tokens, median_us=us, **kw)


BASELINE = {
    "defaults": {"dtype": "bf16", "mode": "graph", "gpus": 1},
    "sets": {
        "virtual": {"commit": "c0ffee0", "device": "one H200", "command": "...",
                    "rows": [bench_row(64, 5.0), bench_row(4096, 20.0),
                             bench_row(4096, 40.0, dtype="fp8")]},
        "procs": {"commit": "c0ffee0", "device": "two H200s", "command": "...",
                  "rows": [bench_row(4096, 16.0, gpus=2)]},
        "decode": {"commit": "c0ffee0", "device": "two H200s", "command": "...",
                   "rows": [dict(method="swiftqk", model="olmoe", tp=2, batch=32, context=512,
                                 layers=8, tpot_ms=2.0)]},
    },
}

# As the benchmark writes them: every key present. 64 tokens 10% slower, 4096 tokens 5% faster,
# the two-GPU row 25% slower, one decode point 10% faster, and a token count the baseline lacks.
NEW = [
    bench_row(64, 5.5, dtype="bf16", mode="graph", gpus=1, wrong=0),
    bench_row(4096, 19.0, dtype="bf16", mode="graph", gpus=1, wrong=0),
    bench_row(4096, 20.0, dtype="bf16", mode="graph", gpus=2, wrong=0),
    bench_row(16, 5.0, dtype="bf16", mode="graph", gpus=1, wrong=0),
    dict(method="swiftqk", model="olmoe", tp=2, batch=32, context=512, layers=8, tpot_ms=1.8),
]


def run(tmp_path, capsys, new, *extra):
    base, run_json = tmp_path / "base.json", tmp_path / "new.json"
    base.write_text(json.dumps(BASELINE))
    run_json.write_text(json.dumps(new))
    rc = compare_baseline.main([str(run_json), "--baseline", str(base), *extra])
    return rc, capsys.readouterr().out


def test_each_configuration_gets_its_ratio(tmp_path, capsys):
    rc, out = run(tmp_path, capsys, NEW)
    assert rc == 0
    lines = out.splitlines()
    # The baseline row leaves dtype, mode and gpus to the defaults and still matches.
    assert "| virtual | swiftqk | olmoe | bf16 | 2 | 1 | 64 | 5.00 us | 5.50 us | 1.100 |" in lines
    assert "| virtual | swiftqk | olmoe | bf16 | 2 | 1 | 4096 | 20.00 us | 19.00 us | 0.950 |" in lines
    # The same TP on two GPUs is another configuration than on virtual ranks.
    assert "| procs | swiftqk | olmoe | bf16 | 2 | 2 | 4096 | 16.00 us | 20.00 us | 1.250 |" in lines
    assert ("| decode | swiftqk | olmoe | bf16 | 2 | 1 | batch 32, context 512 | 2.00 ms | 1.80 ms"
            " | 0.900 |") in lines
    assert not any(" fp8 " in line for line in lines)  # the fp8 row has no new counterpart
    # Geometric mean of 1.1, 0.95, 1.25 and 0.9: 1.0408.
    assert "4 comparisons: new / baseline 0.900 to 1.250, geometric mean 1.041" in lines
    assert "1 rows of the new run have no baseline row" in lines


def test_max_ratio_fails_a_slower_run_and_passes_a_faster_one(tmp_path, capsys):
    rc, out = run(tmp_path, capsys, NEW, "--max-ratio", "1.2")
    assert rc == 1
    assert "| 1.250 SLOWER |" in out and "above 1.2: 1" in out
    rc, out = run(tmp_path, capsys, NEW, "--max-ratio", "1.25")
    assert rc == 0 and "above 1.25: 0" in out


def test_only_the_sets_asked_for(tmp_path, capsys):
    rc, out = run(tmp_path, capsys, NEW, "--set", "procs")
    assert rc == 0
    assert "1 comparisons: new / baseline 1.250 to 1.250, geometric mean 1.250" in out
    assert "| virtual |" not in out and "4 rows of the new run have no baseline row" in out


def test_wrong_results_fail_and_nothing_to_compare_is_an_error(tmp_path, capsys):
    rc, out = run(tmp_path, capsys, [bench_row(64, 5.0, wrong=3)])
    assert rc == 1 and "| 1.000 3 WRONG |" in out
    rc, out = run(tmp_path, capsys, [bench_row(8, 5.0)])
    assert rc == 2 and "no configuration of the new run is in the baseline (1 rows)" in out


def test_dump_fills_in_the_defaults(tmp_path, capsys):
    base = tmp_path / "base.json"
    base.write_text(json.dumps(BASELINE))
    assert compare_baseline.main(["--baseline", str(base), "--dump", "virtual"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0] == dict(method="swiftqk", model="olmoe", tp=2, tokens=64, median_us=5.0,
                           dtype="bf16", mode="graph", gpus=1, commit="c0ffee0")
    assert rows[2]["dtype"] == "fp8"


def dumped(tmp_path, capsys, name):
    assert compare_baseline.main(["--dump", name]) == 0
    rows = json.loads(capsys.readouterr().out)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(rows))
    return rows, path


def test_the_shipped_baseline_holds_the_figures_of_docs_performance(tmp_path, capsys):
    _, sets = compare_baseline.load_baseline(compare_baseline.DEFAULT_BASELINE)
    for name, s in sets.items():
        assert s["device"] in ("one H200", "two H200s"), name
        assert len(s["commit"]) == 7 and s["command"], name
        assert all(r.get("wrong", 0) == 0 for r in s["rows"]), name
    assert os.path.getsize(compare_baseline.DEFAULT_BASELINE) < 100_000

    rows, _ = dumped(tmp_path, capsys, "tp2_two_gpus")
    bf16 = tmp_path / "bf16.json"
    bf16.write_text(json.dumps([r for r in rows if r["dtype"] == "bf16"]))
    ratio_table.main([str(bf16), "--target", "all_gather=0.85,minimax_fused=0.30"])
    out = capsys.readouterr().out
    assert "reduction vs all_gather: 79.2% to 93.4% over 35 points; target >= 85%: met at 20 of 35" in out
    assert "reduction vs minimax_fused: 5.3% to 24.9% over 35 points; target >= 30%: met at 0 of 35" in out
    assert "swiftqk / floor: 0.93 to 1.13; target <= 1.2: met at 35 of 35" in out

    _, virtual = dumped(tmp_path, capsys, "virtual_ranks")
    tp_scaling_table.main([f"v={virtual}", "--summary"])
    out = capsys.readouterr().out
    assert ("v: at most 1.15x TP 1 at 4096 tokens: 12 of 15; at most TP 1 + 2.0 us at <= 64 "
            "tokens: 30 of 30 (worst +1.28 us)") in out
    for miss in ("olmoe TP 4 at 4096 tokens: 1.167x", "olmoe TP 8 at 4096 tokens: 1.253x",
                 "olmo3-32b TP 8 at 4096 tokens: 1.211x"):
        assert miss in out

    # A run equal to the baseline compares as 1.000 everywhere.
    assert compare_baseline.main([str(virtual), "--set", "virtual_ranks", "--max-ratio", "1.0"]) == 0
    assert "80 comparisons: new / baseline 1.000 to 1.000" in capsys.readouterr().out
