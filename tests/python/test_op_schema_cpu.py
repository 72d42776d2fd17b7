"""The op's schema, as python/csrc/swiftqk_torch.cpp defines it, under torch.library.opcheck on
the CPU: registered here in a scratch namespace with a float64 reference kernel (no GPU, no
extension needed), out of place, in place (each output its own input, as qk_norm_ passes them)
and in place on column views of one fused QKV tensor. A schema that does not mark an output
mutated fails the same check (the negative control). Where the extension is built, its
registered schema is the one read here."""

import os
import re

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
if not hasattr(torch.library, "opcheck"):
    pytest.skip(f"torch {torch.__version__} has no torch.library.opcheck (2.4 and later)",
                allow_module_level=True)

from reference import random_rows, random_weight  # noqa: E402

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "csrc",
                      "swiftqk_torch.cpp")


def _schema():
    """The schema string of m.def("qk_norm(...)") in the C++ source (adjacent literals joined)."""
    with open(SOURCE) as f:
        text = f.read()
    call = re.search(r'm\.def\(\s*((?:"[^"]*"\s*)+)\)', text)
    return "".join(re.findall(r'"([^"]*)"', call.group(1)))


def _reference(q, k, q_weight, k_weight, q_out, k_out, comm, q_full_width, k_full_width, eps,
               order, method, q_scale=1.0, k_scale=1.0, pdl=False, deterministic=False):
    """TP 1: the rows are whole. Reads both inputs before writing either output, as the kernel
    (which supports in == out) does per row."""
    res = []
    for x, w, width, scale in ((q, q_weight, q_full_width, q_scale),
                               (k, k_weight, k_full_width, k_scale)):
        x64 = x.double() * scale
        rstd = torch.rsqrt(x64.square().sum(-1, keepdim=True) / width + eps)
        y = w.double() * (x64 * rstd) if order == 0 else \
            w.double() * (x64 * rstd).to(w.dtype).double()
        res.append(y.to(w.dtype))
    q_out.copy_(res[0])
    k_out.copy_(res[1])


_LIBS = []


def _define(name, schema):
    lib = torch.library.Library(name, "DEF")
    _LIBS.append(lib)  # a library lives as long as its object
    lib.define(schema)
    lib.impl("qk_norm", _reference, "CPU")
    lib.impl("qk_norm", lambda *a, **kw: None, "Meta")
    return getattr(torch.ops, name).qk_norm.default


@pytest.fixture(scope="module")
def op():
    return _define("swiftqk_schema_check", _schema())


def _args(tokens, hq, hk, dtype, layout):
    if layout == "fused_qkv_views":
        qkv = torch.cat([random_rows(tokens, hq, dtype, 1), random_rows(tokens, hk, dtype, 2),
                         random_rows(tokens, hk, dtype, 3)], dim=-1)
        q, k = qkv[:, :hq], qkv[:, hq:hq + hk]
    else:
        q, k = random_rows(tokens, hq, dtype, 1), random_rows(tokens, hk, dtype, 2)
    wq, wk = random_weight(hq, dtype, 4), random_weight(hk, dtype, 5)
    if layout == "out_of_place":
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    else:
        q_out, k_out = q, k
    return (q, k, wq, wk, q_out, k_out, 0, hq, hk, 1e-6, 0, 0)


def test_the_schema_marks_exactly_the_outputs_mutated():
    schema = _schema()
    assert schema.startswith("qk_norm(") and schema.endswith("-> ()")
    assert re.findall(r"Tensor\((\w)!\) (\w+)", schema) == [("a", "q_out"), ("b", "k_out")]
    assert re.findall(r"Tensor (\w+)", schema) == ["q", "k", "q_weight", "k_weight"]


@pytest.mark.parametrize("layout", ["out_of_place", "in_place", "fused_qkv_views"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_opcheck_accepts_the_schema(op, layout, dtype):
    torch.library.opcheck(op, _args(33, 256, 64, dtype, layout))


def test_in_place_writes_the_inputs(op):
    args = _args(9, 128, 64, torch.float32, "in_place")
    q0, k0 = args[0].clone(), args[1].clone()
    op(*args)
    assert not torch.equal(args[0], q0) and not torch.equal(args[1], k0)
    ref_q, ref_k = torch.empty_like(q0), torch.empty_like(k0)
    _reference(q0, k0, *args[2:4], ref_q, ref_k, *args[6:])
    assert torch.equal(args[0], ref_q) and torch.equal(args[1], ref_k)


def test_a_schema_without_the_mutation_marks_fails_the_check():
    unmarked = _define("swiftqk_schema_unmarked",
                       _schema().replace("Tensor(a!) q_out", "Tensor q_out"))
    with pytest.raises(Exception, match="not defined as mutable but was mutated"):
        torch.library.opcheck(unmarked, _args(5, 64, 32, torch.float32, "out_of_place"),
                              test_utils=("test_schema",))


def test_the_extension_registers_this_schema():
    try:
        import swiftqk  # noqa: F401
    except ImportError as e:
        pytest.skip(f"swiftqk._C is not built here ({e})")
    registered = str(torch.ops.swiftqk.qk_norm.default._schema)
    assert registered == str(torch._C.parse_schema("swiftqk::" + _schema()))
