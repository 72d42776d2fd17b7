"""The epilogue op's schema, as python/csrc/swiftqk_epilogue_torch.cpp defines it, under
torch.library.opcheck on the CPU: registered here in a scratch namespace with a float64 reference
kernel (no GPU, no extension needed), out of place and in place (q_out is q, k_out is k) on column
views of one fused QKV tensor, NHD and HND. A schema that does not mark a cache mutated fails the
same check (the negative control). Where the extension is built, its registered schema is the one
read here."""

import os
import re

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
if not hasattr(torch.library, "opcheck"):
    pytest.skip(f"torch {torch.__version__} has no torch.library.opcheck (2.4 and later)",
                allow_module_level=True)

from epilogue_reference import norm_rope_fp64, rope_table  # noqa: E402
from reference import random_rows, random_weight  # noqa: E402

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "csrc",
                      "swiftqk_epilogue_torch.cpp")


def _schema():
    """The schema string of m.def("qk_epilogue(...)") in the C++ source (literals joined)."""
    with open(SOURCE) as f:
        text = f.read()
    call = re.search(r'm\.def\(\s*((?:"[^"]*"\s*)+)\)', text)
    return "".join(re.findall(r'"([^"]*)"', call.group(1)))


def _reference(q, k, v, q_out, k_out, q_weight, k_weight, positions, cos_sin_cache, k_cache,
               v_cache, slot_mapping, k_scale, v_scale, q_scale, comm, head_dim, rotary_dim,
               is_neox, headwise, weight_plus_one, eps, order, kv_layout, pdl=False,
               deterministic=False):
    """TP 1, model-dtype outputs and caches: reads everything before writing anything, as the
    kernel (which supports q_out == q) does per token."""
    rope = dict(head_dim=head_dim, rotary_dim=rotary_dim, is_neox=is_neox, headwise=headwise,
                weight_plus_one=weight_plus_one, eps=eps)
    gq = norm_rope_fp64(q, q_weight, positions, cos_sin_cache, **rope)
    gk = norm_rope_fp64(k, k_weight, positions, cos_sin_cache, **rope)
    v_rows = v.clone()
    q_out.copy_(gq.to(q_out.dtype))
    if k_out is not None:
        k_out.copy_(gk.to(k_out.dtype))
    block_size = k_cache.shape[1 if kv_layout == "NHD" else 2]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        b, o = divmod(slot, block_size)
        for cache, row in ((k_cache, gk[t]), (v_cache, v_rows[t])):
            row = row.view(-1, head_dim).to(cache.dtype)
            if kv_layout == "NHD":
                cache[b, o] = row
            else:
                cache[b, :, o] = row


_LIBS = []


def _define(name, schema):
    lib = torch.library.Library(name, "DEF")
    _LIBS.append(lib)  # a library lives as long as its object
    lib.define(schema)
    lib.impl("qk_epilogue", _reference, "CPU")
    lib.impl("qk_epilogue", lambda *a, **kw: None, "Meta")
    return getattr(torch.ops, name).qk_epilogue.default


@pytest.fixture(scope="module")
def op():
    return _define("swiftqk_epilogue_schema_check", _schema())


def _args(in_place, layout, tokens=9, hq=4, hkv=2, d=64):
    dt = torch.bfloat16
    qkv = torch.cat([random_rows(tokens, hq * d, dt, 1), random_rows(tokens, hkv * d, dt, 2),
                     random_rows(tokens, hkv * d, dt, 3)], dim=-1)
    q, k, v = torch.split(qkv, (hq * d, hkv * d, hkv * d), dim=-1)
    q_out, k_out = (q, k) if in_place else (torch.empty_like(q), torch.empty_like(k))
    shape = (5, 4, hkv, d) if layout == "NHD" else (5, hkv, 4, d)
    slots = torch.randperm(20, generator=torch.Generator().manual_seed(4))[:tokens]
    slots[::3] = -1
    positions = torch.randint(0, 32, (tokens,), generator=torch.Generator().manual_seed(5))
    return (q, k, v, q_out, k_out, random_weight(hq * d, dt, 6), random_weight(hkv * d, dt, 7),
            positions, rope_table(32, d), random_rows(20, hkv * d, dt, 8).view(shape),
            random_rows(20, hkv * d, dt, 9).view(shape), slots, None, None, None, 0, d, d, True,
            False, False, 1e-6, 0, layout, False)


def test_the_schema_marks_exactly_the_outputs_and_caches_mutated():
    schema = _schema()
    assert schema.startswith("qk_epilogue(") and schema.endswith("-> ()")
    # The launch options come last with their defaults, so older call sites keep working.
    assert schema.endswith("bool pdl=False, bool deterministic=False) -> ()")
    assert re.findall(r"Tensor\((\w)!\)\??\s(\w+)", schema) == [
        ("a", "q_out"), ("b", "k_out"), ("c", "k_cache"), ("d", "v_cache")]
    assert re.findall(r"Tensor\??\s(\w+)", schema) == [
        "q", "k", "v", "q_weight", "k_weight", "positions", "cos_sin_cache", "slot_mapping",
        "k_scale", "v_scale", "q_scale"]


@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_opcheck_accepts_the_schema(op, in_place, layout):
    torch.library.opcheck(op, _args(in_place, layout))


def test_the_reference_writes_the_slots_and_only_them(op):
    args = _args(False, "HND")
    before = args[9].clone()
    op(*args)
    written = args[11] >= 0
    k_gold = norm_rope_fp64(args[1], args[6], args[7], args[8], 64, 64)
    blocks, offsets = args[11][written] // 4, args[11][written] % 4
    got = args[9][blocks, :, offsets].reshape(int(written.sum()), -1)
    assert torch.equal(got, k_gold[written].to(torch.bfloat16))
    args[9][blocks, :, offsets] = before[blocks, :, offsets]
    assert torch.equal(args[9], before)


def test_a_schema_without_the_cache_mutation_marks_fails_the_check():
    unmarked = _define("swiftqk_epilogue_schema_unmarked",
                       _schema().replace("Tensor(c!) k_cache", "Tensor k_cache"))
    with pytest.raises(Exception, match="not defined as mutable but was mutated"):
        torch.library.opcheck(unmarked, _args(False, "NHD"), test_utils=("test_schema",))


def test_the_extension_registers_this_schema():
    try:
        import swiftqk  # noqa: F401
    except ImportError as e:
        pytest.skip(f"swiftqk._C is not built here ({e})")
    registered = str(torch.ops.swiftqk.qk_epilogue.default._schema)
    assert registered == str(torch._C.parse_schema("swiftqk::" + _schema()))
