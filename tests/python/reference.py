"""Float64 reference and the dtype tolerances of the C++ tests (reference.hpp), in Python; the
rendezvous and rank setup of the tests whose ranks are processes sharing GPU 0."""

import contextlib
import os
import sys

import torch

UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


def rms_norm_fp64(x, w, eps):
    x64, w64 = x.double(), w.double()
    return w64 * x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps)


# 4 x the smallest normal number of the output type (reference.cpp's absolute_floor): below it
# the rounding error is absolute (half the subnormal spacing), not relative.
ABSOLUTE_FLOOR = {torch.bfloat16: 4 * 2.0**-126, torch.float16: 4 * 2.0**-14,
                  torch.float32: 4 * 2.0**-126}


def count_wrong(got, gold, order):
    """Elements outside |got - gold| <= rel * max(|gold|, floor): rel is 1.25 u + 1e-5 for the
    Olmo2 order (one rounding) and 2.25 u + 1e-5 for Llama (two); floor as in reference.cpp."""
    u = UNIT_ROUNDOFF[got.dtype]
    rel = (1.25 if order == "olmo2" else 2.25) * u + 1e-5
    g = got.double().cpu()
    ref = gold.double().cpu()
    bound = rel * ref.abs().clamp_min(ABSOLUTE_FLOOR[got.dtype])
    bad = ((g - ref).abs() > bound) | ~torch.isfinite(g)
    return int(bad.sum())


def random_rows(tokens, width, dtype, seed, device="cpu"):
    """Normal values with a per-row magnitude over two decades (never zeros)."""
    gen = torch.Generator().manual_seed(seed)
    mag = 10.0 ** (torch.rand(tokens, 1, generator=gen) * 2 - 1)
    x = torch.randn(tokens, width, generator=gen) * mag
    x = torch.where(x == 0, torch.full_like(x, 1e-3), x)
    return x.to(dtype).to(device)


def random_weight(width, dtype, seed, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(width, generator=gen) * 1.75 + 0.25).to(dtype).to(device)


def init_method():
    """A rendezvous for torch.distributed that cannot collide with a parallel test (a free TCP
    port can be taken by another process between choosing it and listening on it)."""
    import os
    import tempfile

    fd, path = tempfile.mkstemp(prefix="swiftqk_pg_")
    os.close(fd)
    os.unlink(path)  # the file store creates it
    return "file://" + path


@contextlib.contextmanager
def rank_sharing_gpu0(rank, world, rendezvous):
    """In a spawned process: rank `rank` of a gloo group of `world` on GPU 0, and its SwiftQK
    communicator (peers through CUDA IPC), as (swiftqk, comm). The ranks meet at a barrier when
    the body returns, so no rank closes while a peer still exchanges; the group is destroyed
    either way."""
    sys.path.insert(0, os.path.dirname(__file__))
    import swiftqk
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)
    try:
        comm = swiftqk.communicator_from_group(dist.group.WORLD, device=0, timeout_s=30.0)
        assert isinstance(comm, swiftqk.Communicator), getattr(comm, "reason", "")
        yield swiftqk, comm
        dist.barrier()
    finally:
        dist.destroy_process_group()
