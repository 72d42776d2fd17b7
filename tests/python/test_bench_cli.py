"""swiftqk_bench's command line, run as a user would: every bad value exits non-zero at parse
time with one line naming the flag and the value, on a machine with or without a GPU; --help
shows the defaults and the model names and hides the internal flags."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def _bench():
    path = os.environ.get("SWIFTQK_BENCH") or os.path.join(ROOT, "build", "bench", "swiftqk_bench")
    if not os.access(path, os.X_OK):
        pytest.skip(f"swiftqk_bench is not built at {path} (build it, or set SWIFTQK_BENCH)")
    return path


def _run(*args):
    return subprocess.run([_bench(), *args], capture_output=True, text=True, timeout=60)


# (arguments, the flag and the value the message must name)
BAD = [
    (["--tp", "3"], "--tp", "3"),
    (["--tp", "0"], "--tp", "0"),
    (["--tp", "64"], "--tp", "64"),
    (["--tp", "1,x"], "--tp", "x"),
    (["--tokens", "-1"], "--tokens", "-1"),
    (["--tokens", "abc"], "--tokens", "abc"),
    (["--tokens", "16,1.5"], "--tokens", "1.5"),
    (["--iters", "-5"], "--iters", "-5"),
    (["--iters", "0"], "--iters", "0"),
    (["--warmup", "0"], "--warmup", "0"),
    (["--graph-launches", "0"], "--graph-launches", "0"),
    (["--procs", "0"], "--procs", "0"),
    (["--procs", "3"], "--procs", "3"),
    (["--soak", "-1"], "--soak", "-1"),
    (["--models", "olmo9"], "--models", "olmo9"),
    (["--dtype", "int8"], "--dtype", "int8"),
    (["--methods", "swiftqk,nope"], "--methods", "nope"),
    (["--mode", "lazy"], "--mode", "lazy"),
    (["--order", "gpt"], "--order", "gpt"),
    (["--shapes", "100"], "--shapes", "100"),
    (["--shapes", "0:64"], "--shapes", "0:64"),
    (["--models", "olmoe", "--shapes", "96:48", "--tp", "1,32"], "--tp", "32"),
    (["--shapes", "96:48", "--procs", "32"], "--procs", "32"),
    (["--json", "/nonexistent/x.json"], "--json", "/nonexistent/x.json"),
    (["--csv", "/nonexistent/x.csv"], "--csv", "/nonexistent/x.csv"),
    (["--markdown", "/nonexistent/x.md"], "--markdown", "/nonexistent/x.md"),
    # The launch tuning: LaunchTuning's ranges, checked before anything runs.
    (["--stages", "1"], "--stages", "1"),
    (["--stages", "6"], "--stages", "6"),
    (["--stages", "-3"], "--stages", "-3"),
    (["--stages", "3x"], "--stages", "3x"),
    (["--stages", "x"], "--stages", "x"),
    (["--stages", " 3"], "--stages", " 3"),
    (["--stages", "99999999999999999999"], "--stages", "99999999999999999999"),
    (["--defer", "5"], "--defer", "5"),
    (["--stages", "3", "--defer", "3"], "--defer", "3"),
    (["--vpt", "3"], "--vpt", "3"),
    (["--vpt", "16"], "--vpt", "16"),
    (["--block-threads", "16"], "--block-threads", "16"),
    (["--block-threads", "2048"], "--block-threads", "2048"),
    (["--block-order", "sideways"], "--block-order", "sideways"),
]


@pytest.mark.parametrize("args,flag,value", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_argument_exits_nonzero_naming_flag_and_value(args, flag, value):
    r = _run(*args)
    assert r.returncode != 0, f"{args} exited 0:\n{r.stdout}{r.stderr}"
    first = r.stderr.strip().splitlines()[0]
    assert first.startswith(flag + ":"), r.stderr
    assert value in first, r.stderr
    assert "stoll" not in r.stderr and "stoi" not in r.stderr
    # Refused at parse time: nothing ran, not even the no-GPU self-check.
    assert "self-check" not in r.stdout and "configurations" not in r.stdout


def test_json_directory_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    r = _run("--json", str(tmp_path / "f" / "x.json"))
    assert r.returncode != 0 and r.stderr.startswith("--json:")


def test_help_shows_defaults_and_models_and_hides_internal_flags():
    r = _run("--help")
    assert r.returncode == 0
    for name in ("olmoe", "olmo2-7b", "olmo2-13b", "olmo3-32b", "minimax-m2"):
        assert name in r.stdout
    # The defaults (CLI11 writes "=200" or "[200]", depending on its version).
    assert "1,16,64,256,1024,4096,16384" in r.stdout  # --tokens
    iters = next(line for line in r.stdout.splitlines() if "--iters" in line)
    assert "200" in iters
    for flag in ("--csv", "--markdown", "--json", "--list-models", "--stages", "--defer", "--vpt",
                 "--block-threads", "--block-order"):
        assert flag in r.stdout
    for hidden in ("--rank", "--world", "--rendezvous"):
        assert hidden not in r.stdout


def test_list_models_prints_each_shape():
    r = _run("--list-models")
    assert r.returncode == 0
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 5
    assert lines[0].split()[0] == "olmoe" and "Q  2048" in lines[0] and "llama" in lines[0]


def test_good_arguments_pass_the_parser():
    # --list-models exits after the arguments are checked, whatever the machine.
    r = _run("--models", "olmo2-13b,minimax-m2", "--tokens", "0,64", "--tp", "1,8,32",
             "--shapes", "4096:1024", "--dtype", "bf16,fp8", "--methods", "swiftqk,all_gather",
             "--iters", "3", "--warmup", "1", "--procs", "2", "--order", "llama",
             "--list-models")
    assert r.returncode == 0, r.stderr
    r = _run("--stages", "3", "--defer", "2", "--vpt", "8", "--block-threads", "512",
             "--block-order", "interleaved", "--list-models")
    assert r.returncode == 0, r.stderr
    r = _run("--stages", "0", "--defer", "4", "--vpt", "0", "--block-threads", "0",
             "--block-order", "tuned", "--list-models")
    assert r.returncode == 0, r.stderr


def test_a_scalar_given_twice_takes_the_last_value_and_checks_both():
    # main.sh passes its own --json first; the user's, after it, wins instead of an error.
    r = _run("--iters", "5", "--iters", "7", "--list-models")
    assert r.returncode == 0, r.stderr
    r = _run("--json", "/nonexistent/x.json", "--json", os.path.join(ROOT, "x.json"),
             "--list-models")
    assert r.returncode != 0 and r.stderr.startswith("--json:")


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None
                    and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0,
                    reason="a GPU is present: valid arguments would start the real benchmark")
def test_without_a_gpu_valid_arguments_run_the_self_check_and_exit_0():
    r = _run("--tp", "1,2", "--tokens", "16")
    assert r.returncode == 0, r.stderr
    assert "no CUDA GPU" in r.stdout and "ok" in r.stdout


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None
                    and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0,
                    reason="a GPU is present: the soak would run")
def test_without_a_gpu_the_soak_says_it_did_not_run_and_exits_0(tmp_path):
    out = tmp_path / "soak.json"
    r = _run("--soak", "1000", "--models", "olmoe", "--tokens", "1,64", "--tp", "8", "--json",
             str(out))
    assert r.returncode == 0, r.stderr
    assert "--soak: no CUDA GPU" in r.stdout and "not run" in r.stdout
    assert not out.exists()  # no rows written as if it had run


def _fuzz_list(n, seed):
    r = _run("--fuzz-shapes", str(n), "--seed", str(seed), "--fuzz-list")
    assert r.returncode == 0, r.stderr
    points = []
    for line in r.stdout.splitlines():
        f = line.split()
        # "i q Q k K dtype order tp N tokens T"
        points.append(dict(q=int(f[2]), k=int(f[4]), dtype=f[5], order=f[6], tp=int(f[8]),
                           tokens=int(f[10])))
    return points


def test_fuzz_points_follow_the_issue_ranges_and_the_seed():
    points = _fuzz_list(400, 11)
    assert len(points) == 400
    for p in points:
        assert p["tp"] in (2, 4, 8)
        for w in (p["q"], p["k"]):
            assert 256 <= w <= 16384 and w % (8 * p["tp"]) == 0, p
        assert 1 <= p["tokens"] <= 20000
    # Every dtype and order, TP degree, and both ends of the token range appear.
    assert {p["dtype"] for p in points} == {"bf16", "f16", "f32", "f8e4m3"}
    assert {p["order"] for p in points} == {"olmo2", "llama"}
    assert {p["tp"] for p in points} == {2, 4, 8}
    assert min(p["tokens"] for p in points) <= 3 and max(p["tokens"] for p in points) >= 5000
    assert _fuzz_list(400, 11) == points  # a seed names one list
    assert _fuzz_list(400, 12) != points


def test_fuzz_tokens_keeps_the_seeds_points_in_the_range_by_index():
    every = _run("--fuzz-shapes", "200", "--seed", "1", "--fuzz-list")
    few = _run("--fuzz-shapes", "200", "--seed", "1", "--fuzz-list", "--fuzz-tokens", "1:64")
    assert every.returncode == 0 and few.returncode == 0, every.stderr + few.stderr
    lines = every.stdout.splitlines()
    expected = [ln for ln in lines if int(ln.split()[-1]) <= 64]
    # The points are drawn as without the range (same indices and shapes), then filtered.
    assert few.stdout.splitlines() == expected
    assert 0 < len(expected) < len(lines)
    big = _run("--fuzz-shapes", "200", "--seed", "1", "--fuzz-list", "--fuzz-tokens", "4096:20000")
    assert big.stdout.splitlines() == [ln for ln in lines if int(ln.split()[-1]) >= 4096]


@pytest.mark.parametrize("bad", ["0:64", "64:1", "1", "1:", ":64", "a:64", "1:64x"])
def test_fuzz_tokens_refuses_a_malformed_range(bad):
    r = _run("--fuzz-shapes", "5", "--fuzz-list", "--fuzz-tokens", bad)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "--fuzz-tokens" in out and bad in out


def test_fuzz_shapes_refuses_a_negative_count():
    r = _run("--fuzz-shapes", "-1")
    assert r.returncode != 0 and "--fuzz-shapes" in (r.stdout + r.stderr)


def test_fuzz_first_must_be_below_the_point_count():
    r = _run("--fuzz-shapes", "5", "--fuzz-first", "5")
    assert r.returncode != 0
    assert "--fuzz-first" in (r.stdout + r.stderr) and "5" in (r.stdout + r.stderr)
    assert _run("--fuzz-shapes", "5", "--fuzz-first", "4", "--fuzz-list").returncode == 0
