"""torch.library.opcheck over torch.ops.swiftqk.qk_norm on a GPU: the schema's mutation and alias
annotations against what the kernel does, out of place and in place (each output its input, as
qk_norm_ passes them), the fake kernel against the CUDA one, and the op under AOT autograd with
dynamic shapes."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")

from conftest import cuda_or_skip, swiftqk_or_skip  # noqa: E402


@pytest.fixture(scope="module")
def comm():
    swiftqk = swiftqk_or_skip()
    cuda_or_skip()
    if not hasattr(torch.library, "opcheck"):
        pytest.skip(f"torch {torch.__version__} has no torch.library.opcheck (2.4 and later)")
    return swiftqk.create_local_group([0])[0]


def _args(comm, tokens, hq, hk, dtype, strided, in_place=False):
    out_t = torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype
    g = torch.Generator(device="cuda").manual_seed(tokens + hq)
    if strided:  # q and k as column views of one fused QKV output
        qkv = torch.randn(tokens, hq + 2 * hk, device="cuda", generator=g).to(dtype)
        q, k = qkv[:, :hq], qkv[:, hq:hq + hk]
    else:
        q = torch.randn(tokens, hq, device="cuda", generator=g).to(dtype)
        k = torch.randn(tokens, hk, device="cuda", generator=g).to(dtype)
    wq = torch.rand(hq, device="cuda", generator=g).to(out_t) + 0.5
    wk = torch.rand(hk, device="cuda", generator=g).to(out_t) + 0.5
    if in_place:  # what qk_norm_ passes by default: each output is its input
        q_out, k_out = q, k
    else:
        q_out = torch.empty(tokens, hq, dtype=out_t, device="cuda")
        k_out = torch.empty(tokens, hk, dtype=out_t, device="cuda")
    return (q, k, wq, wk, q_out, k_out, comm.handle, hq, hk, 1e-6, 0, 0)


UTILS = ("test_schema", "test_autograd_registration", "test_faketensor",
         "test_aot_dispatch_dynamic")
SHAPES = [(1, 2048, 2048), (37, 5120, 1024), (256, 128, 64)]


def _opcheck(args, utils):
    torch.library.opcheck(torch.ops.swiftqk.qk_norm.default, args, test_utils=utils)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("tokens,hq,hk", SHAPES)
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "fused_qkv_views"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
def test_opcheck(comm, dtype, tokens, hq, hk, strided, in_place):
    # In place, q_out is q (and k_out k): the schema marks only the outputs mutated, and the
    # schema check, which sees the aliasing from the values, must accept the input's change.
    args = _args(comm, tokens, hq, hk, dtype, strided, in_place)
    _opcheck(args, UTILS)
    quick = tuple(u for u in UTILS if u != "test_aot_dispatch_dynamic")
    for order, method in ((1, 0), (0, 1)):  # llama order; MiniMax fused
        _opcheck(args[:10] + (order, method), quick)


@pytest.mark.parametrize("tokens,hq,hk", SHAPES)
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "fused_qkv_views"])
def test_opcheck_fp8_input(comm, tokens, hq, hk, strided):
    """fp8 input (bf16 outputs, so never in place): every opcheck test but the schema check,
    which the next two tests cover."""
    _opcheck(_args(comm, tokens, hq, hk, torch.float8_e4m3fn, strided), UTILS[1:])


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "fused_qkv_views"])
def test_fp8_input_is_left_bitwise_unchanged_and_outputs_written(comm, strided):
    """The schema's contract for fp8 input, checked directly: the fp8 q and k (and the weights)
    are not mutated, bit for bit, and both outputs are written."""
    args = list(_args(comm, 37, 5120, 1024, torch.float8_e4m3fn, strided))
    before = [a.view(torch.uint8).clone() if a.dtype == torch.float8_e4m3fn else a.clone()
              for a in args[:4]]
    args[4].fill_(float("nan"))
    args[5].fill_(float("nan"))
    torch.ops.swiftqk.qk_norm(*args)
    torch.cuda.synchronize()
    for a, b in zip(args[:4], before):
        after = a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a
        assert torch.equal(after, b)
    assert torch.isfinite(args[4]).all() and torch.isfinite(args[5]).all()


def test_opcheck_schema_fp8_input(comm):
    """opcheck's schema check compares every input before and after the call with
    torch.allclose; where this torch has no float8_e4m3fn kernel for that, it cannot run and the
    test says so (the test above checks the same contract bitwise)."""
    args = _args(comm, 37, 5120, 1024, torch.float8_e4m3fn, True)
    try:
        _opcheck(args, ("test_schema",))
    except Exception as e:  # opcheck wraps the failure in its OpCheckError
        cause = f"{e} {e.__cause__}"
        if "Float8_e4m3fn" in cause and "not implemented" in cause:
            pytest.skip(f"torch {torch.__version__} cannot compare float8_e4m3fn tensors in "
                        f"opcheck's schema check ({str(e.__cause__ or e)[:120]}); "
                        "test_fp8_input_is_left_bitwise_unchanged_and_outputs_written checks "
                        "the contract instead")
        raise


def test_fake_refuses_what_the_kernel_refuses(comm):
    """Each bad call raises a RuntimeError both on the GPU and under FakeTensorMode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    good = _args(comm, 8, 256, 128, torch.bfloat16, False)
    bad = [
        dict(i=1, t=torch.empty(7, 128, dtype=torch.bfloat16, device="cuda")),  # tokens
        dict(i=2, t=torch.empty(256, dtype=torch.float32, device="cuda")),  # weight dtype
        dict(i=4, t=torch.empty(8, 200, dtype=torch.bfloat16, device="cuda")),  # output shape
        dict(i=0, t=torch.empty(256, 8, dtype=torch.bfloat16, device="cuda").t()),  # strided
        dict(i=10, t=3),  # order
    ]
    for b in bad:
        args = list(good)
        args[b["i"]] = b["t"]
        with pytest.raises(RuntimeError) as real:
            torch.ops.swiftqk.qk_norm(*args)
        fake_mode = FakeTensorMode()
        fake = [fake_mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with fake_mode, pytest.raises(RuntimeError) as faked:
            torch.ops.swiftqk.qk_norm(*fake)
        # The same check fires: the messages share their text after the "swiftqk.qk_norm: ".
        first = str(real.value).split("swiftqk.qk_norm: ")[1].split()[:3]
        assert " ".join(first) in str(faked.value), (str(real.value), str(faked.value))
