"""ReduceScatter, Reduce and AllReduce by reversing copy schedules."""

import pytest

from collc.analysis.simulate import simulate
from collc.ir.collective import standard
from collc.ir.schedule import OpKind
from collc.synthesis.core import synthesize
from collc.synthesis.options import Method, SynthesisOptions
from collc.verify import verify
from topos import ring, switch, two_chassis


@pytest.mark.parametrize("kind", ["reducescatter", "allreduce", "reduce"])
@pytest.mark.parametrize("method", ["milp", "steady", "auto"])
@pytest.mark.parametrize("topo", [ring(4), switch(4), two_chassis(2)], ids=lambda t: t.name)
def test_reductions_compose_into_verified_schedules(kind, method, topo):
    coll = standard(kind, topo.num_ranks, 1, 0)
    res = synthesize(topo, coll, 1 << 20, SynthesisOptions(method=Method(method), progress=False, time_limit=20))
    sched = res.schedule
    verify(sched, topo)
    assert sched.collective.kind == coll.kind and sched.collective.name == coll.name
    assert any(op.kind is OpKind.REDUCE for op in sched.ops)
    assert simulate(sched, topo, 1 << 20).time_s == pytest.approx(res.estimate_s, rel=1e-9)


def test_one_way_ring_reducescatter_runs_against_the_links_of_its_allgather():
    topo = ring(4, bidirectional=False)
    res = synthesize(topo, standard("reducescatter", 4), 1 << 20,
                     SynthesisOptions(method=Method.MILP, progress=False))
    # Every reduction travels along an existing (one-way) link.
    for op in res.schedule.ops:
        if op.is_transfer:
            assert (op.dst.rank - op.src.rank) % 4 == 1
    assert res.schedule.meta["method"] == "milp"


def test_allreduce_is_reducescatter_then_allgather_per_chunk():
    topo = switch(4)
    res = synthesize(topo, standard("allreduce", 4, 2), 8 << 20,
                     SynthesisOptions(method=Method.STEADY, chunks=2, progress=False))
    ops = res.schedule.ops
    reduces = [op for op in ops if op.kind is OpKind.REDUCE]
    copies = [op for op in ops if op.kind is OpKind.COPY and op.is_transfer]
    assert len(reduces) == 4 * 3 * 2 and len(copies) == 4 * 3 * 2
    assert res.schedule.scratch == ()  # partial sums gather in the output buffer


def test_custom_reductions_in_no_standard_form_are_refused():
    """A sum over two of three ranks is no ReduceScatter, AllReduce or Reduce (a
    custom collective in one of those forms is composed like it: tests/synthesis/test_problem.py)."""
    from collc.diagnostics import CollcError
    from collc.ir.collective import ChunkId, Collective, CollectiveKind

    inputs = tuple((frozenset({ChunkId(r, 0)}),) for r in range(3))
    outputs = ((frozenset({ChunkId(0, 0), ChunkId(1, 0)}),), (None,), (None,))
    coll = Collective("mine", CollectiveKind.CUSTOM, 3, 1, inputs, outputs)
    with pytest.raises(CollcError, match="ReduceScatter, AllReduce and Reduce"):
        synthesize(switch(3), coll, 1 << 20, SynthesisOptions(progress=False))


def _three_switches():
    """Three 2-GPU groups on switches joined pairwise by 1 GB/s links: the AllReduce's
    bound counts the messages between the groups (collc.analysis.bounds, grouped volume)."""
    from collc.ir import Link, Node, NodeKind, Topology

    gpus = [f"{s}{i}" for s in "abc" for i in range(2)]
    nodes = [Node(g, NodeKind.GPU, r) for r, g in enumerate(gpus)] + [Node(f"s{s}", NodeKind.SWITCH) for s in "abc"]
    pairs = [(g, f"s{g[0]}", 100e9) for g in gpus] + [("sa", "sb", 1e9), ("sb", "sc", 1e9), ("sa", "sc", 1e9)]
    links = [Link(a, b, bw, 1e-6) for a, b, bw in pairs] + [Link(b, a, bw, 1e-6) for a, b, bw in pairs]
    return Topology("three_switches", tuple(nodes), tuple(links))


