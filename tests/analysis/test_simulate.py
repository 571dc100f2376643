"""The alpha-beta simulator: hand-computed timings in both sharing modes."""

from __future__ import annotations

import time

import pytest

from analysis_nets import GB, US, build, chain, ring, star
from collc.analysis.simulate import Sharing, simulate
from collc.diagnostics import CollcError, ScheduleError
from collc.ir import Buffer, ChunkId, Collective, CollectiveKind, Loc, Op, OpKind, Schedule
from collc.ir.collective import allgather
from collc.verify import verify
from schedules import pipelined_ring_allgather, ring_allgather

SIZE = 10**9


def approx(x):
    return pytest.approx(x, rel=1e-9)


def ring_allgather_time(n: int, size_bytes: float, bandwidth: float, latency: float) -> float:
    """Closed form of the one-directional ring: n - 1 rounds of one slot over one link."""
    return (n - 1) * (latency + size_bytes / n / bandwidth)


def _custom(ranks: int, slots: int) -> Collective:
    """`slots` input slots per rank; outputs unconstrained (these tests time, not verify)."""
    inputs = tuple(tuple(frozenset({ChunkId(r, i)}) for i in range(slots)) for r in range(ranks))
    outputs = tuple(tuple(None for _ in range(slots)) for _ in range(ranks))
    return Collective("custom", CollectiveKind.CUSTOM, ranks, slots, inputs, outputs)


def _transfer(i, src, dst, count=1, deps=(), step=0, route=(), index=0) -> Op:
    return Op(i, OpKind.COPY, Loc(src, Buffer.INPUT, index), Loc(dst, Buffer.OUTPUT, index), count=count,
              deps=deps, step=step, route=route)


@pytest.mark.parametrize("sharing", ["fifo", "fair"])
@pytest.mark.parametrize("n", [4, 5])
def test_ring_allgather_matches_the_closed_form(n, sharing):
    sim = simulate(ring_allgather(n), ring(n), SIZE, sharing=sharing)
    assert sim.time_s == approx(ring_allgather_time(n, SIZE, 10 * GB, 1 * US))
    # Round s finishes at s rounds; the local copies of step 0 take no time.
    sched = ring_allgather(n)
    last_round = [op.id for op in sched.ops if op.step == n - 1]
    assert all(sim.op_finish[i] == approx(sim.time_s) for i in last_round)
    assert all(sim.op_finish[op.id] == 0.0 for op in sched.ops if op.step == 0)


def test_fifo_and_fair_differ_when_transfers_share_a_link():
    # g0 sends 1 GB to g1 and 1 GB to g2 through a switch; the switch's link to g2 runs
    # at 2 GB/s, every other link at 10 GB/s.
    topo = build("star", ["g0", "g1", "g2"], ["sw"],
                 [("g0", "sw", 10 * GB), ("g1", "sw", 10 * GB), ("g2", "sw", 2 * GB)])
    coll = _custom(3, 1)
    sched = Schedule("two", coll, "star", (_transfer(0, 0, 1), _transfer(1, 0, 2)))
    fifo = simulate(sched, topo, SIZE, sharing="fifo")
    # fifo: op 0 holds g0->sw for 0.1 s; op 1 then takes 1 GB / 2 GB/s.
    assert fifo.op_start == {0: 0.0, 1: approx(0.1)}
    assert fifo.op_finish[0] == approx(0.1 + 2 * US)
    assert fifo.time_s == approx(0.6 + 2 * US)
    fair = simulate(sched, topo, SIZE, sharing="fair")
    # max-min: op 1 is held to 2 GB/s by sw->g2, so op 0 gets the other 8 GB/s of g0->sw.
    assert fair.op_start == {0: 0.0, 1: 0.0}
    assert fair.op_finish[0] == approx(1 / 8 + 2 * US)
    assert fair.time_s == approx(0.5 + 2 * US)


def test_fair_sharing_splits_one_link_evenly_then_speeds_up():
    topo = star(3)
    coll = _custom(3, 3)
    size = 3 * SIZE  # three slots of 1 GB
    # 1 GB to g1 and 3 GB to g2, both over g0->sw.
    sched = Schedule("two", coll, "star3", (_transfer(0, 0, 1), _transfer(1, 0, 2, count=3)))
    fair = simulate(sched, topo, size, sharing="fair")
    assert fair.op_finish[0] == approx(1 / 5 + 2 * US)  # 5 GB/s each while both send
    assert fair.op_finish[1] == approx(1 / 5 + 2 / 10 + 2 * US)  # then the 2 GB left at 10 GB/s
    fifo = simulate(sched, topo, size, sharing="fifo")
    assert fifo.op_finish[0] == approx(0.1 + 2 * US)
    assert fifo.op_start[1] == approx(0.1)
    assert fifo.time_s == approx(fair.time_s)  # one bottleneck: both keep it busy


