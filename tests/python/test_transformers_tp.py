"""swiftqk.integrations.transformers on tiny random-weight transformers models (nothing
downloaded): OLMo 2, OLMo 3 (sliding-window layers, GQA), FlexOlmo and OLMoE.

Each check runs a prompt and then one decode step through the KV cache, and compares the logits
of the rewritten model with the stock model's. Norm weights are random (never ones), so a wrong
slice of them shows. The MoE configs route every token to all their experts: with top-k < E a
rounding difference could flip an expert choice and the comparison would measure that instead.

CPU (needs torch and transformers; skips without them or without swiftqk._C): check_model's
refusals, the head slices at TP 2, the torch methods at TP 1 in fp32 and bf16, TP 2 over gloo
processes with the model loaded normally and with transformers' tp_plan="auto".
GPU: the fused methods at TP 1; TP 2 as two processes sharing GPU 0 (CUDA IPC); TP 2 with one GPU
per rank (NCCL), loaded normally and with tp_plan="auto" (needs two GPUs)."""

import copy
import inspect
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
transformers = pytest.importorskip("transformers", reason="transformers is not installed here")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from conftest import swiftqk_or_skip  # noqa: E402
from reference import init_method  # noqa: E402

KINDS = ["olmo2", "olmo3", "flex_olmo", "olmoe"]
PROMPT = 12  # tokens; OLMo 3's sliding window below is 4, so its sliding layers drop some


CONFIGS = {"olmo2": "Olmo2Config", "olmo3": "Olmo3Config", "flex_olmo": "FlexOlmoConfig",
           "olmoe": "OlmoeConfig", "llama": "LlamaConfig"}


def _needs(kind):
    """Skips where this transformers predates the model (call before spawning workers)."""
    if not hasattr(transformers, CONFIGS[kind]):
        pytest.skip(f"transformers {transformers.__version__} has no {CONFIGS[kind]}")


