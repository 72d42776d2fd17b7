"""torch.ops.swiftqk.qk_norm on a GPU: against float64, under CUDA-graph capture and replay,
inside torch.compile, with bad input, and with ranks as processes sharing one GPU (CUDA IPC,
gloo for the bootstrap)."""


import pytest
torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
import torch.multiprocessing as mp

from reference import (count_wrong, init_method, random_rows, random_weight, rank_sharing_gpu0,
                       rms_norm_fp64)


def _fused_qkv(tokens, hq, hk, dtype, seed):
    """[T, hq + 2 hk] like a fused QKV projection output; q and k are column views of it."""
    qkv = torch.cat([random_rows(tokens, hq, dtype, seed), random_rows(tokens, hk, dtype, seed + 1),
                     random_rows(tokens, hk, dtype, seed + 2)], dim=-1).cuda()
    return qkv, qkv[:, :hq], qkv[:, hq:hq + hk]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("order", ["olmo2", "llama"])
@pytest.mark.parametrize("tokens", [1, 37, 4096])
@pytest.mark.parametrize("method", ["swiftqk", "minimax_fused"])
def test_matches_float64(sq, dtype, order, tokens, method):
    comm = sq.create_local_group([0])[0]
    _, q, k = _fused_qkv(tokens, 5120, 1024, dtype, 10)
    wq, wk = random_weight(5120, dtype, 3).cuda(), random_weight(1024, dtype, 4).cuda()
    gq, gk = rms_norm_fp64(q, wq, 1e-6), rms_norm_fp64(k, wk, 1e-6)
    qo, ko = sq.qk_norm(q, k, wq, wk, comm, 5120, 1024, 1e-6, order, method)
    torch.cuda.synchronize()
    assert count_wrong(qo, gq, order) == 0 and count_wrong(ko, gk, order) == 0
    sq.qk_norm_(q, k, wq, wk, comm, 5120, 1024, 1e-6, order, method)  # in place, views
    torch.cuda.synchronize()
    assert count_wrong(q, gq, order) == 0 and count_wrong(k, gk, order) == 0


def test_fp8_input_gives_bf16(sq):
    comm = sq.create_local_group([0])[0]
    x = random_rows(64, 2048, torch.float32, 5).cuda()
    scale = x.abs().max().item() / 448.0
    q8 = (x / scale).to(torch.float8_e4m3fn)
    w = random_weight(2048, torch.bfloat16, 6).cuda()
    qo, ko = sq.qk_norm(q8, q8.clone(), w, w, comm, 2048, 2048, 1e-6, "olmo2", q_scale=scale,
                        k_scale=scale)
    assert qo.dtype == torch.bfloat16
    gold = rms_norm_fp64(q8.float() * scale, w, 1e-6)
    assert count_wrong(qo, gold, "olmo2") == 0


@pytest.mark.parametrize("enable_pdl", [False, True])
def test_cuda_graph_replays_fresh_inputs(sq, enable_pdl):
    # enable_pdl: launched, and captured, with the programmatic-serialization attribute.
    comm = sq.create_local_group([0])[0]
    q_in = random_rows(64, 4096, torch.bfloat16, 7).cuda()
    k_in = random_rows(64, 4096, torch.bfloat16, 8).cuda()
    wq, wk = random_weight(4096, torch.bfloat16, 9).cuda(), random_weight(4096, torch.bfloat16, 1).cuda()
    q_out, k_out = torch.empty_like(q_in), torch.empty_like(k_in)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        sq.qk_norm_(q_in, k_in, wq, wk, comm, 4096, 4096, 1e-6, "olmo2", q_out=q_out, k_out=k_out,
                    enable_pdl=enable_pdl)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        sq.qk_norm_(q_in, k_in, wq, wk, comm, 4096, 4096, 1e-6, "olmo2", q_out=q_out, k_out=k_out,
                    enable_pdl=enable_pdl)
    for i in range(20):
        q_in.copy_(random_rows(64, 4096, torch.bfloat16, 100 + i).cuda())
        k_in.copy_(random_rows(64, 4096, torch.bfloat16, 200 + i).cuda())
        q_out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert count_wrong(q_out, rms_norm_fp64(q_in, wq, 1e-6), "olmo2") == 0, i
        assert count_wrong(k_out, rms_norm_fp64(k_in, wk, 1e-6), "olmo2") == 0, i


def test_torch_compile_fullgraph(sq):
    comm = sq.create_local_group([0])[0]
    wq, wk = random_weight(2048, torch.bfloat16, 2).cuda(), random_weight(512, torch.bfloat16, 3).cuda()

    def f(qkv):
        q, k = qkv[:, :2048], qkv[:, 2048:2560]
        qo, ko = sq.qk_norm(q, k, wq, wk, comm, 2048, 512, 1e-6, "llama")
        return qo * 2.0, ko + 1.0

    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True)
    qkv = torch.cat([random_rows(33, 2048, torch.bfloat16, 4), random_rows(33, 1024, torch.bfloat16, 5)], -1).cuda()
    a, b = cf(qkv)
    c, d = f(qkv)
    torch.cuda.synchronize()
    assert torch.equal(a, c) and torch.equal(b, d)


