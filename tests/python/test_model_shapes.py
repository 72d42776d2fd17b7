"""One table of model shapes, bench/models.json, and every reader sees the same rows: the header
cmake/ModelShapes.cmake generates for swiftqk_bench (and the binary's --list-models, where it is
built), bench/torch_rms_norm.py and bench/e2e_decode.py; no reader keeps a copy of its own."""

import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BENCH = os.path.join(ROOT, "bench")
JSON = os.path.join(BENCH, "models.json")


def _table():
    with open(JSON) as f:
        return json.load(f)["models"]


def _float32(x):
    """x rounded to float, as static_cast<float> rounds the generated header's double."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _module(name):
    sys.path.insert(0, BENCH)
    try:
        spec = importlib.util.spec_from_file_location(f"_bench_{name}",
                                                      os.path.join(BENCH, f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(BENCH)


def _generate(tmp_path, json_path=JSON):
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed here")
    out = tmp_path / "model_shapes.hpp"
    r = subprocess.run(["cmake", f"-DMODELS_JSON={json_path}", f"-DOUT={out}", "-P",
                        os.path.join(ROOT, "cmake", "ModelShapes.cmake")],
                       capture_output=True, text=True, timeout=60)
    return r, out


def test_the_generated_header_holds_the_table(tmp_path):
    r, out = _generate(tmp_path)
    assert r.returncode == 0, r.stderr
    rows = re.findall(r'\{"([^"]+)", (\d+), (\d+), ([0-9.e+-]+), NormOrder::k(\w+)\}',
                      out.read_text())
    assert [(n, int(q), int(k), _float32(float(e)), o.lower()) for n, q, k, e, o in rows] == [
        (m["name"], m["q_width"], m["k_width"], _float32(m["eps"]), m["order"]) for m in _table()]


def test_swiftqk_bench_lists_the_table():
    path = os.environ.get("SWIFTQK_BENCH") or os.path.join(ROOT, "build", "bench", "swiftqk_bench")
    if not os.access(path, os.X_OK):
        pytest.skip(f"swiftqk_bench is not built at {path} (build it, or set SWIFTQK_BENCH)")
    r = subprocess.run([path, "--list-models"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # describe_models()'s format in bench/swiftqk_bench.cpp.
    expected = "".join("  %-11s Q %5d  K %5d  %-5s order  eps %g\n" % (
        m["name"], m["q_width"], m["k_width"], m["order"], _float32(m["eps"])) for m in _table())
    assert r.stdout == expected


def test_torch_rms_norm_reads_the_table():
    assert _module("torch_rms_norm").MODELS == {
        m["name"]: (m["q_width"], m["k_width"], m["eps"]) for m in _table()}


def test_e2e_decode_reads_the_table():
    pytest.importorskip("torch", reason="PyTorch is not installed here (e2e_decode.py needs it)")
    models = dict(_module("e2e_decode").MODELS)
    assert models.pop("tiny")[0] == 256  # the smoke-test shape, which is no model
    expected = {}
    for m in _table():
        d = m.get("decoder")
        if d:
            expected[m["name"]] = (d["hidden"], d["heads"], d["kv_heads"], d["head_dim"],
                                   d["mlp_width"], m["eps"], m["order"], d["layers"])
    assert models == expected and len(expected) >= 3


def test_no_reader_keeps_a_copy():
    names = [m["name"] for m in _table()]
    for path in ("bench_common.hpp", "swiftqk_bench.cpp", "torch_rms_norm.py", "e2e_decode.py"):
        with open(os.path.join(BENCH, path)) as f:
            text = f.read()
        # A table row names a model next to its widths.
        for name in names:
            assert not re.search(rf'"{re.escape(name)}"\s*[,:]\s*[({{]?\s*\d{{3,}}', text), (
                f"{path} holds a row for {name}")


def test_decoder_entries_agree_with_the_widths():
    for m in _table():
        d = m.get("decoder")
        if d:
            assert d["heads"] * d["head_dim"] == m["q_width"], m["name"]
            assert d["kv_heads"] * d["head_dim"] == m["k_width"], m["name"]


BAD = {
    "order": ({"name": "x", "q_width": 64, "k_width": 64, "eps": 1e-6, "order": "gpt"},
              "order"),
    "width": ({"name": "x", "q_width": 0, "k_width": 64, "eps": 1e-6, "order": "olmo2"},
              "q_width|widths"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_both_readers_refuse_a_bad_entry(tmp_path, case):
    entry, word = BAD[case]
    bad = tmp_path / "models.json"
    bad.write_text(json.dumps({"models": [entry]}))
    with pytest.raises(ValueError, match=word):
        _module("model_shapes").load(str(bad))
    r, _ = _generate(tmp_path, str(bad))
    assert r.returncode != 0 and re.search(word, r.stderr), r.stderr


def test_python_reader_refuses_duplicate_names_and_inconsistent_decoders(tmp_path):
    ok = {"name": "x", "q_width": 64, "k_width": 32, "eps": 1e-6, "order": "olmo2"}
    shapes = _module("model_shapes")
    bad = tmp_path / "models.json"
    bad.write_text(json.dumps({"models": [ok, ok]}))
    with pytest.raises(ValueError, match="distinct"):
        shapes.load(str(bad))
    dec = dict(ok, decoder={"hidden": 64, "heads": 2, "kv_heads": 2, "head_dim": 32,
                            "mlp_width": 128, "layers": 1})
    bad.write_text(json.dumps({"models": [dec]}))
    with pytest.raises(ValueError, match="heads x head_dim"):
        shapes.load(str(bad))