def _config(kind, kv_heads=8, heads=8):
    _needs(kind)
    common = dict(vocab_size=96, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                  num_attention_heads=heads, num_key_value_heads=kv_heads,
                  max_position_embeddings=64, initializer_range=0.05, tie_word_embeddings=False,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if kind == "olmo2":
        return transformers.Olmo2Config(**common)
    if kind == "olmo3":
        return transformers.Olmo3Config(**common, sliding_window=4,
                                        layer_types=["sliding_attention", "full_attention"])
    # The eager experts: the grouped-GEMM ones have no float64 kernel for the reference.
    moe = dict(num_experts=4, num_experts_per_tok=4, experts_implementation="eager")
    if kind == "flex_olmo":
        return transformers.FlexOlmoConfig(**common, **moe)
    if kind == "olmoe":
        return transformers.OlmoeConfig(**common, **moe)
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    raise ValueError(kind)


def _model(kind, seed=0, kv_heads=8, heads=8, dtype=torch.float32, device="cpu"):
    """A random model, the same on every rank that asks with the same seed."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(
        _config(kind, kv_heads, heads), attn_implementation="sdpa")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model.to(dtype=dtype, device=device).eval()


def _inputs(seed=1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 96, (2, PROMPT), generator=g)
    step = torch.randint(0, 96, (2, 1), generator=g)
    return prompt.to(device), step.to(device)


def _logits(model, prompt, step):
    """The prompt's logits and one decode step's through the model's own KV cache."""
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
        cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        name = "cache" if "cache" in inspect.signature(model.forward).parameters \
            else "past_key_values"
        nxt = model(input_ids=step, use_cache=True, **{name: cache})
    return torch.cat([out.logits, nxt.logits], dim=1).float()


def _relative(a, ref):
    return ((a.double() - ref.double()).abs().max() / ref.double().abs().max()).item()


# fp32: the rewritten model computes the same sums in other orders (the fused QKV GEMM, the norm
# over shards, o_proj's partials added by the all-reduce); each is a few fp32 ulps (2^-24) of its
# magnitudes, and two layers and the head compound them. 1e-5 of the logits' scale leaves over
# 100 ulps of room and still catches a wrong head, slice or eps (those move logits by >1e-2).
FP32_TOL = 1e-5


def _rms_error(a, gold):
    """RMS of the error over all logits, relative to the logits' RMS: a statistic of thousands
    of rounding errors, so it varies far less between models than a maximum does."""
    a, gold = a.double(), gold.double()
    return ((a - gold).square().mean().sqrt() / gold.square().mean().sqrt()).item()


# bf16 rounds every activation (2^-8), so the rewritten and the stock bf16 model differ by
# rounding noise; the test is that the rewritten one is about as close to the float64 model as
# the stock one. On CPU (torch methods, TP 1 and 2, 12 random models) the ratio of their RMS
# errors was 0.96-1.11; 1.5 leaves room for other GEMMs and sum orders on a GPU, and a wrong
# head, slice or weight is off by O(1), far beyond it.
BF16_RATIO = 1.5


def _bf16_verdict(ours, stock, gold):
    e_ours, e_stock = _rms_error(ours, gold), _rms_error(stock, gold)
    return e_ours <= BF16_RATIO * e_stock, e_ours, e_stock


def _check_bf16(ours, stock, gold):
    ok, e_ours, e_stock = _bf16_verdict(ours, stock, gold)
    assert ok, f"bf16 RMS error {e_ours:.3e}, the stock bf16 model's {e_stock:.3e}"


@pytest.fixture
def tp():
    swiftqk_or_skip()
    from swiftqk.integrations import transformers as tp_mod

    return tp_mod


# ---- CPU --------------------------------------------------------------------------------------


def test_unknown_architecture_is_refused(tp):
    model = _model("llama")
    with pytest.raises(ValueError, match="has no attention layer apply_swiftqk_tp knows"):
        tp.apply_swiftqk_tp(model, method="minimax_eager")


@pytest.mark.parametrize("heads,kv_heads,world", [(8, 2, 4), (6, 6, 4), (8, 8, 3)])
def test_heads_that_do_not_divide_are_refused(tp, heads, kv_heads, world):
    model = _model("olmo3", heads=heads, kv_heads=kv_heads)
    with pytest.raises(ValueError, match=f"do not divide over TP {world}"):
        tp.check_model(model, world)


def test_refusals_leave_the_model_unchanged_and_name_the_cause(tp):
    model = _model("olmo2")
    before = {n: p.clone() for n, p in model.state_dict().items()}
    with pytest.raises(ValueError, match="runs the CUDA op"):
        tp.apply_swiftqk_tp(model, method="swiftqk")  # the model is on the CPU
    import swiftqk

    two = swiftqk.FallbackCommunicator(None, 0, 2, 0, "no group")
    with pytest.raises(ValueError, match="needs the process group"):
        tp.apply_swiftqk_tp(model, comm=two, method="minimax_eager")
    with pytest.raises(ValueError, match="method must be one of"):
        tp.apply_swiftqk_tp(model, method="gather")
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before)
    tp.apply_swiftqk_tp(model, method="minimax_eager")
    with pytest.raises(ValueError, match="already sharded"):
        tp.apply_swiftqk_tp(model, method="minimax_eager")


def test_check_model_describes_every_attention_layer(tp):
    lay = tp.check_model(_model("olmoe", heads=8, kv_heads=4), 4)
    assert [(x.name, x.kind, x.order, x.heads, x.kv_heads, x.head_dim) for x in lay] == [
        (f"model.layers.{i}.self_attn", "OlmoeAttention", "llama", 8, 4, 16) for i in range(2)]
    assert {x.order for x in tp.check_model(_model("olmo2"), 1)} == {"olmo2"}


