"""CUDA-graph timing shared by the PyTorch benchmarks: `launches` calls of body(i) captured in one
graph (after a warm-up on a side stream, which also triggers any compilation), replayed 10 times
untimed, then timed `iters` times with CUDA events; the time of one launch is a replay / launches.
"""


def replay_times_us(torch, body, iters, launches):
    """Sorted per-launch times in microseconds, one per timed replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            body(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(launches):
            body(i)
    for _ in range(10):
        g.replay()
    times = []
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(iters):
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / launches)
    times.sort()
    return times
