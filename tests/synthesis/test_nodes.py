"""AllReduce over identical nodes (collc.synthesis.nodes): reduce inside each node,
all-reduce along the rails, gather inside each node, in batches of whole ranges."""

from __future__ import annotations

from collections import Counter

import pytest

from collc.analysis.simulate import simulate
from collc.backends import BackendOptions, get_backend
from collc.backends.msccl_xml.lowering import lowered_algo
from collc.backends.msccl_xml.verify import verify_algo
from collc.diagnostics import CollcError
from collc.driver import CompileJob, schedule_for_backend
from collc.ir.collective import standard
from collc.ir.schedule import Buffer, Loc, Op, OpKind
from collc.ir.topology import NodeKind
from collc.passes.base import PipelineError, parse_pipeline
from collc.synthesis.core import synthesize
from collc.synthesis.nodes import (batch_count, batches_by_finish, batches_by_need, cut_by_key, flat_minimum_ops,
                                  node_groups, places, sub_topology, wanted)
from collc.synthesis.options import Method, SynthesisOptions
from collc.verify import verify
from topos import dgx1, dgx_h100, switch, two_chassis

GIB = 1 << 30


@pytest.fixture(scope="module")
def h2():
    return dgx_h100(nodes=2)


@pytest.fixture(scope="module")
def over_nodes(h2):
    coll = standard("allreduce", h2.num_ranks, 1)
    return synthesize(h2, coll, GIB, SynthesisOptions(progress=False, nodes="on"))


def test_nodes_come_from_gpu_names(h2):
    groups = node_groups(h2)
    assert groups.prefixes == ("node[0]", "node[1]")
    assert groups.ranks == (tuple(range(8)), tuple(range(8, 16)))
    assert groups.rail(3) == [3, 11]
    # GPUs without a part prefix, or parts of different shapes, are not nodes.
    assert node_groups(dgx1()) is None
    assert node_groups(switch(4)) is None
    assert node_groups(dgx_h100(nodes=1)) is None  # one node: nothing to compose over


def test_rail_and_node_sub_topologies_keep_only_what_joins_their_gpus(h2):
    rail = sub_topology(h2, [3, 11], "rail 3")
    assert [g.name for g in rail.gpus] == ["node[0].g[3]", "node[1].g[3]"]
    assert [g.rank for g in rail.gpus] == [0, 1]
    assert {n.name for n in rail.nodes if n.kind is not NodeKind.GPU} == {"node[0].hca[3]", "node[1].hca[3]",
                                                                          "rail[3]"}
    node = sub_topology(h2, range(8, 16), "node 1")
    assert {n.name for n in node.nodes if n.kind is not NodeKind.GPU} == {"node[1].nvswitch"}
    assert len(node.links) == 16
    # Every link of a sub-topology is a link of the cluster, with its figures.
    full = set(h2.links)
    assert set(rail.links) <= full and set(node.links) <= full


def test_allreduce_over_nodes_is_verified_and_timed_as_the_simulator_times_it(h2, over_nodes):
    sched = over_nodes.schedule
    verify(sched, h2)
    facts = over_nodes.facts["over_nodes"]
    assert facts["nodes"] == 2 and facts["gpus_per_node"] == 8 and facts["batches"] >= 2
    assert simulate(sched, h2, GIB).time_s == pytest.approx(over_nodes.estimate_s, rel=1e-9)
    # Inside a node, transfers move whole batch ranges; across nodes, one slot each,
    # and only between GPUs of one rail.
    slots = facts["rail_chunks"] * facts["nodes"]
    for op in sched.ops:
        if not op.is_transfer:
            continue
        if op.src.rank // 8 == op.dst.rank // 8:
            assert 1 <= op.count <= slots
        else:
            assert op.count == 1 and op.src.rank % 8 == op.dst.rank % 8
    # Piece l of the buffer crosses the rails only on rail l.
    for op in sched.ops:
        if op.is_transfer and op.src.rank // 8 != op.dst.rank // 8 and op.dst.buffer is Buffer.OUTPUT:
            assert op.dst.index // slots == op.dst.rank % 8