def test_bad_input_is_a_clear_error(sq):
    comm = sq.create_local_group([0])[0]
    q = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="not a live swiftqk Communicator"):
        torch.ops.swiftqk.qk_norm(q, q.clone(), w, w, q.clone(), q.clone(), 12345, 64, 64, 1e-6, 0, 0)
    with pytest.raises(RuntimeError, match="weight"):
        sq.qk_norm(q, q.clone(), w.float(), w, comm, 64, 64, 1e-6)
    with pytest.raises(RuntimeError, match="tokens"):
        sq.qk_norm(q, q[:4].clone(), w, w, comm, 64, 64, 1e-6)
    with pytest.raises(RuntimeError, match="eps"):
        sq.qk_norm(q, q.clone(), w, w, comm, 64, 64, -1.0)



def _ipc_rank(rank, world, rendezvous, method, results):
    with rank_sharing_gpu0(rank, world, rendezvous) as (swiftqk, comm):
        q = random_rows(50, 6144, torch.bfloat16, 11).cuda()
        k = random_rows(50, 1024, torch.bfloat16, 12).cuda()
        wq, wk = random_weight(6144, torch.bfloat16, 13).cuda(), random_weight(1024, torch.bfloat16, 14).cuda()
        norm = swiftqk.TPQKNorm(wq, wk, 1e-6, "llama", comm, method)
        sq_, sk_ = 6144 // world, 1024 // world
        qo, ko = norm(q[:, rank * sq_:(rank + 1) * sq_], k[:, rank * sk_:(rank + 1) * sk_])
        torch.cuda.synchronize()
        gq = rms_norm_fp64(q, wq, 1e-6)[:, rank * sq_:(rank + 1) * sq_]
        gk = rms_norm_fp64(k, wk, 1e-6)[:, rank * sk_:(rank + 1) * sk_]
        results[rank] = count_wrong(qo, gq, "llama") + count_wrong(ko, gk, "llama")


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("method", ["swiftqk", "minimax_fused"])
def test_processes_sharing_one_gpu(sq, world, method):
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_ipc_rank, args=(world, init_method(), method, results), nprocs=world)
    assert dict(results) == {r: 0 for r in range(world)}


def test_deterministic_matches_float64_and_refuses_other_methods(sq):
    comm = sq.create_local_group([0])[0]
    _, q, k = _fused_qkv(333, 5120, 1024, torch.bfloat16, 20)
    wq = random_weight(5120, torch.bfloat16, 21).cuda()
    wk = random_weight(1024, torch.bfloat16, 22).cuda()
    gq, gk = rms_norm_fp64(q, wq, 1e-6), rms_norm_fp64(k, wk, 1e-6)
    qo, ko = sq.qk_norm(q, k, wq, wk, comm, 5120, 1024, 1e-6, "olmo2", deterministic=True)
    torch.cuda.synchronize()
    assert count_wrong(qo, gq, "olmo2") == 0 and count_wrong(ko, gk, "olmo2") == 0
    with pytest.raises(RuntimeError, match="deterministic mode needs Method::kSwiftQK"):
        sq.qk_norm(q, k, wq, wk, comm, 5120, 1024, 1e-6, "olmo2", "minimax_fused",
                   deterministic=True)
    with pytest.raises(ValueError, match="deterministic=True needs method 'swiftqk'"):
        sq.TPQKNorm(wq, wk, 1e-6, "olmo2", comm, "all_gather", deterministic=True)


def _deterministic_rank(rank, world, rendezvous, results):
    with rank_sharing_gpu0(rank, world, rendezvous) as (swiftqk, comm):
        q, k, wq, wk = _deterministic_inputs()
        norm = swiftqk.TPQKNorm(wq, wk, 1e-6, "llama", comm, deterministic=True)
        sq_, sk_ = 6144 // world, 1024 // world
        qo, ko = norm(q[:, rank * sq_:(rank + 1) * sq_], k[:, rank * sk_:(rank + 1) * sk_])
        torch.cuda.synchronize()
        results[rank] = (qo.cpu().view(torch.int16).numpy().tobytes(),
                         ko.cpu().view(torch.int16).numpy().tobytes())


def _deterministic_inputs():
    return (random_rows(50, 6144, torch.bfloat16, 31).cuda(),
            random_rows(50, 1024, torch.bfloat16, 32).cuda(),
            random_weight(6144, torch.bfloat16, 33).cuda(),
            random_weight(1024, torch.bfloat16, 34).cuda())


@pytest.mark.parametrize("world", [2, 4])
def test_deterministic_processes_give_the_tp1_bits(sq, world):
    # Ranks as processes sharing one GPU, each with its shard: gathered, their outputs are the
    # bytes TP 1 writes for the whole rows.
    comm = sq.create_local_group([0])[0]
    q, k, wq, wk = _deterministic_inputs()
    qo, ko = sq.qk_norm(q, k, wq, wk, comm, 6144, 1024, 1e-6, "llama", deterministic=True)
    torch.cuda.synchronize()
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_deterministic_rank, args=(world, init_method(), results), nprocs=world)
    import numpy as np
    sq_, sk_ = 6144 // world, 1024 // world
    got_q = np.concatenate([np.frombuffer(results[r][0], np.int16).reshape(50, sq_)
                            for r in range(world)], axis=1)
    got_k = np.concatenate([np.frombuffer(results[r][1], np.int16).reshape(50, sk_)
                            for r in range(world)], axis=1)
    assert np.array_equal(got_q, qo.cpu().view(torch.int16).numpy())
    assert np.array_equal(got_k, ko.cpu().view(torch.int16).numpy())
