"""The driver's retries when a synthesized schedule does not fit the backend's runtime:
a schedule with fewer peers per GPU when a GPU had too many peers, else fewer ops."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from collc import driver, frontend
from collc.backends import BackendOptions, get_backend
from collc.backends.msccl_xml.limits import LimitError, PeerLimitError
from collc.ir.schedule import OpKind, rank_peers
from collc.passes.base import CompileUnit, Pass, register_pass
from collc.synthesis import nodes
from rail_topologies import quad

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
def asked(monkeypatch) -> list[tuple[int | None, ...]]:
    calls: list[tuple[int | None, ...]] = []
    produce = driver.produce_schedule

    def recording(job, max_ops=None, max_peers=None, peer_limit=None, landings=True, verified=True,
                  over_nodes=True):
        call = (max_ops, max_peers) if peer_limit is None else (max_ops, max_peers, peer_limit)
        call = call if landings else (*call, "chained")
        calls.append(call if over_nodes else (*call, "flat"))
        return produce(job, max_ops, max_peers, peer_limit, landings, verified, over_nodes)

    monkeypatch.setattr(driver, "produce_schedule", recording)
    return calls


@register_pass
@dataclass(frozen=True)
class _RefuseLandings(Pass):
    """A stand-in for a runtime that has no room for a ReduceScatter's landings: the
    local adds of partial sums landed in scratch."""

    name = "test-refuse-landings"
    summary = "fail on a schedule with landed partial sums (tests)"

    def run(self, unit: CompileUnit) -> CompileUnit:
        if any(op.is_transfer and op.kind is OpKind.COPY for op in unit.schedule.ops):
            raise LimitError("too many steps")
        return unit


def test_landings_refused_at_one_chunk_asks_for_chained_partial_sums(asked):
    # At one chunk per rank there are no fewer chunks to ask for: the partial sums are
    # chained instead, one step fewer for each landing.
    topo = frontend.resolve_topology("dgx1")
    job = driver.CompileJob(topo, frontend.resolve_collective("reducescatter", 8), 1 << 30,
                            pipeline="synthesize{chunks=1}")
    back = replace(get_backend("msccl-xml"), lowering=lambda options: "test-refuse-landings")
    unit, solver = driver.schedule_for_backend(job, back, BackendOptions())
    assert asked == [(8192, None), (8192, None, "chained")]
    assert not any(op.is_transfer and op.kind is OpKind.COPY for op in unit.schedule.ops)
    assert solver["refused_by_backend"] == ["too many steps"] and solver["backend_landings"] is False
    assert "landings" not in solver


@register_pass
@dataclass(frozen=True)
class _RefuseOverNodes(Pass):
    """A stand-in for a runtime that cannot place a schedule composed over nodes."""

    name = "test-refuse-over-nodes"
    summary = "fail on a schedule composed over nodes (tests)"

    def run(self, unit: CompileUnit) -> CompileUnit:
        if unit.schedule.meta.get("over_nodes"):
            raise LimitError("too many threadblocks")
        return unit


def test_a_reducescatter_refused_over_nodes_is_asked_for_flat(asked, monkeypatch, tmp_path):
    # The composition over nodes does not follow the op budget: halving it would give
    # the same schedule, so the flat composition is asked for at once.
    monkeypatch.setattr(nodes, "reducescatter_wins", lambda n_nodes: True)
    topo = quad(tmp_path, nodes=2, sms=32)
    job = driver.CompileJob(topo, frontend.resolve_collective("reducescatter", topo.num_ranks), 1 << 20,
                            pipeline="synthesize{chunks=1}")
    back = replace(get_backend("msccl-xml"), lowering=lambda options: "test-refuse-over-nodes")
    unit, solver = driver.schedule_for_backend(job, back, BackendOptions())
    assert asked == [(8192, None), (8192, None, "flat")]
    assert not unit.schedule.meta.get("over_nodes") and "over_nodes" not in solver
    assert solver["refused_by_backend"] == ["too many threadblocks"] and solver["backend_over_nodes"] is False


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



def _limited(limit: int):
    return replace(get_backend("msccl-xml"), lowering=lambda options: "test-refuse-many-peers",
                   op_budget=lambda ranks: 256 * ranks, peer_budget=PEERS,
                   peer_limit=lambda topology, options: limit)


def test_a_known_peer_limit_keeps_the_first_schedule_within_it(asked):
    # The runtime's limit (8) is known before synthesis: the packing without max_peers
    # would give a GPU 13 peers, so synthesis applies max_peers at once and the runtime
    # refuses nothing.
    unit, solver = driver.schedule_for_backend(_job(8), _limited(PEERS), BackendOptions())
    assert asked == [(16_384, PEERS, PEERS)]
    assert most_peers(unit.schedule) <= PEERS
    assert solver["backend_peer_limit"] == PEERS and "refused_by_backend" not in solver
    assert solver["most_peers_without_limit"] == 13 and solver["max_peers_applied"] is True


def test_a_peer_limit_the_packing_keeps_changes_nothing(asked):
    back = replace(_limited(20), lowering=lambda options: "")  # a runtime that takes 20 peers
    unit, solver = driver.schedule_for_backend(_job(8), back, BackendOptions())
    assert asked == [(16_384, PEERS, 20)]
    assert solver["most_peers_without_limit"] == 13 and solver["max_peers_applied"] is False
    plain, _ = driver.produce_schedule(_job(8), 16_384)
    assert unit.schedule.ops == plain.schedule.ops


def test_the_msccl_backend_knows_its_limit_only_where_a_gpu_could_exceed_it():
    back = get_backend("msccl-xml")
    big, small = _job(17), _job(16)  # 136 and 128 GPUs; an H100 keeps 130 threadblocks resident
    assert back.peer_limit(big.topology, BackendOptions()) == 130
    assert back.peer_limit(big.topology, BackendOptions(instances=2)) == 65
    assert driver._peer_limit(big, back, BackendOptions()) == 130
    assert driver._peer_limit(small, back, BackendOptions()) is None


@register_pass
@dataclass(frozen=True)
class _RefuseAll(Pass):
    """A stand-in for a runtime that takes no schedule of this size at all."""

    name = "test-refuse-all"
    summary = "fail on every schedule (tests)"

    def run(self, unit: CompileUnit) -> CompileUnit:
        raise LimitError(f"{len(unit.schedule.ops)} ops do not fit")


def test_halving_stops_once_it_no_longer_gives_fewer_ops(monkeypatch):
    sizes: list[int] = []
    chunks: list[int] = []
    produce = driver.produce_schedule

    def recording(job, max_ops=None, max_peers=None, peer_limit=None, landings=True, verified=True,
                  over_nodes=True):
        unit, solver = produce(job, max_ops, max_peers, peer_limit, landings, verified, over_nodes)
        sizes.append(len(unit.schedule.ops))
        chunks.append(solver["chunks"])
        return unit, solver

    monkeypatch.setattr(driver, "produce_schedule", recording)
    monkeypatch.setattr(driver, "BUDGET_RETRIES", 8)
    back = replace(get_backend("msccl-xml"), lowering=lambda options: "test-refuse-all",
                   op_budget=lambda ranks: 256 * ranks, peer_budget=None)
    topo = frontend.resolve_topology("dgx_h100(nodes=4)")
    job = driver.CompileJob(topo, frontend.resolve_collective("alltoall", topo.num_ranks), 1 << 30)
    with pytest.raises(LimitError, match="ops do not fit"):
        driver.schedule_for_backend(job, back, BackendOptions())
    # Each halving gave fewer ops until synthesis was at one chunk per pair, and the
    # driver stopped there: at one chunk a halved budget cannot give fewer ops, so it
    # is not tried (it used to synthesize once more to find out).
    assert 2 <= len(sizes) < 9 and chunks[-1] == 1 and all(c > 1 for c in chunks[:-1])
    assert all(a > b for a, b in zip(sizes, sizes[1:]))