def test_over_nodes_costs_a_gpu_far_fewer_transfers_than_the_flat_composition(h2, over_nodes):
    flat = synthesize(h2, standard("allreduce", h2.num_ranks, 1), GIB, SynthesisOptions(progress=False, nodes="off"))

    def busiest(sched):
        return max(Counter(op.src.rank for op in sched.ops if op.is_transfer).values())

    # At the same 128 chunks per rank: 3,844 sends from the busiest GPU flat, 480 over
    # nodes (each batch range inside a node is one send).
    assert "over_nodes" not in flat.facts and flat.chunks == over_nodes.chunks == 128
    assert 4 * busiest(over_nodes.schedule) < busiest(flat.schedule)


def test_the_same_schedule_every_time(h2, over_nodes):
    again = synthesize(h2, standard("allreduce", h2.num_ranks, 1), GIB,
                       SynthesisOptions(progress=False, nodes="on", time_limit=300))
    assert again.schedule.ops == over_nodes.schedule.ops


def test_over_nodes_lowers_to_msccl_xml_that_verifies(h2):
    job = CompileJob(h2, standard("allreduce", h2.num_ranks, 1), GIB, pipeline="synthesize{nodes=on}")
    options = BackendOptions()
    unit, solver = schedule_for_backend(job, get_backend("msccl-xml"), options)
    assert "over_nodes" in solver
    algo = lowered_algo(unit, options)
    report = verify_algo(algo, sms=132)
    assert report.ok, report.errors[:3]
    # A batch range is one XML step of several chunks.
    assert any(step.cnt > 1 for gpu in algo.gpus for tb in gpu.tbs for step in tb.steps)


def test_auto_goes_over_nodes_only_where_the_flat_composition_cannot_keep_to_the_op_budget(h2):
    coll = standard("allreduce", h2.num_ranks, 1)
    assert flat_minimum_ops(16) == 480
    assert wanted(h2, coll, SynthesisOptions()) is None
    assert wanted(h2, coll, SynthesisOptions(max_ops=480)) is None
    assert wanted(h2, coll, SynthesisOptions(max_ops=479)) is not None
    assert wanted(h2, coll, SynthesisOptions(max_ops=479, nodes="off")) is None
    # A ReduceScatter goes over nodes only where asked for (test_nodes_reducescatter).
    assert wanted(h2, standard("reducescatter", 16, 1), SynthesisOptions(max_ops=479)) is None
    assert wanted(h2, standard("alltoall", 16, 1), SynthesisOptions(max_ops=1)) is None
    # On a cluster without nodes, auto keeps the flat composition; asking for nodes fails clearly.
    topo = two_chassis(2)
    assert wanted(topo, standard("allreduce", 4, 1), SynthesisOptions(max_ops=1)) is None
    with pytest.raises(CollcError, match=r"over nodes on .*do not form two or more nodes"):
        synthesize(topo, standard("allreduce", 4, 1), GIB, SynthesisOptions(progress=False, nodes="on"))


def test_the_pass_option_is_checked():
    (p,) = parse_pipeline("synthesize{nodes=on}")
    assert p.options_for_synthesis().nodes == "on"
    with pytest.raises(PipelineError, match="nodes must be one of auto, on, off"):
        parse_pipeline("synthesize{nodes=sometimes}")


def test_places_follow_the_order_a_rail_first_needs_its_slots():
    def op(i, kind, src, dst):
        return Op(i, kind, src, dst)

    ops = (
        op(0, OpKind.COPY, Loc(0, Buffer.INPUT, 0), Loc(0, Buffer.OUTPUT, 0)),  # local: not a need
        op(1, OpKind.REDUCE, Loc(1, Buffer.INPUT, 2), Loc(0, Buffer.OUTPUT, 2)),
        op(2, OpKind.REDUCE, Loc(0, Buffer.INPUT, 1), Loc(1, Buffer.OUTPUT, 1)),
        op(3, OpKind.REDUCE, Loc(1, Buffer.INPUT, 0), Loc(0, Buffer.OUTPUT, 0)),
        op(4, OpKind.COPY, Loc(0, Buffer.OUTPUT, 3), Loc(1, Buffer.OUTPUT, 3)),  # a copy out: not a need
    )
    assert places(ops, 4) == [2, 1, 0, 3]


