"""scripts/tune_stages.sh, run without a GPU against a stand-in benchmark that reports the tuning
variables it was started with: each shape sets the right variables, a repeated shape keeps all
its runs, and the table lists every run."""

import os
import shutil
import subprocess

REPO = os.path.join(os.path.dirname(__file__), "..", "..")

# The stand-in: writes one result whose median encodes SWIFTQK_STAGES, _DEFER, _BLOCK_THREADS
# and _VPT (unset = 0) as S*1000 + D*100 + (threads / 32) + VPT / 10.
FAKE_BENCH = r"""#!/usr/bin/env bash
while [ $# -gt 0 ]; do [ "$1" = --json ] && out=$2; shift; done
us=$(( ${SWIFTQK_STAGES:-0} * 1000 + ${SWIFTQK_DEFER:-0} * 100 + ${SWIFTQK_BLOCK_THREADS:-0} / 32 ))
echo "[{\"model\":\"m\",\"tp\":2,\"tokens\":4096,\"median_us\":$us.${SWIFTQK_VPT:-0},\"wrong\":0}]" >"$out"
"""


def run_tune(tmp_path, shapes, others=()):
    (tmp_path / "scripts").mkdir()
    shutil.copy(os.path.join(REPO, "scripts", "tune_stages.sh"), tmp_path / "scripts")
    bench = tmp_path / "build" / "bench" / "swiftqk_bench"
    bench.parent.mkdir(parents=True)
    bench.write_text(FAKE_BENCH)
    bench.chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out))
    for v in ("SWIFTQK_STAGES", "SWIFTQK_DEFER", "SWIFTQK_BLOCK_THREADS", "SWIFTQK_VPT"):
        env.pop(v, None)
    args = ["bash", str(tmp_path / "scripts" / "tune_stages.sh"), "4096", "2", shapes]
    if others:
        for o in others:  # copies of the stand-in, as other builds
            (tmp_path / o).parent.mkdir(parents=True)
            shutil.copy(bench, tmp_path / o)
        args.append(",".join(str(tmp_path / o) for o in others))
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout, out


def test_each_shape_sets_its_variables_and_repeats_are_kept(tmp_path):
    text, out = run_tune(tmp_path, "d,3+2,4/128x8,3+2,3+2")
    header = [line for line in text.splitlines() if line.startswith("| model")][0]
    names = [c.strip() for c in header.split("|")[4:-2]]
    assert names == ["sd_first", "s3_d2", "s4_b128_v8", "s3_d2_2", "s3_d2_3", "sd_again"]
    row = [line for line in text.splitlines() if line.startswith("| m |")][0]
    cells = [c.strip() for c in row.split("|")[4:-2]]
    # d: nothing set; 3+2: S 3, D 2; 4/128x8: S 4, 128 threads, VPT 8.
    assert cells == ["0.00", "3200.00", "4004.80", "3200.00", "3200.00", "0.00"]
    for n in names:
        assert (out / f"tune_{n}.json").exists()
    assert "wrong results per run: sd_first=0, s3_d2=0, s4_b128_v8=0" in text


def test_other_builds_in_folders_of_the_same_name_keep_both_runs(tmp_path):
    text, out = run_tune(tmp_path, "d,3+2", others=("a/old/bench/swiftqk_bench",
                                                    "b/old/swiftqk_bench"))
    assert "wrong results per run: sd_first=0, old=0, old_2=0, s3_d2=0, sd_again=0" in text
    assert (out / "tune_old.json").exists() and (out / "tune_old_2.json").exists()
