"""torch.library.opcheck over torch.ops.swiftqk.qk_norm on a GPU: the schema's mutation and alias
annotations against what the kernel does, the fake kernel against the CUDA one, and the op under
AOT autograd with dynamic shapes."""

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


def _args(comm, tokens, hq, hk, dtype, strided):
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
    q_out = torch.empty(tokens, hq, dtype=out_t, device="cuda")
    k_out = torch.empty(tokens, hk, dtype=out_t, device="cuda")
    return (q, k, wq, wk, q_out, k_out, comm.handle, hq, hk, 1e-6, 0, 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32,
                                   torch.float8_e4m3fn], ids=str)
@pytest.mark.parametrize("tokens,hq,hk", [(1, 2048, 2048), (37, 5120, 1024), (256, 128, 64)])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "fused_qkv_views"])
def test_opcheck(comm, dtype, tokens, hq, hk, strided):
    # The schema check compares every input before and after the call with arithmetic that
    # torch does not implement for float8_e4m3fn; fp8 inputs get the other checks.
    utils = ("test_schema", "test_autograd_registration", "test_faketensor",
             "test_aot_dispatch_dynamic")
    if dtype == torch.float8_e4m3fn:
        utils = utils[1:]
    args = _args(comm, tokens, hq, hk, dtype, strided)
    torch.library.opcheck(torch.ops.swiftqk.qk_norm.default, args, test_utils=utils)
    quick = tuple(u for u in utils if u != "test_aot_dispatch_dynamic")
    for order, method in ((1, 0), (0, 1)):  # llama order; MiniMax fused
        args = args[:10] + (order, method)
        torch.library.opcheck(torch.ops.swiftqk.qk_norm.default, args, test_utils=quick)


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
