"""The epilogue op's fake kernel, without a GPU: on meta tensors it refuses what the CUDA kernel
and validate_epilogue_params refuse from shapes, strides, dtypes and devices, with their
messages, and lets good calls through (NHD and HND, fp8, headwise, views of a fused QKV)."""

import re

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")

from conftest import swiftqk_or_skip  # noqa: E402

META = dict(device="meta")
BF16 = dict(dtype=torch.bfloat16, device="meta")


def args(t=8, hq=4, hkv=2, d=64, rot=64, layout="NHD", blocks=3, block_size=16, headwise=False,
         **over):
    """A good call on meta tensors (Q, K, V column views of one fused QKV, an NHD or HND cache
    of 3 blocks of 16 slots); `over` replaces any argument by name."""
    qkv = torch.empty(t, (hq + 2 * hkv) * d, **BF16)
    cache = (blocks, block_size, hkv, d) if layout == "NHD" else (blocks, hkv, block_size, d)
    a = dict(q=qkv[:, :hq * d], k=qkv[:, hq * d:(hq + hkv) * d], v=qkv[:, (hq + hkv) * d:],
             q_out=torch.empty(t, hq * d, **BF16), k_out=None,
             q_weight=torch.empty(d if headwise else hq * d, **BF16),
             k_weight=torch.empty(d if headwise else hkv * d, **BF16),
             positions=torch.empty(t, dtype=torch.int64, **META),
             cos_sin_cache=torch.empty(128, rot, dtype=torch.float32, **META),
             k_cache=torch.empty(cache, **BF16), v_cache=torch.empty(cache, **BF16),
             slot_mapping=torch.empty(t, dtype=torch.int64, **META),
             k_scale=None, v_scale=None, q_scale=None, comm=0, head_dim=d, rotary_dim=rot,
             is_neox=True, headwise=headwise, weight_plus_one=False, eps=1e-6, order=0,
             kv_layout=layout, pdl=False)
    a.update(over)
    return a


def call(a):
    torch.ops.swiftqk.qk_epilogue(*a.values())


def scalar():
    return torch.empty(1, dtype=torch.float32, **META)


def fp8(*shape):
    return torch.empty(*shape, dtype=torch.float8_e4m3fn, **META)


def test_good_calls_pass():
    swiftqk_or_skip()
    call(args())
    call(args(t=0))
    call(args(layout="HND"))
    call(args(headwise=True, weight_plus_one=True))
    call(args(rot=32, is_neox=False, k_out=torch.empty(8, 128, **BF16)))
    call(args(cos_sin_cache=torch.empty(128, 64, **BF16)))
    call(args(k_cache=fp8(3, 16, 2, 64), v_cache=fp8(3, 16, 2, 64), k_scale=scalar(),
              v_scale=scalar()))
    call(args(q_out=fp8(8, 256), q_scale=scalar()))
    a = args()
    a["q_out"], a["k_out"] = a["q"], a["k"]  # in place
    call(a)
    # A cache whose blocks are padded, or permuted from another layout, still nests.
    call(args(k_cache=torch.empty(3, 20, 2, 64, **BF16)[:, :16],
              v_cache=torch.empty(3, 20, 2, 64, **BF16)[:, :16]))
    hnd = torch.empty(3, 2, 16, 64, **BF16).transpose(1, 2)  # NHD view of HND memory
    call(args(k_cache=hnd, v_cache=torch.empty(3, 2, 16, 64, **BF16).transpose(1, 2)))


def _two(shape, **kw):
    return dict(k_cache=torch.empty(shape, **kw), v_cache=torch.empty(shape, **kw))


