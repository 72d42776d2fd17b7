"""Communicators from a torch.distributed process group, with a fallback that needs no P2P."""

import logging
from typing import Optional

import torch
import torch.distributed as dist

from . import _C

log = logging.getLogger("swiftqk")
_warned = False


class FallbackCommunicator:
    """Used where CUDA P2P between the group's GPUs does not work: the QK norm then exchanges
    its [T, 2] fp32 partial sums with one all-reduce over the process group (the MiniMax-eager
    scheme) instead of the fused kernel."""

    def __init__(self, group, rank: int, world_size: int, device: int, reason: str):
        self.group, self.rank, self.world_size, self.device = group, rank, world_size, device
        self.reason = reason
        self._closed = False

    def close(self) -> None:
        """Same call as swiftqk.Communicator.close(), so callers need not tell the two apart.
        It holds no device memory and no peer mappings (the process group is the caller's), so
        closing only marks it closed; closing twice is fine."""
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed


def communicator_from_group(group: Optional[dist.ProcessGroup] = None,
                            device: Optional[int] = None, token_capacity: int = 16384,
                            timeout_s: float = 5.0, sm_budget: int = 0):
    """Collective over ``group``: exchanges CUDA IPC handles with all_gather_object, opens the
    peers, and decides P2P by a real write test (every rank writes into every peer and waits,
    bounded, to see every peer's write). Returns a swiftqk.Communicator, or a
    FallbackCommunicator (logged once) when any rank could not open or reach its peers."""
    global _warned
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    device = torch.cuda.current_device() if device is None else device
    boot = _C.IpcBootstrap(rank, world, device, token_capacity, timeout_s, sm_budget)
    handles = [None] * world
    dist.all_gather_object(handles, boot.local_handle(), group=group)
    comm, reason = None, ""
    try:
        comm = boot.connect(handles)
    except RuntimeError as e:  # e.g. peers in another process cannot be mapped
        reason = str(e)
    opened = [None] * world
    dist.all_gather_object(opened, comm is not None, group=group)
    ok = all(opened)
    if ok:
        with torch.cuda.device(device):
            ok = comm.probe_peers(torch.cuda.current_stream().cuda_stream)
        if not ok:
            reason = "the P2P write test timed out: peer writes did not arrive"
        reached = [None] * world
        dist.all_gather_object(reached, ok, group=group)
        ok = all(reached)
    if ok:
        return comm
    if comm is not None:
        # Dropped, it would close() with a barrier that the peers falling back never meet, and
        # wait out its bound (2 x timeout_s + 1 s) holding the GIL. No kernel ran on it, and
        # every rank's probe has returned (the all_gather above), so nothing writes into it.
        comm.close_without_barrier()
    if not _warned:
        log.warning("swiftqk: no working CUDA P2P in this group (%s); using the all-reduce "
                    "fallback", reason or "another rank failed")
        _warned = True
    return FallbackCommunicator(group, rank, world, device, reason or "another rank failed")
