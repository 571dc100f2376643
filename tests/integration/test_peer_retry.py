"""The driver's retries when a synthesized schedule does not fit the backend's runtime:
a schedule with fewer peers per GPU when a GPU had too many peers, else fewer ops."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from collc import driver, frontend
from collc.backends import BackendOptions, get_backend
from collc.backends.msccl_xml.limits import LimitError, PeerLimitError
from collc.ir.schedule import rank_peers
from collc.passes.base import CompileUnit, Pass, register_pass

PEERS = 8


def most_peers(schedule) -> int:
    sends, recvs = rank_peers(schedule)
    return max(len(p) for p in (*sends.values(), *recvs.values()))


@register_pass
@dataclass(frozen=True)
class _RefuseManyPeers(Pass):
    """A stand-in for a runtime whose GPUs take at most PEERS peers (the MSCCL lowering
    raises the same error: tests/backends/msccl_xml/test_wide_fanout.py)."""

    name = "test-refuse-many-peers"
    summary = "fail on a GPU with more than 8 peers (tests)"

    def run(self, unit: CompileUnit) -> CompileUnit:
        most = most_peers(unit.schedule)
        if most > PEERS:
            raise PeerLimitError(f"a GPU has {most} peers")
        if len(unit.schedule.ops) > 16_384:
            raise LimitError("too many ops")
        return unit


@pytest.fixture
def asked(monkeypatch) -> list[tuple[int | None, int | None]]:
    calls: list[tuple[int | None, int | None]] = []
    produce = driver.produce_schedule

    def recording(job, max_ops=None, max_peers=None):
        calls.append((max_ops, max_peers))
        return produce(job, max_ops, max_peers)

    monkeypatch.setattr(driver, "produce_schedule", recording)
    return calls


def _job(nodes: int) -> driver.CompileJob:
    topo = frontend.resolve_topology(f"dgx_h100(nodes={nodes})")
    return driver.CompileJob(topo, frontend.resolve_collective("allgather", topo.num_ranks), 1 << 30)


def test_too_many_peers_asks_for_fewer_peers_then_fewer_ops(asked):
    # 64 GPUs: the replicated trees give each GPU 13 peers (7 in its node, one per
    # other node on its rail, as the star's trees fall).
    back = replace(get_backend("msccl-xml"), lowering=lambda options: "test-refuse-many-peers",
                   op_budget=lambda ranks: 512 * ranks, peer_budget=PEERS)
    unit, solver = driver.schedule_for_backend(_job(8), back, BackendOptions())
    assert asked == [(32_768, None), (32_768, PEERS), (16_384, PEERS)]
    assert most_peers(unit.schedule) <= PEERS and len(unit.schedule.ops) <= 16_384
    # The report says within which limits the schedule was asked for, and why.
    assert solver["backend_max_ops"] == 16_384 and solver["backend_max_peers"] == PEERS
    assert solver["refused_by_backend"] == ["a GPU has 13 peers", "too many ops"]


def test_a_backend_without_a_peer_budget_only_halves_ops(asked, monkeypatch):
    monkeypatch.setattr(driver, "BUDGET_RETRIES", 1)  # each halving costs a longer search
    back = replace(get_backend("msccl-xml"), lowering=lambda options: "test-refuse-many-peers",
                   op_budget=lambda ranks: 512 * ranks, peer_budget=None)
    with pytest.raises(PeerLimitError, match="a GPU has 13 peers"):
        driver.schedule_for_backend(_job(8), back, BackendOptions())
    assert asked == [(32_768, None), (16_384, None)]