def test_dependencies_delay_the_start():
    topo = chain(3)
    coll = _custom(3, 1)
    # g0 -> g1, then g1 relays to g2 (two ops: a relay through a GPU is explicit).
    ops = (_transfer(0, 0, 1), Op(1, OpKind.COPY, Loc(1, Buffer.OUTPUT, 0), Loc(2, Buffer.OUTPUT, 0), deps=(0,),
                                  step=1))
    for sharing in ("fifo", "fair"):
        sim = simulate(Schedule("relay", coll, "chain3", ops), topo, SIZE, sharing=sharing)
        assert sim.op_start[1] == approx(sim.op_finish[0])
        assert sim.time_s == approx(2 * (1 * US + 0.1))


def test_link_accounting_and_utilization():
    topo = star(4)
    sim = simulate(ring_allgather(4), topo, SIZE, sharing="fifo")
    slot = SIZE / 4
    # 12 transfers, each over two links of 10 GB/s.
    assert sum(sim.link_bytes.values()) == approx(12 * 2 * slot)
    assert sum(sim.link_busy_s.values()) == approx(12 * 2 * slot / (10 * GB))
    util = sim.utilization()
    assert set(util) == {(l.src, l.dst) for l in topo.links}
    assert all(0.0 <= u <= 1.0 + 1e-12 for u in util.values())
    assert sum(util.values()) == approx(sum(sim.link_busy_s.values()) / sim.time_s)
    # The ring runs g_i -> g_{i+1}: every GPU's uplink and downlink carry 3 slots.
    assert sim.link_bytes[("g0", "sw")] == approx(3 * slot)
    assert sim.link_bytes[("sw", "g0")] == approx(3 * slot)


def test_default_path_takes_the_widest_of_the_shortest():
    topo = build("two_switches", ["g0", "g1"], ["fast", "slow", "x"],
                 [("g0", "slow", 1 * GB), ("slow", "g1", 1 * GB), ("g0", "fast", 5 * GB), ("fast", "g1", 5 * GB),
                  ("g0", "x", 50 * GB), ("x", "fast", 50 * GB)])
    sched = Schedule("one", _custom(2, 1), "t", (_transfer(0, 0, 1),))
    sim = simulate(sched, topo, SIZE)
    assert sim.link_bytes[("g0", "fast")] == SIZE and sim.link_bytes[("g0", "slow")] == 0.0
    assert sim.time_s == approx(2 * US + 1 / 5)


def test_an_explicit_route_is_followed():
    topo = build("two_switches", ["g0", "g1"], ["fast", "slow"],
                 [("g0", "slow", 1 * GB), ("slow", "g1", 1 * GB), ("g0", "fast", 5 * GB), ("fast", "g1", 5 * GB)])
    sched = Schedule("one", _custom(2, 1), "t", (_transfer(0, 0, 1, route=("g0", "slow", "g1")),))
    sim = simulate(sched, topo, SIZE, sharing="fair")
    assert sim.link_bytes[("slow", "g1")] == SIZE
    assert sim.time_s == approx(2 * US + 1.0)


def test_bad_routes_and_missing_paths_are_errors():
    topo = chain(3)
    coll = _custom(3, 1)
    with pytest.raises(CollcError, match="relay it through a GPU explicitly"):
        simulate(Schedule("far", coll, "chain3", (_transfer(0, 0, 2),)), topo, SIZE)
    with pytest.raises(ScheduleError, match="g0 -> g2, which is not a link"):
        simulate(Schedule("far", coll, "chain3", (_transfer(0, 0, 2, route=("g0", "g2")),)), topo, SIZE)
    with pytest.raises(ScheduleError, match="passes through GPU g1 without storing"):
        simulate(Schedule("far", coll, "chain3", (_transfer(0, 0, 2, route=("g0", "g1", "g2")),)), topo, SIZE)
    with pytest.raises(CollcError, match="unknown link sharing 'lifo'"):
        simulate(ring_allgather(3), ring(3), SIZE, sharing="lifo")