@pytest.mark.parametrize("slots, rail, node, budget, count", [
    (16, 256, 16, 100, 16),  # one place per batch at most
    (128, 256, 16, 100, 16),  # as many batches as keep node ops within rail ops
    (10, 100, 10, 3, 3),  # the op budget caps them
    (5, 1, 50, 100, 1),  # at least one batch
])
def test_batch_count(slots, rail, node, budget, count):
    assert batch_count(slots, rail, node, budget) == count


def test_batches_start_narrow_where_the_rails_need_places_at_once_and_widen_as_the_node_gets_ahead():
    # Places needed one every 10 us from place 4 up, then places 0..3 last; the node
    # makes a place in 5 us.
    need = [100.0, 110.0, 120.0, 130.0] + [10.0 * k for k in range(8)]
    cut = cut_by_key(need, 5.0, 5.0, widest=4)
    assert cut[0] == (4, 5)  # the first place needed comes alone
    assert [hi - lo for lo, hi in cut[:3]] == [1, 2, 4]  # then wider, as the node gets ahead
    assert max(hi - lo for lo, hi in cut) <= 4
    # Every place in exactly one range, each range made before its first place is needed + lag.
    assert sorted(p for lo, hi in cut for p in range(lo, hi)) == list(range(12))
    made = 0.0
    for lo, hi in cut:
        made += (hi - lo) * 5.0
        assert made <= min(need[lo:hi]) + 5.0 or hi - lo == 1
    # Within a count, the batches keep every place once, and the order of first needs.
    for count in (3, 5, 8):
        batches = batches_by_need(need, 5.0, count)
        assert len(batches) <= count
        assert sorted(p for lo, hi in batches for p in range(lo, hi)) == list(range(12))
        firsts = [min(need[lo:hi]) for lo, hi in batches]
        assert firsts == sorted(firsts)


def test_gathering_batches_end_narrow_on_what_the_rails_finish_last():
    final = [10.0 * k for k in range(16)]
    batches = batches_by_finish(final, 5.0, 6)
    assert len(batches) <= 6
    assert batches[-1] == (15, 16)  # the last place finished is gathered alone
    lasts = [max(final[lo:hi]) for lo, hi in batches]
    assert lasts == sorted(lasts)


def test_a_node_wired_differently_gets_its_own_node_level_schedules(h2, monkeypatch):
    from dataclasses import replace as dc_replace

    import collc.synthesis.nodes as nodes_module

    # Node 1's NVSwitch at half the bandwidth: its sub-topology is not node 0's renamed.
    slow = tuple(dc_replace(l, bandwidth=l.bandwidth / 2) if "node[1].nvswitch" in (l.src, l.dst) else l
                 for l in h2.links)
    topo = dc_replace(h2, links=slow)
    made = []
    real = nodes_module._node_parts

    def spy(*args):
        parts, results = real(*args)
        made.append(len(results))
        return parts, results

    monkeypatch.setattr(nodes_module, "_node_parts", spy)
    res = synthesize(topo, standard("allreduce", 16, 1), GIB, SynthesisOptions(progress=False, nodes="on"))
    verify(res.schedule, topo)
    assert made == [4]  # a ReduceScatter and an AllGather for each kind of node
    on_same = synthesize(h2, standard("allreduce", 16, 1), GIB, SynthesisOptions(progress=False, nodes="on"))
    assert res.estimate_s > on_same.estimate_s


def test_the_rail_ring_is_a_verified_allreduce_whose_gpus_need_their_blocks_counting_down():
    from collc.synthesis.nodes import needs
    from collc.synthesis.rail_ring import ring_allreduce

    topo = dgx_h100(nodes=4)
    rail = sub_topology(topo, node_groups(topo).rail(2), "rail 2")
    ring = ring_allreduce(rail, 2)
    verify(ring, rail)
    transfers = [op for op in ring.ops if op.is_transfer]
    assert len(transfers) == 2 * 3 * 4 * 2  # 2 (N - 1) steps, N GPUs, 2 slots per block
    assert all(op.dst.rank == (op.src.rank + 1) % 4 for op in transfers)
    # Each GPU needs its node's sums block by block, counting down: its own and the one
    # before in the first step (it sends one and adds to the other), then one a step.
    order: dict[int, list[int]] = {}
    for _, rank, slot in needs(ring.ops):
        block = slot // 2
        if block not in order.setdefault(rank, []):
            order[rank].append(block)
    for m in range(4):
        assert set(order[m][:2]) == {m, (m - 1) % 4} and order[m][2:] == [(m - 2) % 4, (m - 3) % 4]