def test_shard_weights_at_tp2_split_heads_and_sum_to_the_whole(tp):
    """The sharding math at TP 2 in one process: each rank's fused projection holds its query,
    key and value heads (GQA: 8 query heads over 2 KV heads, one KV head a rank), the ranks'
    projections concatenate to the stock ones, and their o_proj partials sum to o_proj."""
    torch.manual_seed(3)
    attn = _model("olmo3", heads=8, kv_heads=2).model.layers[1].self_attn
    with torch.no_grad():
        for lin in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
            lin.bias = torch.nn.Parameter(torch.randn(lin.out_features))  # biases shard too
    wq, wk, d = 4 * 16, 1 * 16, 16
    x = torch.randn(5, 128, dtype=torch.float64)
    a = torch.randn(5, 8 * d, dtype=torch.float64)
    parts = [tp.shard_weights(attn, r, 2) for r in range(2)]
    outs = []
    for r, p in enumerate(parts):
        assert p["qkv_weight"].shape == (wq + 2 * wk, 128) and p["o_weight"].shape == (128, wq)
        assert torch.equal(p["qkv_weight"][:wq], attn.q_proj.weight[r * wq:(r + 1) * wq])
        assert torch.equal(p["qkv_weight"][wq:wq + wk], attn.k_proj.weight[r * wk:(r + 1) * wk])
        assert torch.equal(p["qkv_weight"][wq + wk:], attn.v_proj.weight[r * wk:(r + 1) * wk])
        assert torch.equal(p["qkv_bias"][:wq], attn.q_proj.bias[r * wq:(r + 1) * wq])
        assert torch.equal(p["o_weight"], attn.o_proj.weight[:, r * wq:(r + 1) * wq])
        assert torch.equal(p["o_bias"], attn.o_proj.bias)
        outs.append(x @ p["qkv_weight"].double().T + p["qkv_bias"].double())
    w = lambda lin: (lin.weight.double(), lin.bias.double())  # noqa: E731
    full_q, full_k = x @ w(attn.q_proj)[0].T + w(attn.q_proj)[1], x @ w(attn.k_proj)[0].T + w(
        attn.k_proj)[1]
    assert torch.allclose(torch.cat([o[:, :wq] for o in outs], -1), full_q, rtol=0, atol=1e-12)
    assert torch.allclose(torch.cat([o[:, wq:wq + wk] for o in outs], -1), full_k, rtol=0,
                          atol=1e-12)
    partial = sum(a[:, r * wq:(r + 1) * wq] @ p["o_weight"].double().T for r, p in enumerate(parts))
    assert torch.allclose(partial + w(attn.o_proj)[1], a @ w(attn.o_proj)[0].T + w(attn.o_proj)[1],
                          rtol=0, atol=1e-12)


def test_handed_projections_refuse_calls_from_outside_the_forward(tp):
    model = tp.apply_swiftqk_tp(_model("olmo2"), method="minimax_eager")
    attn = model.model.layers[0].self_attn
    with pytest.raises(RuntimeError, match="called outside the attention forward"):
        attn.q_proj(torch.randn(3, 128))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", ["minimax_eager", "all_gather"])
def test_tp1_torch_methods_match_the_stock_model_fp32(tp, kind, method):
    stock = _model(kind, kv_heads=4 if kind == "olmo3" else 8)
    ours = tp.apply_swiftqk_tp(copy.deepcopy(stock), method=method)
    prompt, step = _inputs()
    ref = _logits(stock, prompt, step)
    err = _relative(_logits(ours, prompt, step), ref)
    assert err <= FP32_TOL, f"{kind} {method}: relative error {err:.3e}"


@pytest.mark.parametrize("kind", KINDS)
def test_tp1_bf16_is_as_close_to_float64_as_the_stock_model(tp, kind):
    stock = _model(kind)
    gold = _logits(copy.deepcopy(stock).double(), *_inputs())
    stock = stock.to(torch.bfloat16)
    ours = tp.apply_swiftqk_tp(copy.deepcopy(stock), method="minimax_eager")
    _check_bf16(_logits(ours, *_inputs()), _logits(stock, *_inputs()), gold)