def test_allreduce_composition_meets_the_bound_between_groups():
    from collc.analysis.bounds import lower_bounds

    topo = _three_switches()
    coll = standard("allreduce", 6)
    res = synthesize(topo, coll, 1 << 30, SynthesisOptions(progress=False))
    lb = lower_bounds(topo, coll, 1 << 30)
    # Every chunk's sum gathers from three groups and spreads to three: 4 x M / 6 GB/s,
    # above every cut (M / 2 GB/s); reduce-scatter then all-gather comes within 1%.
    assert lb.dominant == "volume" and lb.volume_s == pytest.approx(4 * (1 << 30) / 6e9)
    assert lb.cut_s == pytest.approx((1 << 30) / 2e9)
    assert lb.volume_s <= res.estimate_s <= 1.01 * lb.volume_s
    verify(res.schedule, topo)


@pytest.mark.parametrize("collector_on", [True, False])
def test_composition_leaves_the_garbage_collector_as_it_found_it(collector_on):
    import gc

    was = gc.isenabled()
    try:
        gc.enable() if collector_on else gc.disable()
        first = synthesize(switch(4), standard("allreduce", 4), 1 << 20, SynthesisOptions(progress=False))
        assert gc.isenabled() is collector_on
    finally:
        gc.enable() if was else gc.disable()
    again = synthesize(switch(4), standard("allreduce", 4), 1 << 20, SynthesisOptions(progress=False))
    assert again.schedule.ops == first.schedule.ops


def test_reductions_replay_the_copy_schedule_backwards_in_its_start_order():
    from collc.ir.collective import CollectiveKind, allgather
    from collc.synthesis.auto import choose
    from collc.synthesis.compose import _start_order
    from collc.synthesis.halves import reduction_ops
    from collc.synthesis.network import Network
    from collc.synthesis.progress import Progress
    from collc.synthesis.solver import Deadline

    topo = two_chassis(2)
    net = Network(topo)
    opts = SynthesisOptions(method=Method.STEADY, chunks=2, progress=False)
    cand = choose(net, allgather(4), 8 << 20, opts, Deadline(20), Progress(enabled=False))
    order = _start_order(cand.ops.ops)
    # Every chunk reaches every rank but its owner once, by a transfer in start order.
    assert sorted(order) == sorted((o, i, r) for o in range(4) for i in range(2) for r in range(4) if r != o)
    ops, _, _ = reduction_ops(cand.plan, CollectiveKind.ALLREDUCE, net, order)
    reduces = [op for op in ops if op.kind is OpKind.REDUCE]
    # A reduction from child c of chunk (o, i) runs in the reverse of the copy to c.
    # (An AllReduce sums chunk (o, i) in output slot 2 o + i.)
    keys = [order[(*divmod(op.dst.index, 2), op.src.rank)] for op in reduces]
    assert len(reduces) == len(order)
    assert all(a > b for a, b in zip(keys, keys[1:]))


def test_partial_sums_into_one_rank_land_in_scratch_where_that_is_faster():
    from collc.analysis.bounds import lower_bounds
    from topos import dgx1

    # On dgx1 a relay of the AllGather sends one chunk to several GPUs at once over
    # different links; reversed, their partial sums into the relay were chained, each
    # transfer waiting for the one before it: 2.14 of the bound at 2 chunks per rank.
    # Landing in scratch: 1.50.
    topo = dgx1()
    coll = standard("reducescatter", 8, 1)
    res = synthesize(topo, coll, 1 << 30, SynthesisOptions(progress=False, chunks=2))
    verify(res.schedule, topo)
    assert res.estimate_s / lower_bounds(topo, coll, 1 << 30).best_s < 1.8
    landings = [op for op in res.schedule.ops if op.is_transfer and op.kind is OpKind.COPY]
    assert landings and all(op.dst.buffer.name == "SCRATCH" for op in landings)
    assert simulate(res.schedule, topo, 1 << 30).time_s == pytest.approx(res.estimate_s, rel=1e-9)


