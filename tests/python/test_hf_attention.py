"""A TP attention block built on this package against Hugging Face transformers' Olmo2Attention
(Olmo2 norm order) and OlmoeAttention (Llama order) run on the unsharded weights, with small
random weights (nothing downloaded). On CPU: the torch methods over gloo processes. On a GPU:
the fused methods too, and the fused epilogue writing a paged KV cache, with ranks as processes
sharing the GPU through CUDA IPC."""

import gc
import os
import sys

import pytest
torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import swiftqk_or_skip
from reference import init_method

transformers = pytest.importorskip("transformers", reason="transformers is not installed here")



def _hf_layer(kind, dtype, device):
    torch.manual_seed(0)
    if kind == "olmo2":
        from transformers.models.olmo2 import modeling_olmo2 as m

        cfg = transformers.Olmo2Config(hidden_size=256, num_attention_heads=8,
                                       num_key_value_heads=8, intermediate_size=512,
                                       rms_norm_eps=1e-6, attn_implementation="sdpa")
        attn, rope = m.Olmo2Attention(cfg, 0), m.Olmo2RotaryEmbedding(cfg)
    else:
        from transformers.models.olmoe import modeling_olmoe as m

        cfg = transformers.OlmoeConfig(hidden_size=256, num_attention_heads=8,
                                       num_key_value_heads=8, intermediate_size=512,
                                       rms_norm_eps=1e-5, attn_implementation="sdpa")
        attn, rope = m.OlmoeAttention(cfg, 0), m.OlmoeRotaryEmbedding(cfg)
    with torch.no_grad():
        for p in (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, attn.o_proj.weight):
            p.normal_(0.0, 0.05)
        attn.q_norm.weight.uniform_(0.5, 1.5)
        attn.k_norm.weight.uniform_(0.5, 1.5)
    return cfg, attn.to(dtype=dtype, device=device).eval(), rope.to(device)


def _rope_table(rope, x, head_dim, max_position=64):
    """The rotary embedding's own table as qk_epilogue takes it: [max_position, head_dim], the
    cos half then the sin half of each row (HF's cos and sin are each those halves twice)."""
    pos = torch.arange(max_position, device=x.device)[None]
    cos, sin = rope(x.float(), pos)  # fp32, as the rotary embedding computes them
    half = head_dim // 2
    return torch.cat([cos[0, :, :half], sin[0, :, :half]], dim=-1).contiguous()


def _case(case, device, comm):
    """One (kind, method, dtype, fused epilogue) case on this rank: the relative error against
    HF's attention on the unsharded weights, or a string saying how it failed."""
    import swiftqk
    from swiftqk.tp_attention import TPAttention

    kind, method, dtype_name, fused_epilogue = case
    dtype = getattr(torch, dtype_name)
    cfg, attn, rope = _hf_layer(kind, dtype, device)
    torch.manual_seed(1)
    x = torch.randn(2, 12, cfg.hidden_size, dtype=dtype, device=device)
    pos = torch.arange(12, device=device).unsqueeze(0).expand(2, -1)
    cos, sin = rope(x, pos)
    with torch.no_grad():
        ref, _ = attn(x, (cos, sin), None)
        head_dim = cfg.hidden_size // cfg.num_attention_heads
        fused = dict(fused_epilogue=True, cos_sin_cache=_rope_table(rope, x, head_dim)) \
            if fused_epilogue else {}
        tp = TPAttention(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight,
                         attn.o_proj.weight, attn.q_norm.weight, attn.k_norm.weight,
                         cfg.num_attention_heads, cfg.num_key_value_heads, head_dim,
                         cfg.rms_norm_eps, "olmo2" if kind == "olmo2" else "llama",
                         comm if method in ("swiftqk", "minimax_fused") else None,
                         method, dist.group.WORLD, **fused)
        if fused_epilogue:  # K and V go through a paged cache of 3 blocks per sequence
            cache = swiftqk.PagedKVCache(2, 12, tp.hkv, head_dim, block_size=4, dtype=dtype,
                                         device=device)
            out = tp(x, positions=pos, kv_cache=cache)
        else:
            out = tp(x, cos.to(dtype), sin.to(dtype))
    # fp32: close to HF; bf16: within a few bf16 ulps of the output's scale.
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    return err if err <= tol else f"relative error {err:.3e} > {tol}"


def _run(rank, world, rendezvous, cases, device_kind, results):
    """Every case in one process group: starting the processes (torch, CUDA, the group) takes
    far longer than a case, so the cases of one TP degree share them, and a communicator."""
    sys.path.insert(0, os.path.dirname(__file__))
    import swiftqk

    # "cuda": every rank on GPU 0 (processes time-slice it); "cuda_per_rank": rank r on GPU r,
    # with NCCL for the process group, as an engine runs.
    gpu = rank if device_kind == "cuda_per_rank" else 0
    device = torch.device("cpu") if device_kind == "cpu" else torch.device("cuda", gpu)
    if device.type == "cuda":
        torch.cuda.set_device(gpu)
    dist.init_process_group("nccl" if device_kind == "cuda_per_rank" else "gloo",
                            init_method=rendezvous, rank=rank, world_size=world)
    comm = None
    completed = False
    try:
        if any(c[1] in ("swiftqk", "minimax_fused") for c in cases):
            comm = swiftqk.communicator_from_group(dist.group.WORLD, device=gpu, timeout_s=30.0)
        for case in cases:
            try:
                results[(rank,) + tuple(case)] = _case(case, device, comm)
            except Exception as e:  # noqa: BLE001
                # Reported by name. The peers may be inside this case's collectives, so this rank
                # runs no further case: its exit ends their waits with an error.
                results[(rank,) + tuple(case)] = f"{type(e).__name__}: {e}"
                return
        completed = True
    finally:
        if comm is not None:
            comm.close()
        if completed:
            # Every rank past its last collective, and the cases' tensors freed, before the
            # group goes: gloo's worker threads must hold no work when it is destroyed.
            gc.collect()
            dist.barrier()
        dist.destroy_process_group()


def _check_cases(world, cases, device_kind):
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_run, args=(world, init_method(), cases, device_kind, results), nprocs=world)
    bad = {r: v for r, v in results.items() if isinstance(v, str)}
    assert not bad and len(results) == world * len(cases), (bad, len(results))


def _check(world, kind, method, dtype_name, device_kind, fused_epilogue=False):
    _check_cases(world, [(kind, method, dtype_name, fused_epilogue)], device_kind)


KINDS = ["olmo2", "olmoe"]


@pytest.mark.parametrize("world", [1, 2, 4])
def test_matches_hf_on_cpu(world):
    swiftqk_or_skip()
    _check_cases(world, [(kind, method, "float32", False) for kind in KINDS
                         for method in ("all_gather", "minimax_eager")], "cpu")


@pytest.mark.parametrize("world", [1, 2, 4])
def test_fused_matches_hf_on_gpu(world):
    swiftqk_or_skip()
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine: GPU test skipped")
    _check_cases(world, [(kind, method, dtype_name, False) for kind in KINDS
                         for method in ("swiftqk", "minimax_fused")
                         for dtype_name in ("float32", "bfloat16")], "cuda")


@pytest.mark.parametrize("world", [1, 2])
def test_fused_epilogue_matches_hf_on_gpu(world):
    # TPAttention(fused_epilogue=True): norm, RoPE and the paged KV-cache write in one
    # swiftqk.qk_epilogue call, attention reading K and V back from the cache.
    swiftqk_or_skip()
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU on this machine: GPU test skipped")
    _check_cases(world, [(kind, "swiftqk", "bfloat16", True) for kind in KINDS], "cuda")