def _gloo_rank(rank, world, rendezvous, kind, kv_heads, results):
    sys.path.insert(0, os.path.dirname(__file__))
    from swiftqk.integrations.transformers import apply_swiftqk_tp

    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        stock = _model(kind, kv_heads=kv_heads)
        prompt, step = _inputs()
        ref = _logits(stock, prompt, step)
        errors = {}
        for method in ("minimax_eager", "all_gather"):
            ours = apply_swiftqk_tp(copy.deepcopy(stock), method=method)  # group: WORLD
            attn = ours.model.layers[0].self_attn
            assert attn.swiftqk_qkv.weight.shape[0] == (8 + 2 * kv_heads) * 16 // world
            errors[method] = _relative(_logits(ours, prompt, step), ref)
        results[rank] = errors
    finally:
        dist.destroy_process_group()


def _spawn(fn, world, *args):
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(fn, args=(world, init_method(), *args, results), nprocs=world)
    return dict(results)


@pytest.mark.parametrize("kind,kv_heads", [("olmo2", 8), ("olmo3", 2), ("olmoe", 8)])
def test_tp2_gloo_processes_match_the_stock_model_on_cpu(tp, kind, kv_heads):
    _needs(kind)
    results = _spawn(_gloo_rank, 2, kind, kv_heads)
    assert len(results) == 2, results
    assert all(e <= FP32_TOL for r in results.values() for e in r.values()), results


def _tp_plan_rank(rank, world, rendezvous, kind, path, device_kind, method, results):
    """A checkpoint loaded with transformers' own TP plan (colwise_gather_output for q/k/v),
    then rewritten: its logits against the same checkpoint loaded whole."""
    sys.path.insert(0, os.path.dirname(__file__))
    from swiftqk.integrations.transformers import apply_swiftqk_tp, load_with_tp_plan

    cuda = device_kind == "cuda_per_rank"
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=rendezvous, rank=rank,
                            world_size=world)
    try:
        torch.set_num_threads(1)
        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        dtype = torch.bfloat16 if cuda else torch.float32
        whole = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        sharded = load_with_tp_plan(path, dtype)
        q = sharded.model.layers[0].self_attn.q_proj.weight
        # transformers' plan did shard it (a DTensor, or a local shard in older releases).
        assert type(q).__name__ == "DTensor" or q.shape[0] < 128, type(q)
        prompt, step = _inputs(device=device)
        ref = _logits(whole.eval(), prompt, step)
        stock_tp = _logits(sharded.eval(), prompt, step)
        ours = _logits(apply_swiftqk_tp(sharded, method=method), prompt, step)
        if cuda:
            gold = _logits(_model(kind).double(), prompt.cpu(), step.cpu())  # the checkpoint
            results[rank] = _bf16_verdict(ours.cpu(), ref.cpu(), gold)
        else:
            results[rank] = (max(_relative(ours, ref), _relative(stock_tp, ref)) <= FP32_TOL,
                             _relative(ours, ref), _relative(stock_tp, ref))
    finally:
        dist.destroy_process_group()


def _saved(kind, tmp_path):
    path = str(tmp_path / kind)
    _model(kind).save_pretrained(path)
    return path


@pytest.fixture
def accelerate():
    # transformers loads a tp_plan through accelerate's device placement.
    pytest.importorskip("accelerate", reason="accelerate is not installed here (tp_plan needs it)")


@pytest.mark.parametrize("kind", ["olmo2", "olmoe"])
def test_tp2_gloo_on_a_tp_plan_auto_model_on_cpu(tp, accelerate, kind, tmp_path):
    results = _spawn(_tp_plan_rank, 2, kind, _saved(kind, tmp_path), "cpu", "minimax_eager")
    assert len(results) == 2 and all(r[0] for r in results.values()), results