BAD = {
    # The binding's own checks (python/csrc/swiftqk_epilogue_torch.cpp).
    "1-D q": (dict(q=torch.empty(8, **BF16)), "q must be 2-D"),
    "tokens differ": (dict(v=torch.empty(7, 128, **BF16)), "v has 7 tokens but q has 8"),
    "strided rows": (dict(q=torch.empty(256, 8, **BF16).t()), "q rows must be contiguous"),
    "int input": (dict(q=torch.empty(8, 256, dtype=torch.int32, **META)), "q has dtype Int; "),
    "k dtype": (dict(k=torch.empty(8, 128, dtype=torch.float16, **META)),
                "k has dtype Half but q has BFloat16"),
    "weight dtype": (dict(q_weight=torch.empty(256, dtype=torch.float32, **META)),
                     "q_weight has dtype"),
    "head_dim 0": (dict(head_dim=0), "head_dim must be > 0, got 0"),
    "q width": (dict(head_dim=48), "q has 256 columns, not a multiple of head_dim = 48"),
    "v width": (dict(v=torch.empty(8, 64, **BF16)), "v has 64 columns but k has 128"),
    "q_out width": (dict(q_out=torch.empty(8, 192, **BF16)), "q_out has 192 columns"),
    "k_out width": (dict(k_out=torch.empty(8, 64, **BF16)), "k_out has 64 columns"),
    "weight width": (dict(k_weight=torch.empty(64, **BF16)), "k_weight must be a contiguous [128]"),
    "headwise weight": (dict(headwise=True, q_weight=torch.empty(256, **BF16)),
                        "q_weight must be a contiguous [64] weight (headwise"),
    "positions dtype": (dict(positions=torch.empty(8, dtype=torch.int32, **META)),
                        "positions must be a contiguous int64 [tokens] = [8] tensor, got Int [8]"),
    "slots length": (dict(slot_mapping=torch.empty(9, dtype=torch.int64, **META)),
                     "slot_mapping must be a contiguous int64"),
    "cos_sin 1-D": (dict(cos_sin_cache=torch.empty(128, **META)),
                    "cos_sin_cache must be a contiguous 2-D"),
    "cos_sin width": (dict(rotary_dim=32), "cos_sin_cache has 64 columns but rotary_dim is 32"),
    "order": (dict(order=2), "order must be 0 (olmo2) or 1 (llama), got 2"),
    "layout": (dict(kv_layout="NDH"), 'kv_layout must be "NHD" or "HND", got "NDH"'),
    "3-D cache": (_two((3, 16, 128), **BF16), "k_cache must be 4-D"),
    "caches differ": (dict(v_cache=torch.empty(4, 16, 2, 64, **BF16)),
                      "v_cache must have k_cache's shape and strides"),
    "cache dtypes differ": (dict(v_cache=torch.empty(3, 16, 2, 64, dtype=torch.float16, **META)),
                            "v_cache has dtype"),
    "cache heads": (_two((3, 16, 4, 64), **BF16), "k_cache is [3, 16, 4, 64] in layout NHD but k "
                    "has 2 KV heads"),
    "HND as NHD": (dict(base=dict(layout="HND"), kv_layout="NHD"),
                   "in layout NHD but k has 2 KV heads"),
    "cache head_dim stride": (dict(k_cache=torch.empty(3, 16, 2, 128, **BF16)[..., ::2],
                                   v_cache=torch.empty(3, 16, 2, 128, **BF16)[..., ::2]),
                              "k_cache's last dimension (head_dim) must have stride 1"),
    "scale dtype": (dict(k_scale=torch.empty(1, dtype=torch.float16, **META)),
                    "k_scale must be a float32 tensor of one element, got Half [1]"),
    "scale size": (dict(q_scale=torch.empty(2, dtype=torch.float32, **META)),
                   "q_scale must be a float32 tensor of one element"),
    "fp8 cos_sin": (dict(cos_sin_cache=fp8(128, 64)), "rope.cache_dtype must be f32 or the model"),
    # validate_epilogue_params' checks (src/validate_epilogue.cpp), its messages.
    "f32 model": (dict(q=torch.empty(8, 256, dtype=torch.float32, **META),
                       k=torch.empty(8, 128, dtype=torch.float32, **META),
                       v=torch.empty(8, 128, dtype=torch.float32, **META),
                       q_weight=torch.empty(256, dtype=torch.float32, **META),
                       k_weight=torch.empty(128, dtype=torch.float32, **META)),
                  "dtype: the epilogue takes bf16 or f16 models (q, k, v, weights), got f32"),
    "no q heads": (dict(q=torch.empty(8, 0, **BF16), q_out=torch.empty(8, 0, **BF16),
                        q_weight=torch.empty(0, **BF16)), "num_q_heads must be > 0, got 0"),
    "odd head_dim": (dict(head_dim=3, rotary_dim=2, cos_sin_cache=torch.empty(128, 2, **META),
                          q=torch.empty(8, 12, **BF16), k=torch.empty(8, 6, **BF16),
                          v=torch.empty(8, 6, **BF16), q_out=torch.empty(8, 12, **BF16),
                          q_weight=torch.empty(12, **BF16), k_weight=torch.empty(6, **BF16),
                          **_two((3, 16, 2, 3), **BF16)), "head_dim must be even, got 3"),
    "eps": (dict(eps=-1.0), "eps must be finite and > 0, got -1.000000"),
    "eps underflows": (dict(eps=1e-50), "eps must be finite and > 0, got 0.000000"),
    "plus one layerwise": (dict(weight_plus_one=True), "weight_plus_one (Gemma-3's 1 + w) needs "
                           "scope == NormScope::kHeadwise"),
    "q_out dtype": (dict(q_out=torch.empty(8, 256, dtype=torch.float16, **META)),
                    "q_out_dtype must be the model dtype bf16 or f8e4m3, got f16"),
    "overlapping rows": (dict(q=torch.empty(300, **BF16).as_strided((8, 256), (4, 1))),
                         "q_stride 4 is smaller than the row width num_q_heads x head_dim = 256"),
    "odd rotary_dim": (dict(rotary_dim=63, cos_sin_cache=torch.empty(128, 63, **META)),
                       "rope.rotary_dim must be even and in [2, head_dim = 64], got 63"),
    "rotary_dim past head_dim": (dict(rotary_dim=66, cos_sin_cache=torch.empty(128, 66, **META)),
                                 "rope.rotary_dim must be even and in [2, head_dim = 64], got 66"),
    "no positions table": (dict(cos_sin_cache=torch.empty(0, 64, **META)),
                           "rope.max_position must be >= 1, got 0"),
    "f16 cos_sin": (dict(cos_sin_cache=torch.empty(128, 64, dtype=torch.float16, **META)),
                    "rope.cache_dtype must be f32 or the model dtype bf16, got f16"),
    "f16 cache": (_two((3, 16, 2, 64), dtype=torch.float16, **META),
                  "cache.dtype must be the model dtype bf16 or f8e4m3, got f16"),
    "no blocks": (_two((0, 16, 2, 64), **BF16), "cache.num_blocks must be >= 1, got 0"),
    "empty blocks": (_two((3, 0, 2, 64), **BF16), "cache.block_size must be >= 1, got 0"),
    "blocks overlap": (dict(k_cache=torch.empty(4096, **BF16).as_strided((3, 16, 2, 64),
                                                                         (1024, 128, 64, 1)),
                            v_cache=torch.empty(4096, **BF16).as_strided((3, 16, 2, 64),
                                                                         (1024, 128, 64, 1))),
                       "cache geometry: cache.block_stride 1024 is smaller than cache.slot_stride "
                       "x cache.block_size = 128 x 16 = 2048"),
    "slots share an address": (dict(k_cache=torch.empty(16, 2, 64, **BF16).expand(3, -1, -1, -1),
                                    v_cache=torch.empty(16, 2, 64, **BF16).expand(3, -1, -1, -1)),
                               "cache geometry: cache.block_stride is 0 but cache.num_blocks is 3"),
    "fp8 q_out without scale": (dict(q_out=fp8(8, 256)),
                                "q_out_scale (needed by an fp8 q_out) is null"),
    "fp8 cache without k_scale": (dict(k_cache=fp8(3, 16, 2, 64), v_cache=fp8(3, 16, 2, 64),
                                       v_scale=scalar()),
                                  "cache.k_scale (needed by an fp8 cache) is null"),
    "fp8 cache without v_scale": (dict(k_cache=fp8(3, 16, 2, 64), v_cache=fp8(3, 16, 2, 64),
                                       k_scale=scalar()),
                                  "cache.v_scale (needed by an fp8 cache) is null"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_calls_raise_the_kernels_message(case):
    swiftqk_or_skip()
    over, message = dict(BAD[case][0]), BAD[case][1]
    a = args(**over.pop("base", {}))
    a.update(over)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        call(a)


def test_fp8_scales_are_not_needed_without_tokens():
    # validate_epilogue_params returns before its pointer checks when there is nothing to do.
    swiftqk_or_skip()
    call(args(t=0, q_out=fp8(0, 256), k_cache=fp8(3, 16, 2, 64), v_cache=fp8(3, 16, 2, 64)))


def test_cpu_tensors_are_refused_under_fake_tensor_mode():
    swiftqk_or_skip()
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = {k: (torch.empty(v.shape, dtype=v.dtype) if isinstance(v, torch.Tensor) else v)
             for k, v in args().items()}
        with pytest.raises(RuntimeError, match="must be on a CUDA device, got cpu"):
            call(a)


def test_a_tensor_on_another_device_is_refused():
    swiftqk_or_skip()
    with pytest.raises(RuntimeError, match="positions is on cpu but q is on meta"):
        call(args(positions=torch.empty(8, dtype=torch.int64)))


def test_front_refuses_unknown_order_and_layout():
    swiftqk = swiftqk_or_skip()
    a = args()
    kw = {k: a[k] for k in ("q_weight", "k_weight", "positions", "cos_sin_cache", "k_cache",
                            "v_cache", "slot_mapping")}
    with pytest.raises(ValueError, match="order must be one of"):
        swiftqk.qk_epilogue(a["q"], a["k"], a["v"], comm=None, head_dim=64, order="gemma", **kw)
    with pytest.raises(ValueError, match="kv_layout must be one of"):
        swiftqk.qk_epilogue(a["q"], a["k"], a["v"], comm=None, head_dim=64, kv_layout="nhd", **kw)


def test_the_schema_marks_exactly_the_outputs_and_caches_mutated():
    swiftqk_or_skip()
    schema = str(torch.ops.swiftqk.qk_epilogue.default._schema)
    assert re.findall(r"Tensor\((\w)!\)\??\s(\w+)", schema) == [
        ("a", "q_out"), ("b", "k_out"), ("c", "k_cache"), ("d", "v_cache")]
    assert "Tensor(b!)? k_out" in schema and schema.endswith("-> ()")