def test_each_node_reduces_first_the_places_its_gpus_need_first():
    from collc.synthesis.network import Network
    from collc.synthesis.nodes import node_times, rail_times
    from collc.synthesis.rail_ring import ring_allreduce

    topo = dgx_h100(nodes=4)
    groups = node_groups(topo)
    subs = [sub_topology(topo, groups.rail(l), f"rail {l}") for l in range(8)]
    rails = [ring_allreduce(sub, 2) for sub in subs]
    times = [rail_times(r, Network(sub), 1 << 20, 8) for r, sub in zip(rails, subs)]
    rail_places = [places(r.ops, 8) for r in rails]
    for m in range(4):
        need, final = node_times(m, times, rail_places)
        batches = batches_by_need(need, 1e-6, 4)
        # Node m's GPUs send block m and add to block m - 1 first, then count down.
        assert batches[0][0] // 2 in {m, (m - 1) % 4}
        blocks = [lo // 2 for lo, _ in batches]
        assert blocks.index((m - 2) % 4) > max(blocks.index(m), blocks.index((m - 1) % 4))
        # It gathers last what its GPUs receive last: block m + 2 (block b is complete
        # on GPU b - 1 and travels on from there).
        assert max(range(8), key=lambda p: final[p]) // 2 == (m + 2) % 4


def test_rails_that_form_no_ring_fall_back_to_the_flat_composition_or_fail_clearly():
    from topos import stdlib

    # dgx2: chassis joined GPU 2s + 1 to GPU 2s of the other, so no rail is a ring.
    topo = stdlib("dgx2(chassis=2)")
    coll = standard("allreduce", 32, 1)
    with pytest.raises(CollcError, match=r"over the nodes of 'dgx2\(chassis=2\)': c\[0\]\.g\[0\] cannot reach "
                                         r"c\[1\]\.g\[0\].*form no ring"):
        synthesize(topo, coll, GIB, SynthesisOptions(progress=False, nodes="on"))
    # The steady method alone: the fallback does not depend on it, and auto's probe of
    # the time-expanded methods would double the test's time.
    flat = synthesize(topo, coll, GIB, SynthesisOptions(progress=False, max_ops=1000, method=Method.STEADY))
    assert wanted(topo, coll, SynthesisOptions(max_ops=1000)) is not None
    assert "over_nodes" not in flat.facts
    verify(flat.schedule, topo)


@pytest.mark.parametrize("kind", ["allgather", "alltoall"])
def test_nodes_on_is_for_allreduce_and_reducescatter_only(h2, kind):
    with pytest.raises(CollcError, match=f"cannot compose '{kind}' over nodes \\(nodes=on\\): only an AllReduce or"):
        synthesize(h2, standard(kind, 16, 1), GIB, SynthesisOptions(progress=False, nodes="on"))


def test_over_nodes_on_four_nodes_keeps_the_pipelines_ends_short():
    from collc.analysis.bounds import lower_bounds

    # At half the MSCCL XML backend's op budget (15 batches). Batches of a 15th of a
    # piece each, reduced in a fixed order of places, gave 1.228 of the bound; cut to
    # when the rails need and finish each place, 1.131 (most of the rest: each GPU's
    # ring needs two of its node's blocks in its first step). synthesize verifies.
    topo = dgx_h100(nodes=4)
    coll = standard("allreduce", 32, 1)
    res = synthesize(topo, coll, GIB, SynthesisOptions(progress=False, nodes="on", max_ops=512 * 32,
                                                       max_peers=32, peer_limit=130))
    assert res.estimate_s / lower_bounds(topo, coll, GIB).best_s < 1.17