def test_a_route_taken_again_from_other_ranks_is_still_checked():
    """Paths are looked up once per (route, ranks): an op that reuses an earlier op's
    route between other GPUs is refused as if it came first."""
    topo = build("two_switches", ["g0", "g1"], ["fast", "slow"],
                 [("g0", "slow", 1 * GB), ("slow", "g1", 1 * GB), ("g0", "fast", 5 * GB), ("fast", "g1", 5 * GB),
                  ("g1", "fast", 5 * GB), ("fast", "g0", 5 * GB)])
    route = ("g0", "fast", "g1")
    good = _transfer(0, 0, 1, route=route)
    wrong = Op(1, OpKind.COPY, Loc(1, Buffer.INPUT, 0), Loc(0, Buffer.OUTPUT, 0), route=route)
    with pytest.raises(ScheduleError, match="which does not run from g1 to g0"):
        simulate(Schedule("two", _custom(2, 1), "t", (good, wrong)), topo, SIZE)


def test_dependency_at_the_same_step_is_rejected():
    coll = _custom(3, 1)
    ops = (_transfer(0, 0, 1, step=1), Op(1, OpKind.COPY, Loc(1, Buffer.OUTPUT, 0), Loc(2, Buffer.OUTPUT, 0),
                                          deps=(0,), step=0))
    with pytest.raises(ScheduleError, match="not at an earlier step"):
        simulate(Schedule("bad", coll, "chain3", ops), chain(3), SIZE, sharing="fifo")


def test_local_ops_cost_only_with_a_local_bandwidth():
    coll = _custom(2, 1)
    sched = Schedule("local", coll, "t", (Op(0, OpKind.COPY, Loc(0, Buffer.INPUT, 0), Loc(0, Buffer.OUTPUT, 0)),
                                          _transfer(1, 0, 1, deps=(0,), step=1)))
    assert simulate(sched, ring(2), SIZE).op_finish[0] == 0.0
    sim = simulate(sched, ring(2), SIZE, local_bandwidth=1000 * GB)
    assert sim.op_finish[0] == approx(1e-3)
    assert sim.time_s == approx(1e-3 + 1 * US + 0.1)


def test_json_form():
    sim = simulate(ring_allgather(3), ring(3), SIZE, sharing="fair")
    data = sim.to_json()
    assert data["sharing"] == Sharing.FAIR.value
    assert data["time_us"] == approx(sim.time_s * 1e6)
    assert len(data["ops"]) == len(ring_allgather(3).ops)
    assert {(d["src"], d["dst"]) for d in data["links"]} == set(sim.link_bytes)


def test_pipelined_ring_is_fast_and_bandwidth_bound():
    n, chunks = 16, 40
    sched = pipelined_ring_allgather(n, chunks)
    verify(sched, ring(n))
    per_transfer = SIZE / (n * chunks) / (10 * GB)
    for sharing in ("fifo", "fair"):
        t0 = time.perf_counter()
        sim = simulate(sched, ring(n), SIZE, sharing=sharing)
        assert time.perf_counter() - t0 < 5.0, f"{len(sched.ops)} ops took too long"
        # Each link carries (n - 1) x chunks transfers back to back, after the
        # pipeline's first transfer's latency.
        busy = (n - 1) * chunks * per_transfer
        assert busy <= sim.time_s <= busy + n * (1 * US + per_transfer)


def test_times_of_position_ids_read_as_a_mapping():
    from collc.analysis.simulate import OpTimes

    topo = ring(3)
    sched = ring_allgather(3)
    sim = simulate(sched, topo, SIZE)
    assert isinstance(sim.op_finish, OpTimes)  # ids 0..n-1: the list itself
    as_dict = dict(sim.op_finish)
    assert sim.op_finish == as_dict and list(sim.op_finish) == [op.id for op in sched.ops]
    for bad in (-1, len(sched.ops), True, "0"):
        with pytest.raises(KeyError):
            sim.op_start[bad]
    renumbered = Schedule(sched.name, sched.collective, sched.topology,
                          tuple(_shift_ids(op, 10) for op in sched.ops))
    other = simulate(renumbered, topo, SIZE)
    assert isinstance(other.op_finish, dict)
    assert other.op_finish == {k + 10: v for k, v in as_dict.items()}


def _shift_ids(op: Op, k: int) -> Op:
    from dataclasses import replace

    return replace(op, id=op.id + k, deps=tuple(d + k for d in op.deps))


def test_dependency_outside_the_schedule_is_named_for_position_ids():
    topo = ring(2)
    sched = Schedule("bad", _custom(2, 1), topo.name, (_transfer(0, 0, 1), _transfer(1, 1, 0, deps=(5,), step=1)))
    with pytest.raises(ScheduleError, match="op 1 depends on op 5, which is not in the schedule"):
        simulate(sched, topo, SIZE)
