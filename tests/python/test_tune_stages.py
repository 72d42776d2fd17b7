"""scripts/tune_stages.sh, run without a GPU against a stand-in benchmark that reports the tuning
flags it was started with: each shape passes the right flags, a repeated shape keeps all its
runs, and the table lists every run."""

import os
import shutil
import subprocess

REPO = os.path.join(os.path.dirname(__file__), "..", "..")

# The stand-in: writes one result whose median encodes --stages, --defer, --block-threads and
# --vpt (not given = 0) as S*1000 + D*100 + (threads / 32) + VPT / 10; a run started with one of
# the environment variables that used to carry the tuning counts as wrong.
OLD_TUNING_VARIABLES = ("SWIFTQK_STAGES", "SWIFTQK_DEFER", "SWIFTQK_BLOCK_THREADS", "SWIFTQK_VPT",
                        "SWIFTQK_BLOCK_ORDER")
FAKE_BENCH = r"""#!/usr/bin/env bash
wrong=0
for var in """ + " ".join(OLD_TUNING_VARIABLES) + r"""; do [ -n "${!var:-}" ] && wrong=1; done
s=0 d=0 b=0 v=0
while [ $# -gt 0 ]; do
  case $1 in
    --json) out=$2 ;;
    --stages) s=$2 ;;
    --defer) d=$2 ;;
    --block-threads) b=$2 ;;
    --vpt) v=$2 ;;
    --dtype) dt=$2 ;;
  esac
  shift
done
us=$(( s * 1000 + d * 100 + b / 32 ))
echo "[{\"model\":\"m${dt:+_$dt}\",\"tp\":2,\"tokens\":4096,\"median_us\":$us.$v,\"wrong\":$wrong}]" >"$out"
"""


def run_tune(tmp_path, shapes, others=(), tune_args=None):
    (tmp_path / "scripts").mkdir()
    shutil.copy(os.path.join(REPO, "scripts", "tune_stages.sh"), tmp_path / "scripts")
    bench = tmp_path / "build" / "bench" / "swiftqk_bench"
    bench.parent.mkdir(parents=True)
    bench.write_text(FAKE_BENCH)
    bench.chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out))
    env.pop("TUNE_ARGS", None)
    if tune_args is not None:
        env["TUNE_ARGS"] = tune_args
    for v in OLD_TUNING_VARIABLES:
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


def test_each_shape_passes_its_flags_and_repeats_are_kept(tmp_path):
    text, out = run_tune(tmp_path, "d,3+2,4/128x8,3+2,3+2")
    header = [line for line in text.splitlines() if line.startswith("| model")][0]
    names = [c.strip() for c in header.split("|")[4:-2]]
    assert names == ["sd_first", "s3_d2", "s4_b128_v8", "s3_d2_2", "s3_d2_3", "sd_again"]
    row = [line for line in text.splitlines() if line.startswith("| m |")][0]
    cells = [c.strip() for c in row.split("|")[4:-2]]
    # d: no flag; 3+2: S 3, D 2; 4/128x8: S 4, 128 threads, VPT 8.
    assert cells == ["0.00", "3200.00", "4004.80", "3200.00", "3200.00", "0.00"]
    for n in names:
        assert (out / f"tune_{n}.json").exists()
    assert "wrong results per run: sd_first=0, s3_d2=0, s4_b128_v8=0" in text


def test_other_builds_in_folders_of_the_same_name_keep_both_runs(tmp_path):
    text, out = run_tune(tmp_path, "d,3+2", others=("a/old/bench/swiftqk_bench",
                                                    "b/old/swiftqk_bench"))
    assert "wrong results per run: sd_first=0, old=0, old_2=0, s3_d2=0, sd_again=0" in text
    assert (out / "tune_old.json").exists() and (out / "tune_old_2.json").exists()


def test_tune_args_reach_every_run(tmp_path):
    text, _ = run_tune(tmp_path, "d,3", tune_args="--dtype fp8")
    rows = [line for line in text.splitlines() if line.startswith("| m") and "model" not in line]
    assert rows and all(line.startswith("| m_fp8 |") for line in rows), text
