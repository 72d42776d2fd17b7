"""bench/precision_table.py on synthetic runs whose figures are known: the table without e2e
columns for runs that have none (as before they existed), the e2e columns for fp8 rows, the rows
of precision_study.py beside SwiftQK's and the comparison on the (model, tokens) both have, and
the exit code when SwiftQK is worse than All-Gather."""

import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import precision_table  # noqa: E402

HEAD = "| input dtype | method | configs | max abs | mean abs | RMSE |"


def row(method, dtype, mx, mean, rmse, model="a", tokens=64, tp=2, e2e=None):
    r = dict(method=method, model=model, tokens=tokens, dtype=dtype, tp=tp, order="olmo2",
             max_abs_err=mx, mean_abs_err=mean, rmse=rmse)
    if e2e is not None:
        r.update(max_abs_err_e2e=e2e[0], mean_abs_err_e2e=e2e[1], rmse_e2e=e2e[2])
    return r


def study_row(method, dtype, mx, mean, rmse, model="a", tokens=64, e2e=None):
    r = row(method, dtype, mx, mean, rmse, model, tokens, e2e=e2e)
    del r["tp"]  # precision_study.py normalises the gathered tensor: no TP
    return r


def run(tmp_path, capsys, *files):
    paths = []
    for i, rows in enumerate(files):
        p = tmp_path / f"r{i}.json"
        p.write_text(json.dumps(rows))
        paths.append(str(p))
    code = precision_table.main(paths)
    return code, capsys.readouterr().out


def test_runs_without_e2e_fields_print_the_table_as_before(tmp_path, capsys):
    rows = [row("swiftqk", "bf16", 0.06, 1e-3, 2e-3, tokens=64),
            row("swiftqk", "bf16", 0.02, 3e-3, 4e-3, tokens=4096),
            row("all_gather", "bf16", 0.06, 1e-3, 2e-3, tokens=64),
            row("all_gather", "bf16", 0.02, 3e-3, 4e-3, tokens=4096)]
    code, out = run(tmp_path, capsys, rows)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == HEAD and lines[1] == "|---|---|---:|---:|---:|---:|"
    # max of the maxima, mean of the means, root of the mean square of the RMSEs
    rmse = f"{math.sqrt((2e-3 ** 2 + 4e-3 ** 2) / 2):.2e}"
    assert f"| bf16 | swiftqk | 2 | 6.00e-02 | 2.00e-03 | {rmse} |" in lines
    assert ("SwiftQK vs All-Gather on 2 matching configurations: no worse (RMSE within 1%) "
            "everywhere") in out
    assert "e2e" not in out


def test_fp8_rows_get_the_e2e_columns_and_other_dtypes_a_dash(tmp_path, capsys):
    rows = [row("swiftqk", "f8e4m3", 0.05, 1e-3, 2e-3, e2e=(0.5, 0.02, 0.03)),
            row("swiftqk", "f8e4m3", 0.04, 1e-3, 2e-3, tokens=4096, e2e=(0.3, 0.04, 0.03)),
            row("swiftqk", "bf16", 0.06, 1e-3, 2e-3)]
    _, out = run(tmp_path, capsys, rows)
    assert out.splitlines()[0] == HEAD + " max abs e2e | mean abs e2e | RMSE e2e |"
    assert ("| f8e4m3 | swiftqk | 2 | 5.00e-02 | 1.00e-03 | 2.00e-03 | 5.00e-01 | 3.00e-02 | "
            "3.00e-02 |") in out
    assert "| bf16 | swiftqk | 1 | 6.00e-02 | 1.00e-03 | 2.00e-03 | - | - | - |" in out
    assert "predates" not in out


def test_a_group_with_e2e_figures_in_part_says_so(tmp_path, capsys):
    old = [row("swiftqk", "f8e4m3", 0.05, 1e-3, 2e-3, tokens=64)]
    new = [row("swiftqk", "f8e4m3", 0.05, 1e-3, 2e-3, tokens=4096, e2e=(0.5, 0.02, 0.03))]
    _, out = run(tmp_path, capsys, old, new)
    assert "| f8e4m3 | swiftqk | 2 | 5.00e-02 | 1.00e-03 | 2.00e-03 | 5.00e-01 |" in out
    assert "f8e4m3 swiftqk: e2e over 1 of 2 configurations" in out


def test_independent_paths_stand_beside_swiftqk_on_the_points_both_have(tmp_path, capsys):
    bench = [row("swiftqk", "bf16", 0.06, 1e-3, 2e-3, tokens=64),
             row("swiftqk", "bf16", 0.06, 1e-3, 9e-3, tokens=16384),  # the study has no 16384
             row("all_gather", "bf16", 0.06, 1e-3, 2e-3, tokens=64),
             row("swiftqk", "f8e4m3", 0.05, 1e-3, 3e-3, e2e=(0.5, 0.02, 0.03))]
    study = [study_row("torch_rms_norm", "bf16", 0.03, 1e-3, 2.5e-3),
             study_row("hf_rmsnorm", "bf16", 0.05, 1e-3, 2e-3),
             study_row("hf_rmsnorm", "f8e4m3", 0.07, 2e-3, 3e-3, e2e=(0.5, 0.02, 0.04))]
    code, out = run(tmp_path, capsys, bench, study)
    assert code == 0
    lines = out.splitlines()
    table = [ln for ln in lines if ln.startswith("| ")][1:]
    # sorted by dtype, then method: the independent paths among SwiftQK's methods
    assert [ln.split(" | ")[:2] for ln in table] == [
        ["| bf16", "all_gather"], ["| bf16", "hf_rmsnorm"], ["| bf16", "swiftqk"],
        ["| bf16", "torch_rms_norm"], ["| f8e4m3", "hf_rmsnorm"], ["| f8e4m3", "swiftqk"]]
    assert ("SwiftQK vs torch_rms_norm, bf16, on 1 (model, tokens) both have: RMSE 2.00e-03 vs "
            "2.50e-03 (ratio 0.80) (other draws of the same distribution)") in lines
    assert ("SwiftQK vs hf_rmsnorm, f8e4m3, on 1 (model, tokens) both have: RMSE 3.00e-03 vs "
            "3.00e-03 (ratio 1.00); RMSE e2e 3.00e-02 vs 4.00e-02 (ratio 0.75) (other draws of "
            "the same distribution)") in lines
    assert lines[-1] == ("SwiftQK vs All-Gather on 1 matching configurations: no worse (RMSE "
                         "within 1%) everywhere")


def test_only_study_rows_print_the_table_alone(tmp_path, capsys):
    code, out = run(tmp_path, capsys, [study_row("hf_rmsnorm", "bf16", 0.05, 1e-3, 2e-3)])
    assert code == 0
    assert "| bf16 | hf_rmsnorm | 1 |" in out and "SwiftQK vs" not in out


def test_swiftqk_worse_than_all_gather_fails(tmp_path, capsys):
    rows = [row("swiftqk", "bf16", 0.06, 1e-3, 2.1e-3), row("all_gather", "bf16", 0.06, 1e-3, 2e-3)]
    code, out = run(tmp_path, capsys, rows)
    assert code == 1 and "worse at" in out
