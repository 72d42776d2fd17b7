"""communicator_from_group without a GPU: torch.distributed and the extension's IpcBootstrap are
faked, so each test says which ranks connected and whose probe arrived. A connected communicator
that the group does not use is closed without close()'s barrier, which the ranks falling back
never meet."""

import contextlib
import types

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")

from conftest import swiftqk_or_skip  # noqa: E402


class FakeComm:
    def __init__(self, probe_ok):
        self.probe_ok, self.calls = probe_ok, []

    def probe_peers(self, stream):
        self.calls.append("probe_peers")
        return self.probe_ok

    def close_without_barrier(self):
        self.calls.append("close_without_barrier")

    def close(self):
        self.calls.append("close")


def group_of_two(monkeypatch, connects, probe_ok=True, peer_opened=True, peer_reached=True):
    """Rank 0 of two; returns the communicators its IpcBootstrap.connect made."""
    swiftqk_or_skip()
    import swiftqk.distributed as distributed

    made = []

    class FakeBootstrap:
        def __init__(self, *args):
            pass

        def local_handle(self):
            return b"handle"

        def connect(self, handles):
            if not connects:
                raise RuntimeError("cudaIpcOpenMemHandle failed")
            made.append(FakeComm(probe_ok))
            return made[-1]

    peers = iter([None, peer_opened, peer_reached])  # the handles, then the two verdicts

    def all_gather_object(out, obj, group=None):
        out[0], out[1] = obj, next(peers)
        if out[1] is None:
            out[1] = obj

    monkeypatch.setattr(distributed, "_C", types.SimpleNamespace(IpcBootstrap=FakeBootstrap))
    monkeypatch.setattr(distributed.dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(distributed.dist, "all_gather_object", all_gather_object)
    monkeypatch.setattr(distributed.torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(distributed.torch.cuda, "current_stream",
                        lambda: types.SimpleNamespace(cuda_stream=0))
    return distributed.communicator_from_group(None, device=0), made


def test_a_peer_that_could_not_connect_closes_this_ranks_communicator_without_a_barrier(
        monkeypatch):
    got, made = group_of_two(monkeypatch, connects=True, peer_opened=False)
    assert type(got).__name__ == "FallbackCommunicator"
    assert made[0].calls == ["close_without_barrier"]


def test_a_failed_write_test_closes_the_communicator_without_a_barrier(monkeypatch):
    got, made = group_of_two(monkeypatch, connects=True, peer_reached=False)
    assert type(got).__name__ == "FallbackCommunicator"
    assert made[0].calls == ["probe_peers", "close_without_barrier"]


def test_a_group_that_reaches_its_peers_keeps_its_communicator_open(monkeypatch):
    got, made = group_of_two(monkeypatch, connects=True)
    assert got is made[0]
    assert made[0].calls == ["probe_peers"]


def test_a_rank_that_could_not_connect_has_nothing_to_close(monkeypatch):
    got, made = group_of_two(monkeypatch, connects=False)
    assert type(got).__name__ == "FallbackCommunicator"
    assert "cudaIpcOpenMemHandle failed" in got.reason
    assert made == []
