"""The op's fake kernel, without a GPU: on meta tensors it refuses what the CUDA kernel refuses,
with the CUDA kernel's messages, and lets good calls through; the op's int codes and the torch
version come from the extension; FallbackCommunicator closes like a Communicator."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")

from conftest import swiftqk_or_skip  # noqa: E402

META = dict(device="meta")


def args(t=8, hq=64, hk=32, dtype=torch.bfloat16, out_dtype=None, **over):
    """A good out-of-place call on meta tensors; `over` replaces any argument by name."""
    out_dtype = out_dtype or (torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype)
    a = dict(q=torch.empty(t, hq, dtype=dtype, **META), k=torch.empty(t, hk, dtype=dtype, **META),
             q_weight=torch.empty(hq, dtype=out_dtype, **META),
             k_weight=torch.empty(hk, dtype=out_dtype, **META),
             q_out=torch.empty(t, hq, dtype=out_dtype, **META),
             k_out=torch.empty(t, hk, dtype=out_dtype, **META),
             comm=0, q_full_width=2 * hq, k_full_width=2 * hk, eps=1e-6, order=0, method=0)
    a.update(over)
    return a


def call(a):
    torch.ops.swiftqk.qk_norm(*a.values())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32,
                                   torch.float8_e4m3fn])
def test_good_calls_pass(dtype):
    swiftqk_or_skip()
    call(args(dtype=dtype))
    call(args(t=0))
    strided = torch.empty(8, 160, dtype=torch.bfloat16, **META)  # views of a fused QKV output
    call(args(q=strided[:, :64], k=strided[:, 64:96]))


BAD = {
    "tokens differ": (dict(k=torch.empty(7, 32, dtype=torch.bfloat16, **META)),
                      "q has 8 tokens, k 7"),
    "int input": (dict(q=torch.empty(8, 64, dtype=torch.int32, **META)), "q has dtype"),
    "dtypes differ": (dict(k=torch.empty(8, 32, dtype=torch.float16, **META)),
                      "q and k dtypes differ"),
    "weight dtype": (dict(q_weight=torch.empty(64, dtype=torch.float32, **META)),
                     "outputs and weights must be"),
    "output dtype": (dict(k_out=torch.empty(8, 32, dtype=torch.float16, **META)),
                     "outputs and weights must be"),
    "order": (dict(order=2), "order must be 0 (olmo2) or 1 (llama)"),
    "1-D q": (dict(q=torch.empty(8, dtype=torch.bfloat16, **META)), "must be 2-D"),
    "output shape": (dict(q_out=torch.empty(8, 48, dtype=torch.bfloat16, **META)),
                     "but its output is"),
    "strided rows": (dict(q=torch.empty(64, 8, dtype=torch.bfloat16, **META).t()),
                     "rows must be contiguous"),
    "weight width": (dict(k_weight=torch.empty(16, dtype=torch.bfloat16, **META)),
                     "k_weight must be a contiguous [32]"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_calls_raise_the_cuda_kernels_message(case):
    swiftqk_or_skip()
    over, message = BAD[case]
    with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        call(args(**over))


def test_cpu_tensors_are_refused_under_fake_tensor_mode():
    swiftqk_or_skip()
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = args(**{k: torch.empty(v.shape, dtype=v.dtype) for k, v in args().items()
                    if isinstance(v, torch.Tensor)})
        with pytest.raises(RuntimeError, match="must be on one CUDA device"):
            call(a)


def test_int_codes_and_versions_come_from_the_extension():
    swiftqk = swiftqk_or_skip()
    assert swiftqk.ORDERS == dict(swiftqk._C.ORDERS) == {"olmo2": 0, "llama": 1}
    assert swiftqk.FUSED_METHODS == {"swiftqk": 0, "minimax_fused": 1}
    assert swiftqk._C.TORCH_VERSION == str(torch.__version__)
    from swiftqk._version import __version__

    assert swiftqk.__version__ == __version__


def test_unknown_order_or_method_is_a_value_error():
    swiftqk = swiftqk_or_skip()
    a = args()
    with pytest.raises(ValueError, match="order must be one of"):
        swiftqk.qk_norm(a["q"], a["k"], a["q_weight"], a["k_weight"], None, 128, 64, 1e-6, "gpt")
    with pytest.raises(ValueError, match="method must be one of"):
        swiftqk.qk_norm(a["q"], a["k"], a["q_weight"], a["k_weight"], None, 128, 64, 1e-6,
                        "olmo2", "all_gather")


def test_fallback_communicator_closes_like_a_communicator():
    swiftqk = swiftqk_or_skip()
    c = swiftqk.FallbackCommunicator(None, 0, 1, 0, "no P2P")
    assert not c.closed
    c.close()
    c.close()
    assert c.closed


def test_fp8_in_place_is_a_value_error():
    # fp8 inputs give bf16 outputs, so an output cannot be its input.
    swiftqk = swiftqk_or_skip()
    a = args(dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="q is float8_e4m3fn .* cannot be normalised in place"):
        swiftqk.qk_norm_(a["q"], a["k"], a["q_weight"], a["k_weight"], None, 128, 64, 1e-6)
    with pytest.raises(ValueError, match="k is float8_e4m3fn"):
        swiftqk.qk_norm_(a["q"], a["k"], a["q_weight"], a["k_weight"], None, 128, 64, 1e-6,
                         q_out=a["q_out"])
