"""Failure semantics through the PyTorch op, on one GPU with two virtual ranks: a timed-out call
leaves NaN and raises on the next host call without a device synchronisation, a CUDA graph
captured before the failure replays NaN on every rank, and a reset makes the group correct
again; close() tears a communicator down and later calls raise."""

import time

import pytest
torch = pytest.importorskip("torch", reason="PyTorch is not installed here")

from reference import count_wrong, random_rows, random_weight, rms_norm_fp64


HQ, HK, EPS = 2048, 512, 1e-6


def _rank_inputs(rank, tokens, seed):
    """Rank `rank` of 2: its shards of full random rows, its weight slices, and the float64 gold
    of its slice (normalised over the full width)."""
    q = random_rows(tokens, HQ, torch.bfloat16, seed).cuda()
    k = random_rows(tokens, HK, torch.bfloat16, seed + 1).cuda()
    wq, wk = random_weight(HQ, torch.bfloat16, 3).cuda(), random_weight(HK, torch.bfloat16, 4).cuda()
    gq, gk = rms_norm_fp64(q, wq, EPS), rms_norm_fp64(k, wk, EPS)
    sq_, sk_ = slice(rank * HQ // 2, (rank + 1) * HQ // 2), slice(rank * HK // 2, (rank + 1) * HK // 2)
    return (q[:, sq_].contiguous(), k[:, sk_].contiguous(), wq[sq_].contiguous(),
            wk[sk_].contiguous(), gq[:, sq_], gk[:, sk_])


def test_timeout_is_loud_and_a_reset_recovers(sq):
    comms = sq.create_local_group([0, 0], timeout_s=0.2)
    r = [_rank_inputs(i, 24, 40) for i in range(2)]
    outs = [(torch.empty_like(x[0]), torch.empty_like(x[1])) for x in r]

    def call(i):
        q, k, wq, wk, _, _ = r[i]
        sq.qk_norm_(q, k, wq, wk, comms[i], HQ, HK, EPS, "olmo2", q_out=outs[i][0],
                    k_out=outs[i][1])

    # A graph of both ranks (two streams joined), captured and checked while the group is healthy.
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.graph(graph):
        fork = torch.cuda.Event()
        fork.record()
        side.wait_event(fork)
        call(0)
        with torch.cuda.stream(side):
            call(1)
        torch.cuda.current_stream().wait_stream(side)
    for o in outs:
        o[0].fill_(7.0), o[1].fill_(7.0)
    graph.replay()
    torch.cuda.synchronize()
    for i in range(2):
        assert count_wrong(outs[i][0], r[i][4], "olmo2") == 0
        assert count_wrong(outs[i][1], r[i][5], "olmo2") == 0

    call(0)  # rank 1 never calls: rank 0 times out
    torch.cuda.synchronize()
    assert torch.isnan(outs[0][0]).all() and torch.isnan(outs[0][1]).all()
    assert comms[0].failure_code == 1
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 0 timed out waiting for rank 1"):
        call(0)  # the next call raises on the host, before any launch or synchronisation
    assert time.monotonic() - start < 0.05
    with pytest.raises(RuntimeError, match="timed out"):
        comms[0].check_error()

    for o in outs:
        o[0].fill_(7.0), o[1].fill_(7.0)
    graph.replay()  # past the host: the kernels write NaN on both ranks
    torch.cuda.synchronize()
    for i in range(2):
        assert torch.isnan(outs[i][0]).all() and torch.isnan(outs[i][1]).all()
    assert comms[1].failure_code == 3
    with pytest.raises(RuntimeError, match="rank 1 stopped because rank 0"):
        comms[1].check_error()

    comms[0].reset()  # a local group resets as a whole
    assert comms[0].failure_code == 0 and comms[1].failure_code == 0
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    for i in range(2):
        assert count_wrong(outs[i][0], r[i][4], "olmo2") == 0
        assert count_wrong(outs[i][1], r[i][5], "olmo2") == 0
    comms[0].check_error()


def test_close_then_calls_raise(sq):
    comm = sq.create_local_group([0])[0]
    q, k, wq, wk, _, _ = _rank_inputs(0, 8, 50)
    assert comm.sm_budget == 0 and comm.timeout_s == 5.0
    comm.close()
    assert comm.closed
    comm.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        sq.qk_norm(q, k, wq, wk, comm, HQ // 2, HK // 2, EPS)


@pytest.mark.parametrize("timeout", [float("inf"), 1e30, 0.0, -1.0])
def test_unbounded_timeouts_are_refused(sq, timeout):
    with pytest.raises(RuntimeError, match="timeout_s"):
        sq.create_local_group([0, 0], timeout_s=timeout)
