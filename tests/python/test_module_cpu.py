"""What runs without a GPU: the op's schema and Meta kernel under torch.compile, and the module's
torch methods (all_gather, minimax_eager) at TP 1 and, with gloo processes, TP 2 and 4."""

import os
import socket
import sys

import pytest
torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import swiftqk_or_skip
from reference import count_wrong, random_rows, random_weight, rms_norm_fp64


def test_schema_marks_both_outputs_mutated():
    swiftqk_or_skip()
    schema = str(torch.ops.swiftqk.qk_norm.default._schema)
    assert "Tensor(a!) q_out" in schema and "Tensor(b!) k_out" in schema


def test_compile_traces_the_op_without_graph_breaks():
    swiftqk_or_skip()

    def f(q, k, wq, wk):
        qo, ko = torch.empty_like(q), torch.empty_like(k)
        torch.ops.swiftqk.qk_norm(q, k, wq, wk, qo, ko, 0, 128, 64, 1e-6, 0, 0)
        return qo * 2, ko

    meta = dict(device="meta", dtype=torch.bfloat16)
    args = (torch.empty(8, 64, **meta), torch.empty(8, 32, **meta), torch.empty(64, **meta),
            torch.empty(32, **meta))
    torch._dynamo.reset()
    qo, ko = torch.compile(f, backend="aot_eager", fullgraph=True)(*args)
    assert qo.shape == (8, 64) and ko.shape == (8, 32)


@pytest.mark.parametrize("method", ["all_gather", "minimax_eager"])
@pytest.mark.parametrize("order", ["olmo2", "llama"])
def test_torch_methods_tp1(method, order):
    swiftqk = swiftqk_or_skip()
    q, k = random_rows(33, 512, torch.bfloat16, 1), random_rows(33, 128, torch.bfloat16, 2)
    wq, wk = random_weight(512, torch.bfloat16, 3), random_weight(128, torch.bfloat16, 4)
    norm = swiftqk.TPQKNorm(wq, wk, 1e-6, order, method=method)
    qo, ko = norm(q, k)
    assert count_wrong(qo, rms_norm_fp64(q, wq, 1e-6), order) == 0
    assert count_wrong(ko, rms_norm_fp64(k, wk, 1e-6), order) == 0


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tp_worker(rank, world, port, method, order, results):
    sys.path.insert(0, os.path.dirname(__file__))
    import swiftqk

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        q, k = random_rows(17, 256, torch.bfloat16, 5), random_rows(17, 64, torch.bfloat16, 6)
        wq, wk = random_weight(256, torch.bfloat16, 7), random_weight(64, torch.bfloat16, 8)
        wq_s, wk_s = 256 // world, 64 // world
        norm = swiftqk.TPQKNorm(wq, wk, 1e-6, order, method=method, group=dist.group.WORLD)
        qo, ko = norm(q[:, rank * wq_s:(rank + 1) * wq_s], k[:, rank * wk_s:(rank + 1) * wk_s])
        gq = rms_norm_fp64(q, wq, 1e-6)[:, rank * wq_s:(rank + 1) * wq_s]
        gk = rms_norm_fp64(k, wk, 1e-6)[:, rank * wk_s:(rank + 1) * wk_s]
        results[rank] = count_wrong(qo, gq, order) + count_wrong(ko, gk, order)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("method", ["all_gather", "minimax_eager"])
def test_torch_methods_across_gloo_processes(world, method):
    swiftqk_or_skip()
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_tp_worker, args=(world, _free_port(), method, "olmo2", results), nprocs=world)
    assert dict(results) == {r: 0 for r in range(world)}