def test_landings_are_kept_only_where_they_are_faster():
    # On two chassis of two GPUs at 2 chunks per rank the chained partial sums list-
    # schedule better (1.0625 of the bound against 1.125): no landing is kept.
    topo = two_chassis(2)
    res = synthesize(topo, standard("reducescatter", 4, 1), 1 << 30, SynthesisOptions(progress=False, chunks=2))
    verify(res.schedule, topo)
    assert not any(op.is_transfer and op.kind is OpKind.COPY for op in res.schedule.ops)


def test_at_one_chunk_per_rank_partial_sums_land_too():
    from collc.analysis.bounds import lower_bounds
    from topos import dgx1

    # One chunk per rank is what the MSCCL budget leaves a 1,024-GPU ReduceScatter.
    # Chained there, its partial sums into a relay waited for each other: 3.00 of the
    # bound on dgx1 (1.044 on dgx_h100(nodes=128)). Landed: 1.29, the AllGather's pace.
    topo = dgx1()
    coll = standard("reducescatter", 8, 1)
    res = synthesize(topo, coll, 1 << 30, SynthesisOptions(progress=False, chunks=1))
    verify(res.schedule, topo)
    assert res.schedule.collective.chunks == 1
    assert res.estimate_s / lower_bounds(topo, coll, 1 << 30).best_s < 1.5
    assert res.facts["landings"] == sum(op.is_transfer and op.kind is OpKind.COPY for op in res.schedule.ops) > 0


def test_without_landings_partial_sums_are_chained():
    from topos import dgx1

    # What a backend that refuses the landings' extra steps at one chunk asks for.
    topo = dgx1()
    res = synthesize(topo, standard("reducescatter", 8, 1), 1 << 30,
                     SynthesisOptions(progress=False, chunks=1, landings=False))
    assert not any(op.is_transfer and op.kind is OpKind.COPY for op in res.schedule.ops)
    assert "landings" not in res.facts
    # At one chunk, the landings' local adds must fit the op budget too (on dgx1 at most
    # three sums reach one rank, so lanes are no cheaper than landing every sum).
    small = synthesize(topo, standard("reducescatter", 8, 1), 1 << 30,
                       SynthesisOptions(progress=False, chunks=1, max_ops=len(res.schedule.ops)))
    assert "landings" not in small.facts and small.schedule.ops == res.schedule.ops


def test_where_every_landing_does_not_fit_the_partial_sums_run_in_lanes():
    from collc.analysis.bounds import lower_bounds
    from collc.synthesis.compose import SPLIT_LANES
    from topos import dgx_h100

    # dgx_h100(nodes=4) at one chunk per rank: 1,120 ops chained (1.691 of the bound),
    # 1,984 with every sum landed (1.222). Within 1,500 ops every sum's landing does not
    # fit, and the sums into one rank run in lanes: 1,376 ops, 1.329.
    topo = dgx_h100(4)
    coll = standard("reducescatter", 32, 1)
    res = synthesize(topo, coll, 1 << 30, SynthesisOptions(progress=False, chunks=1, max_ops=1500))
    verify(res.schedule, topo)
    assert res.facts["landing_lanes"] == SPLIT_LANES and len(res.schedule.ops) <= 1500
    assert res.facts["landings"] == sum(op.is_transfer and op.kind is OpKind.COPY for op in res.schedule.ops) > 0
    assert res.estimate_s / lower_bounds(topo, coll, 1 << 30).best_s < 1.4
    assert simulate(res.schedule, topo, 1 << 30).time_s == pytest.approx(res.estimate_s, rel=1e-9)
