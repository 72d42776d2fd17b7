"""scripts/gpu_check.sh, run without a GPU against stand-ins for nvidia-smi, the GPU tests and
the benchmark: the `sweep` phase runs the one-process-per-GPU sweep at each TP asked for and
nothing else, an unknown phase is refused, and a run stopped part-way leaves $OUT/summary.txt
with every step that finished."""

import os
import shutil
import subprocess
import time

REPO = os.path.join(os.path.dirname(__file__), "..", "..")

FAKE_SMI = r"""#!/usr/bin/env bash
case "$1" in
  -L) for i in $(seq 0 $((FAKE_GPUS - 1))); do echo "GPU $i: Stand-in H200 (UUID: GPU-$i)"; done ;;
  *) echo "Stand-in H200, 0.0" ;;
esac
"""
FAKE_GTESTS = r"""#!/usr/bin/env bash
echo "[  PASSED  ] 3 tests."
"""
# One row per method; with FAKE_SLOW_TP set, the run at that TP takes (for the cut-off test).
FAKE_BENCH = r"""#!/usr/bin/env bash
procs=0 dtype=bf16
while [ $# -gt 0 ]; do
  case "$1" in --json) out=$2 ;; --procs) procs=$2 ;; --dtype) dtype=$2 ;; esac; shift
done
[ "$procs" = "${FAKE_SLOW_TP:-}" ] && sleep 20
rows=""
for m in swiftqk minimax_fused all_gather; do
  rows+="{\"model\":\"m\",\"tp\":$procs,\"tokens\":64,\"dtype\":\"$dtype\",\"mode\":\"graph\","
  rows+="\"method\":\"$m\",\"median_us\":5.0,\"wrong\":0,\"max_abs_err\":0.01,"
  rows+="\"mean_abs_err\":0.001,\"rmse\":0.002},"
done
echo "[${rows%,}]" >"$out"
echo "all configurations verified against the float64 reference (stand-in, TP $procs)"
"""


def tree(tmp_path, gpus):
    for d in ("scripts", "bench", "build/tests", "build/bench", "bin"):
        (tmp_path / d).mkdir(parents=True)
    shutil.copy(os.path.join(REPO, "scripts", "gpu_check.sh"), tmp_path / "scripts")
    for f in ("ratio_table.py", "precision_table.py"):
        shutil.copy(os.path.join(REPO, "bench", f), tmp_path / "bench")
    for path, text in (("bin/nvidia-smi", FAKE_SMI), ("build/tests/swiftqk_gpu_tests", FAKE_GTESTS),
                       ("build/bench/swiftqk_bench", FAKE_BENCH)):
        (tmp_path / path).write_text(text)
        (tmp_path / path).chmod(0o755)
    (tmp_path / ".commit").write_text("c0ffee\n")
    env = dict(os.environ, FAKE_GPUS=str(gpus), OUT=str(tmp_path / "out"),
               PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    env.pop("TPS", None)
    return env


def sweep_files(tp):
    return {f"bench_procs_tp{tp}.json", f"bench_procs_tp{tp}.log", f"ratios_procs_tp{tp}.md",
            f"bench_procs_fp8_tp{tp}.json", f"bench_procs_fp8_tp{tp}.log",
            f"precision_procs_tp{tp}.md"}


def test_sweep_runs_each_tp_asked_for_and_nothing_else(tmp_path):
    env = tree(tmp_path, 8)
    env["TPS"] = "2 4"
    r = subprocess.run(["bash", str(tmp_path / "scripts" / "gpu_check.sh"), "sweep"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # Nothing else: no TP 8, no GPU tests, no Python tests (not part of a sweep).
    names = set(os.listdir(tmp_path / "out"))
    assert names == {"gpu.txt", "summary.txt"} | sweep_files(2) | sweep_files(4)
    for tp in (2, 4):
        assert f"bench procs {tp}: all configurations verified" in r.stdout
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "commit c0ffee, 8 GPU(s)" in summary
    assert summary.count("precision tp ") == 2 and summary == r.stdout


def test_default_tps_are_the_powers_of_two_up_to_the_gpu_count(tmp_path):
    env = tree(tmp_path, 4)
    r = subprocess.run(["bash", str(tmp_path / "scripts" / "gpu_check.sh"), "sweep"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert set(os.listdir(tmp_path / "out")) == {"gpu.txt", "summary.txt"} | sweep_files(2) | \
        sweep_files(4)


def test_an_unknown_phase_is_refused(tmp_path):
    env = tree(tmp_path, 2)
    r = subprocess.run(["bash", str(tmp_path / "scripts" / "gpu_check.sh"), "verify-only"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "unknown phase 'verify-only'" in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_run_stopped_part_way_keeps_the_summary_of_the_steps_that_finished(tmp_path):
    env = tree(tmp_path, 8)
    env.update(TPS="2 4", FAKE_SLOW_TP="4")
    p = subprocess.Popen(["bash", str(tmp_path / "scripts" / "gpu_check.sh"), "sweep"],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    deadline = time.time() + 60
    summary = tmp_path / "out" / "summary.txt"
    while time.time() < deadline and "precision tp 2" not in (
            summary.read_text() if summary.exists() else ""):
        time.sleep(0.1)
    time.sleep(0.5)  # TP 4's run is now under way, and takes 20 s
    os.killpg(p.pid, 9)  # stopped from outside, with no chance to write anything more
    p.wait()
    names = set(os.listdir(tmp_path / "out"))
    assert sweep_files(2) <= names
    assert "bench_procs_tp4.json" not in names
    text = summary.read_text()
    assert "precision tp 2" in text and "bench procs 4" not in text


def test_one_gpu_sweep_says_there_is_nothing_to_run(tmp_path):
    env = tree(tmp_path, 1)
    r = subprocess.run(["bash", str(tmp_path / "scripts" / "gpu_check.sh"), "sweep"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "sweep: one GPU here, nothing to run one process per GPU" in r.stdout
