"""swiftqk.qk_epilogue (torch.ops.swiftqk.qk_epilogue) on a GPU: against Hugging Face's own
norm + RoPE + cache-write chain, against float64 (both RoPE styles, full and partial rotary, NHD
and HND, fp8 cache and fp8 Q, headwise norms), with ranks as processes sharing one GPU (CUDA IPC,
gloo for the bootstrap), bad positions and slots raised by name with nothing of their token
written, CUDA-graph replays with changed inputs, and torch.compile. Inputs are random (never
zeros); outputs and caches are poisoned before each call."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
import torch.multiprocessing as mp  # noqa: E402

import epilogue_problem as ep  # noqa: E402
from epilogue_problem import FP8, Problem, Rank, Setup, bits  # noqa: E402
from epilogue_reference import cache_rows, partner_index  # noqa: E402
from reference import init_method, rank_sharing_gpu0  # noqa: E402


def _sync():
    if ep.DEVICE != "cpu":
        torch.cuda.synchronize()


def _run(sq, s, comm=None, seed=0):
    comm = comm or sq.create_local_group([0])[0]
    r = Rank(Problem(s))
    r.poison(100 + seed)
    r.call(sq, comm)
    _sync()
    comm.check_error()
    return r


# ---- against Hugging Face's own chain -------------------------------------------------------

def _hf_norm(kind, width, weight, eps):
    if kind == "olmo2":  # layerwise: one RMS over the whole projected Q (or K)
        from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm as Norm
    else:  # Qwen3: one RMS per head (LlamaRMSNorm's order)
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm as Norm
    norm = Norm(width, eps=eps)
    with torch.no_grad():
        norm.weight.copy_(weight.float())
    return norm.to(dtype=weight.dtype, device=weight.device)


@pytest.mark.parametrize("kind", ["olmo2", "qwen3"])
def test_matches_hugging_face_chain(sq, kind):
    pytest.importorskip("transformers", reason="transformers is not installed here")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    headwise = kind == "qwen3"
    s = Setup(tokens=61, q_heads=8, kv_heads=4, headwise=headwise,
              order="llama" if headwise else "olmo2", seed=11)
    r = _run(sq, s)
    p, d, t = r.p, s.head_dim, s.tokens
    dev = r.q.device
    # HF: the norm (rounded to bf16), then rotate_half RoPE in bf16 with cos/sin of the same
    # table, each as [T, head_dim] (HF's emb = cat(freqs, freqs), cast to the model dtype).
    half = s.rotary_dim // 2
    rows = p.cos_sin[p.positions]
    cos = torch.cat([rows[:, :half]] * 2, -1).to(s.dtype).to(dev)
    sin = torch.cat([rows[:, half:]] * 2, -1).to(s.dtype).to(dev)
    with torch.no_grad():
        q, k = p.q.to(dev), p.k.to(dev)
        if headwise:
            nq = _hf_norm(kind, d, p.wq.to(dev), s.eps)(q.view(t, -1, d))
            nk = _hf_norm(kind, d, p.wk.to(dev), s.eps)(k.view(t, -1, d))
        else:
            nq = _hf_norm(kind, q.shape[1], p.wq.to(dev), s.eps)(q).view(t, -1, d)
            nk = _hf_norm(kind, k.shape[1], p.wk.to(dev), s.eps)(k).view(t, -1, d)
        hq, hk = apply_rotary_pos_emb(nq, nk, cos, sin, unsqueeze_dim=1)
    # HF rounds to bf16 after the norm, after each product and after the sum: about 3 u of the
    # pair's magnitude (|a| + |b|, which bounds every intermediate), against the fused kernel's
    # 1.25-2.25 u and the bf16 cos/sin HF takes (1 u more): 8 u (4 bf16 ulps) of the pair.
    partner = partner_index(d, s.rotary_dim, s.is_neox)

    def wrong(got, want):
        want = want.double().cpu()
        got = got.double().cpu().view(want.shape)
        bound = 8 * 2.0**-8 * (want.abs() + want[..., partner].abs()) + 1e-30
        return int((~((got - want).abs() <= bound)).sum())

    assert wrong(r.q_out, hq) == 0
    valid = p.slots >= 0
    slots = p.slots[valid].to(dev)
    k_rows = cache_rows(r.k_cache, slots, s.layout, s.block_size)
    assert wrong(k_rows, hk[valid.to(dev)]) == 0
    v_rows = cache_rows(r.v_cache, slots, s.layout, s.block_size)  # HF's index copy of V
    assert torch.equal(bits(v_rows.cpu()), bits(p.v[valid]))
    assert r.check() == []  # and every other cache element is unchanged


# ---- against float64 ------------------------------------------------------------------------

CASES = {
    # RoPE styles x full and partial rotary (64 of 128, MiniMax-M2's) x cache layouts.
    **{f"{'neox' if neox else 'gptj'}_rot{rot}_{layout}": dict(is_neox=neox, rotary_dim=rot,
                                                              layout=layout)
       for neox in (True, False) for rot in (128, 64) for layout in ("NHD", "HND")},
    "llama_order_k_out": dict(order="llama", k_out=True, in_place=False),
    "f16_f16_table": dict(dtype=torch.float16, cs_dtype=torch.float16, layout="HND"),
    "one_token": dict(tokens=1),
    "many_tokens": dict(tokens=700, q_heads=16, kv_heads=2),
    "fp8_cache_nhd": dict(cache_dtype=FP8),
    "fp8_cache_hnd_partial": dict(cache_dtype=FP8, layout="HND", rotary_dim=64, is_neox=False),
    "fp8_q_out": dict(q_out_dtype=FP8, order="llama"),
    "fp8_q_out_and_cache": dict(q_out_dtype=FP8, cache_dtype=FP8, k_out=True),
    "qwen3_headwise": dict(headwise=True, order="llama", q_heads=16, kv_heads=4),
    "gemma3_headwise": dict(headwise=True, weight_plus_one=True, q_heads=8, kv_heads=2,
                            layout="HND"),
    "no_padding_block_1": dict(padding=0.0, block_size=1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_float64(sq, case):
    r = _run(sq, Setup(seed=20 + sorted(CASES).index(case), **CASES[case]))
    assert r.check() == []


def _tp_rank(rank, world, rendezvous, results):
    with rank_sharing_gpu0(rank, world, rendezvous) as (swiftqk, comm):
        errors = {}
        for name in ("neox_rot128_NHD", "gptj_rot64_HND", "fp8_q_out_and_cache",
                     "qwen3_headwise", "llama_order_k_out"):
            s = Setup(seed=40 + len(errors), **CASES[name])
            r = Rank(Problem(s), world, rank)
            r.poison(200 + rank)
            r.call(swiftqk, comm)
            torch.cuda.synchronize()
            comm.check_error()
            errors[name] = r.check()
        results[rank] = {k: v for k, v in errors.items() if v}


def test_tp2_processes_sharing_one_gpu(sq):
    # Layerwise, the two ranks exchange partial sums through CUDA IPC (both must be resident at
    # once, hence processes); each rank writes its heads of Q and its own cache.
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_tp_rank, args=(2, init_method(), results), nprocs=2)
    assert dict(results) == {0: {}, 1: {}}


def _written(r):
    """What a rank wrote, as numpy bit patterns: its q_out, and its K and V cache rows of the
    written slots ([written tokens, its kv heads, head_dim], in token order)."""
    s = r.s
    slots = r.slots.cpu()
    keep = slots >= 0
    blocks, offsets = slots[keep] // s.block_size, slots[keep] % s.block_size
    k, v = r.k_cache.cpu(), r.v_cache.cpu()
    if s.layout == "NHD":
        k, v = k[blocks, offsets], v[blocks, offsets]
    else:
        k, v = k[blocks, :, offsets], v[blocks, :, offsets]
    import numpy  # noqa: F401  (tensor.numpy needs it; the test skips without it)

    return tuple(bits(t).numpy() for t in (r.q_out.cpu(), k, v))


def _det_rank(rank, world, rendezvous, results):
    with rank_sharing_gpu0(rank, world, rendezvous) as (swiftqk, comm):
        r = Rank(Problem(Setup(**_DET_SETUP)), world, rank)
        r.poison(500 + rank)
        swiftqk.qk_epilogue(r.q, r.k, r.v, deterministic=True, **r.kwargs(comm))
        torch.cuda.synchronize()
        comm.check_error()
        results[rank] = _written(r)


_DET_SETUP = dict(tokens=97, q_heads=8, kv_heads=4, order="olmo2", seed=77)


def test_deterministic_tp2_processes_write_tp1s_bits(sq):
    # The TP-invariant mode across processes: the two ranks' heads, put side by side, are TP 1's
    # bytes (Q rows, and the K and V rows of every written slot).
    np = pytest.importorskip("numpy", reason="numpy is not installed here")
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_det_rank, args=(2, init_method(), results), nprocs=2)
    comm = sq.create_local_group([0])[0]
    r = Rank(Problem(Setup(**_DET_SETUP)))
    r.poison(600)
    sq.qk_epilogue(r.q, r.k, r.v, deterministic=True, **r.kwargs(comm))
    _sync()
    comm.check_error()
    assert r.check() == []
    tp1 = _written(r)
    for i in range(3):  # Q, K, V: rank 0's heads, then rank 1's
        tp2 = np.concatenate([results[0][i], results[1][i]], axis=1)
        assert np.array_equal(tp1[i], tp2), ("Q", "K", "V")[i]


# ---- bad positions and slots ----------------------------------------------------------------

@pytest.mark.parametrize("what", ["position", "slot"])
def test_bad_value_is_raised_by_name_and_writes_nothing_of_its_token(sq, what):
    comm = sq.create_local_group([0])[0]
    s = Setup(tokens=50, padding=0.0, seed=60 if what == "position" else 61)
    p = Problem(s)
    bad_token = 17
    if what == "position":
        bad_value = s.max_position
        p.positions[bad_token] = bad_value
    else:
        bad_value = s.num_blocks() * s.block_size + 5
        p.slots[bad_token] = bad_value
    p.regold()
    r = Rank(p)
    r.poison(300)
    r.call(sq, comm)  # the kernel finds it; the host has not looked yet
    _sync()
    assert r.check(bad_tokens=[bad_token]) == []
    label = "position" if what == "position" else "KV-cache slot"
    pattern = f"token {bad_token} has {label} {bad_value}"
    with pytest.raises(RuntimeError, match=pattern):
        comm.check_error()
    # The next call refuses on the host before writing anything, with the same diagnosis.
    r.poison(301)
    with pytest.raises(RuntimeError, match=pattern):
        r.call(sq, comm)
    _sync()
    assert torch.equal(bits(r.k_cache), bits(r.before[0]))
    assert torch.equal(bits(r.v_cache), bits(r.before[1]))
    # After reset() and with good values, the communicator works again.
    comm.reset()
    if what == "position":
        p.positions[bad_token] = 3
    else:
        p.slots[bad_token] = -1
    p.regold()
    r.upload()
    r.poison(302)
    r.call(sq, comm)
    _sync()
    comm.check_error()
    assert r.check() == []


# ---- CUDA graphs and torch.compile ----------------------------------------------------------

@pytest.mark.parametrize("enable_pdl", [False, True])
def test_cuda_graph_replays_with_changed_inputs(sq, enable_pdl):
    comm = sq.create_local_group([0])[0]
    s = Setup(tokens=64, cache_dtype=FP8, q_out_dtype=FP8, layout="HND", seed=70)
    p = Problem(s)
    r = Rank(p)
    kwargs = dict(r.kwargs(comm), enable_pdl=enable_pdl)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        sq.qk_epilogue(r.q, r.k, r.v, **kwargs)  # warm up off the capture stream
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sq.qk_epilogue(r.q, r.k, r.v, **kwargs)
    g = torch.Generator().manual_seed(71)
    for replay in range(3):
        # New Q, K, V, positions, slots and fp8 scales, all through the captured tensors.
        p.positions = torch.randint(0, s.max_position, (s.tokens,), generator=g)
        p.slots = torch.randperm(s.num_blocks() * s.block_size, generator=g)[:s.tokens]
        p.slots[::7] = -1
        p.refill(700 + replay)
        r.upload()
        r.poison(710 + replay)
        graph.replay()
        torch.cuda.synchronize()
        comm.check_error()
        assert r.check() == [], replay


def test_torch_compile_fullgraph(sq):
    comm = sq.create_local_group([0])[0]
    s = Setup(tokens=33, k_out=True, in_place=False, seed=80)
    eager, compiled = Rank(Problem(s)), Rank(Problem(s))
    eager.poison(81)
    compiled.poison(81)

    def step(r, qkv, k_cache, v_cache):
        q, k, v = torch.split(qkv, (r.qw, r.kw, r.kw), dim=-1)
        # The rank's own (poisoned) outputs, so that its check reads what the op wrote.
        kw = dict(r.kwargs(comm), k_cache=k_cache, v_cache=v_cache)
        q_out, k_out = sq.qk_epilogue(q, k, v, **kw)
        return q_out * 2.0, k_out + 1.0

    torch._dynamo.reset()
    f = torch.compile(lambda *a: step(compiled, *a), fullgraph=True)
    a, b = f(compiled.qkv, compiled.k_cache, compiled.v_cache)
    c, d = step(eager, eager.qkv, eager.k_cache, eager.v_cache)
    _sync()
    assert torch.equal(a, c) and torch.equal(b, d)
    assert torch.equal(bits(compiled.k_cache), bits(eager.k_cache))
    assert torch.equal(bits(compiled.v_cache), bits(eager.v_cache))
    assert eager.check() == []  # the op wrote the rank's own outputs (d - 1 would round in bf16)


def test_bad_arguments_raise_before_writing(sq):
    comm = sq.create_local_group([0])[0]
    r = Rank(Problem(Setup(tokens=8, seed=90)))
    r.poison(91)
    for over, message in ((dict(eps=-1.0), "eps must be finite and > 0"),
                          (dict(kv_layout="HND"), "in layout HND but k has 4 KV heads"),
                          (dict(head_dim=96), "not a multiple of head_dim = 96")):
        with pytest.raises(RuntimeError, match=message):
            sq.qk_epilogue(r.q, r.k, r.v, **dict(r.kwargs(comm), **over))
    with pytest.raises(RuntimeError, match="not a live swiftqk Communicator"):
        torch.ops.swiftqk.qk_epilogue(*r.op_args(12345))  # a stale or forged handle
    _sync()
    assert torch.equal(bits(r.k_cache), bits(r.before[0]))
    assert torch.equal(bits(r.v_cache), bits(r.before[1]))