# ---- GPU --------------------------------------------------------------------------------------


def _gpus():
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture
def gpu(tp):
    if _gpus() == 0:
        pytest.skip("no CUDA GPU on this machine: GPU test skipped")
    return tp


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("method", ["swiftqk", "minimax_fused"])
def test_tp1_fused_bf16_matches_the_stock_model_on_a_gpu(gpu, kind, method):
    stock = _model(kind, kv_heads=4 if kind == "olmo3" else 8)
    gold = _logits(copy.deepcopy(stock).double(), *_inputs())
    stock = stock.to(device="cuda", dtype=torch.bfloat16)
    ours = gpu.apply_swiftqk_tp(copy.deepcopy(stock), method=method)
    assert isinstance(ours.model.layers[0].self_attn.swiftqk_qkv.norm.comm,
                      sys.modules["swiftqk"].Communicator)
    prompt, step = _inputs(device="cuda")
    _check_bf16(_logits(ours, prompt, step).cpu(), _logits(stock, prompt, step).cpu(), gold)


def _gpu_rank(rank, world, rendezvous, kind, device_kind, method, results):
    sys.path.insert(0, os.path.dirname(__file__))
    import swiftqk
    from swiftqk.integrations.transformers import apply_swiftqk_tp

    # "cuda": both ranks on GPU 0 (processes time-slice it, CUDA IPC between them, gloo for the
    # group); "cuda_per_rank": rank r on GPU r with NCCL, as an engine runs.
    gpu = rank if device_kind == "cuda_per_rank" else 0
    torch.cuda.set_device(gpu)
    dist.init_process_group("nccl" if device_kind == "cuda_per_rank" else "gloo",
                            init_method=rendezvous, rank=rank, world_size=world)
    try:
        stock = _model(kind)
        gold = _logits(copy.deepcopy(stock).double(), *_inputs())
        stock = stock.to(device=torch.device("cuda", gpu), dtype=torch.bfloat16)
        comm = swiftqk.communicator_from_group(dist.group.WORLD, device=gpu, timeout_s=30.0)
        if not isinstance(comm, swiftqk.Communicator):
            results[rank] = (False, f"fell back: {comm.reason}", 0.0)
            return
        ours = apply_swiftqk_tp(copy.deepcopy(stock), comm=comm, method=method)
        prompt, step = _inputs(device=torch.device("cuda", gpu))
        results[rank] = _bf16_verdict(_logits(ours, prompt, step).cpu(),
                                      _logits(stock, prompt, step).cpu(), gold)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kind", ["olmo2", "olmoe"])
def test_tp2_fused_processes_sharing_one_gpu(gpu, kind):
    _needs(kind)
    results = _spawn(_gpu_rank, 2, kind, "cuda", "swiftqk")
    assert len(results) == 2 and all(r[0] for r in results.values()), results


@pytest.fixture
def two_gpus(tp):
    n = _gpus()
    if n < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {n}: multi-GPU test skipped")
    return tp


@pytest.mark.parametrize("kind", ["olmo2", "olmoe"])
def test_tp2_fused_one_gpu_per_rank(two_gpus, kind):
    _needs(kind)
    results = _spawn(_gpu_rank, 2, kind, "cuda_per_rank", "swiftqk")
    assert len(results) == 2 and all(r[0] for r in results.values()), results


@pytest.mark.parametrize("kind", ["olmo2", "olmoe"])
def test_tp2_fused_one_gpu_per_rank_on_a_tp_plan_auto_model(two_gpus, accelerate, kind, tmp_path):
    results = _spawn(_tp_plan_rank, 2, kind, _saved(kind, tmp_path), "cuda_per_rank", "swiftqk")
    assert len(results) == 2 and all(r[0] for r in results.values()), results
