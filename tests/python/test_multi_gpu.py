"""One process per GPU, NCCL process group: the custom op and every QK-norm method against
float64, and the TP attention block against Hugging Face's. Needs two or more GPUs; skipped
(and reported as skipped) elsewhere."""

import os
import sys

import pytest
torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import swiftqk_or_skip
from reference import count_wrong, random_rows, random_weight, rms_norm_fp64, init_method

METHODS = ["swiftqk", "minimax_fused", "all_gather", "minimax_eager"]


def _gpus():
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture
def world():
    swiftqk_or_skip()
    n = _gpus()
    if n < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {n}: multi-GPU test skipped")
    return n



def _rank(rank, world, rendezvous, results):
    sys.path.insert(0, os.path.dirname(__file__))
    import swiftqk

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=rendezvous, rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))
    try:
        comm = swiftqk.communicator_from_group(dist.group.WORLD, device=rank)
        if not isinstance(comm, swiftqk.Communicator):
            results[rank] = f"fell back: {comm.reason}"
            return
        wrong = {}
        for method in METHODS:
            for order, (hq, hk) in (("olmo2", (5120, 1024)), ("llama", (6144, 1024))):
                for tokens in (1, 257, 4096):
                    q = random_rows(tokens, hq, torch.bfloat16, 21 + tokens).cuda()
                    k = random_rows(tokens, hk, torch.bfloat16, 22 + tokens).cuda()
                    wq = random_weight(hq, torch.bfloat16, 23).cuda()
                    wk = random_weight(hk, torch.bfloat16, 24).cuda()
                    norm = swiftqk.TPQKNorm(wq, wk, 1e-6, order, comm, method)
                    sq_, sk_ = hq // world, hk // world
                    qo, ko = norm(q[:, rank * sq_:(rank + 1) * sq_],
                                  k[:, rank * sk_:(rank + 1) * sk_])
                    torch.cuda.synchronize()
                    gq = rms_norm_fp64(q, wq, 1e-6)[:, rank * sq_:(rank + 1) * sq_]
                    gk = rms_norm_fp64(k, wk, 1e-6)[:, rank * sk_:(rank + 1) * sk_]
                    n = count_wrong(qo, gq, order) + count_wrong(ko, gk, order)
                    if n:
                        wrong[f"{method} {order} {tokens}"] = n
        results[rank] = wrong
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_every_method_one_gpu_per_rank(world):
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_rank, args=(world, init_method(), results), nprocs=world)
    assert dict(results) == {r: {} for r in range(world)}


@pytest.mark.parametrize("kind", ["olmo2", "olmoe"])
@pytest.mark.parametrize("method", METHODS)
def test_attention_matches_hf_one_gpu_per_rank(world, kind, method):
    pytest.importorskip("transformers", reason="transformers is not installed here")
    from test_hf_attention import _check

    _check(world, kind, method, "bfloat16", "cuda_per_rank")
