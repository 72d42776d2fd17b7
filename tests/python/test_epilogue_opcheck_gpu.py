"""torch.library.opcheck over torch.ops.swiftqk.qk_epilogue on a GPU: the schema's mutation and
alias annotations (q_out, k_out, both caches) against what the kernel does, in place (q_out is q,
k_out is k) and out of place, the fake kernel against the CUDA one, and the op under AOT autograd
with dynamic shapes; fp8 caches and Q, whose schema check needs a float8 allclose this torch may
lack (test_opcheck_gpu.py's convention)."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")

from conftest import cuda_or_skip, swiftqk_or_skip  # noqa: E402
import epilogue_problem as ep  # noqa: E402
from epilogue_problem import FP8, Problem, Rank, Setup, bits  # noqa: E402


@pytest.fixture(scope="module")
def comm():
    swiftqk = swiftqk_or_skip()
    cuda_or_skip()
    if not hasattr(torch.library, "opcheck"):
        pytest.skip(f"torch {torch.__version__} has no torch.library.opcheck (2.4 and later)")
    return swiftqk.create_local_group([0])[0]


UTILS = ("test_schema", "test_autograd_registration", "test_faketensor",
         "test_aot_dispatch_dynamic")
SETUPS = {
    "nhd_in_place": dict(tokens=37),
    "hnd_out_of_place_k_out": dict(tokens=64, layout="HND", in_place=False, k_out=True),
    "headwise_gptj_partial": dict(tokens=5, headwise=True, order="llama", is_neox=False,
                                  rotary_dim=64),
    "one_token_bf16_table": dict(tokens=1, cs_dtype=torch.bfloat16),
}


def _sync():
    if ep.DEVICE != "cpu":
        torch.cuda.synchronize()


def _args(comm, seed, k_out_is_k=False, **setup):
    r = Rank(Problem(Setup(seed=seed, **setup)))
    r.poison(seed)
    args = list(r.op_args(comm.handle))
    if k_out_is_k:
        args[4] = r.k
    return r, tuple(args)


def _opcheck(args, utils):
    torch.library.opcheck(torch.ops.swiftqk.qk_epilogue.default, args, test_utils=utils)


@pytest.mark.parametrize("name", sorted(SETUPS))
def test_opcheck(comm, name):
    _, args = _args(comm, 10 + sorted(SETUPS).index(name), **SETUPS[name])
    _opcheck(args, UTILS)


def test_opcheck_k_out_in_place(comm):
    # k_out is k: the schema marks only k_out mutated; the schema check sees the alias from the
    # values and must accept k's change.
    _, args = _args(comm, 20, k_out_is_k=True)
    _opcheck(args, UTILS)


FP8_SETUPS = {"fp8_cache": dict(cache_dtype=FP8), "fp8_q_out": dict(q_out_dtype=FP8),
              "fp8_both_hnd": dict(cache_dtype=FP8, q_out_dtype=FP8, layout="HND")}


@pytest.mark.parametrize("name", sorted(FP8_SETUPS))
def test_opcheck_fp8(comm, name):
    """Every opcheck test but the schema check (test_opcheck_schema_fp8 tries that)."""
    _, args = _args(comm, 30 + sorted(FP8_SETUPS).index(name), **FP8_SETUPS[name])
    _opcheck(args, UTILS[1:])


def test_fp8_inputs_are_left_unchanged_and_outputs_written(comm):
    """The schema's contract with fp8 outputs, checked directly: q, k, v, the weights, positions,
    the table, the slots and the scales are not mutated, bit for bit, and q_out is written."""
    r, args = _args(comm, 40, cache_dtype=FP8, q_out_dtype=FP8)
    inputs = (0, 1, 2, 5, 6, 7, 8, 11, 12, 13, 14)
    before = [bits(args[i]).clone() for i in inputs]
    torch.ops.swiftqk.qk_epilogue(*args)
    _sync()
    for i, b in zip(inputs, before):
        assert torch.equal(bits(args[i]), b), i
    assert r.check() == []


def test_opcheck_schema_fp8(comm):
    """opcheck's schema check compares every argument before and after the call with
    torch.allclose; where this torch has no float8_e4m3fn kernel for that, it cannot run and the
    test says so (the test above checks the same contract bitwise)."""
    _, args = _args(comm, 50, cache_dtype=FP8, q_out_dtype=FP8)
    try:
        _opcheck(args, ("test_schema",))
    except Exception as e:  # opcheck wraps the failure in its OpCheckError
        cause = f"{e} {e.__cause__}"
        if "Float8_e4m3fn" in cause and "not implemented" in cause:
            pytest.skip(f"torch {torch.__version__} cannot compare float8_e4m3fn tensors in "
                        f"opcheck's schema check ({str(e.__cause__ or e)[:120]}); "
                        "test_fp8_inputs_are_left_unchanged_and_outputs_written checks the "
                        "contract instead")
        raise


def test_fake_refuses_what_the_kernel_refuses(comm):
    """Each bad call raises a RuntimeError both on the GPU and under FakeTensorMode, the fake's
    message the CUDA kernel's text (which carries validate_epilogue.cpp's file:line in front)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    r, good = _args(comm, 60, tokens=8)
    bad = [
        (2, torch.empty(7, r.kw, dtype=torch.bfloat16, device=r.q.device)),  # tokens
        (5, r.wq.float()),  # weight dtype
        (9, r.k_cache[..., :64]),  # cache head_dim
        (7, r.positions.int()),  # positions dtype
        (21, -1.0),  # eps (validate_epilogue_params)
        (17, 126),  # rotary_dim against the table
        (23, "NDH"),  # layout
    ]
    for i, value in bad:
        args = list(good)
        args[i] = value
        with pytest.raises(RuntimeError) as real:
            torch.ops.swiftqk.qk_epilogue(*args)
        fake_mode = FakeTensorMode()
        fake = [fake_mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with fake_mode, pytest.raises(RuntimeError) as faked:
            torch.ops.swiftqk.qk_epilogue(*fake)
        message = str(faked.value).splitlines()[0]
        assert message in str(real.value), (i, str(real.value), str(faked.value))
