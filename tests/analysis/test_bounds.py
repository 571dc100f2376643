"""Lower bounds: hand-computed cases, the exact cut search against enumeration, and
validity against simulated schedules."""

from __future__ import annotations

import random

import networkx as nx
import pytest

from analysis_nets import (
    GB, US, brute_force_cut, build, chain, dgx2_x2, lopsided, naive_crossing, naive_out_capacity, ndv2_x2,
    reversed_topology, ring, star, torus, two_groups,
)
from collc.analysis.bounds import cut_bound_of, lower_bounds
from collc.analysis.demand import greedy_disjoint, requirements
from collc.analysis.simulate import simulate
from collc.diagnostics import CollcError
from collc.ir import Buffer, ChunkId, Collective, CollectiveKind, Loc, Op, OpKind, Schedule
from collc.ir.collective import allgather, alltoall, standard
from collc.verify import verify
from schedules import ring_allgather

SIZE = 10**9
EVERY_KIND = [k for k in CollectiveKind if k is not CollectiveKind.CUSTOM]


def approx(x):
    return pytest.approx(x, rel=1e-9)


def test_ring4_allgather_by_hand():
    # Each GPU lacks 3 slots of 0.25 GB and has 2 x 10 GB/s coming in.
    lb = lower_bounds(ring(4), allgather(4), SIZE)
    assert lb.ingress_s == approx(0.75 / 20)
    assert lb.egress_s == approx(0.25 / 20)
    assert lb.cut_s == approx(0.75 / 20)  # three GPUs against the fourth
    assert lb.latency_s == approx(2 * US)  # the opposite GPU is two hops away
    assert lb.best_s == approx(0.0375)
    assert len(lb.cut_witness) == 3


def test_switch_allgather_by_hand():
    lb = lower_bounds(star(4), allgather(4), SIZE)
    assert lb.ingress_s == approx(0.75 / 10)
    assert lb.cut_s == approx(0.75 / 10)
    assert lb.latency_s == approx(2 * US)


def test_slow_link_between_groups_makes_the_cut_dominate():
    lb = lower_bounds(two_groups(), allgather(4), SIZE)
    assert lb.ingress_s == approx(0.75 / 100)
    assert lb.cut_s == approx(0.5 / 1)  # half the data crosses the 1 GB/s link
    assert lb.dominant == "cut" and lb.best_s == lb.cut_s
    assert set(lb.cut_witness) in ({"a0", "a1", "sa"}, {"b0", "b1", "sb"})
    assert lb.latency_s == approx(3 * US)


def test_broadcast_on_a_chain():
    lb = lower_bounds(chain(4), standard("broadcast", 4, root=0), SIZE)
    assert lb.ingress_s == approx(1 / 10)  # the far end has one 10 GB/s link in
    assert lb.egress_s == approx(1 / 10)
    assert lb.cut_s == approx(1 / 10)
    assert lb.latency_s == approx(3 * US)
    # Three receptions of 1 GB over 60 GB/s of GPU in-capacity in all.
    assert lb.volume_s == approx(3 / 60)


def test_allreduce_volume_is_two_n_minus_one_over_n():
    lb = lower_bounds(ring(4), standard("allreduce", 4), SIZE)
    assert lb.volume_s == approx(2 * 3 / 4 * 1 / 20)
    assert lb.ingress_s == approx(1 / 20)  # every slot needs contributions from elsewhere
    assert lb.dominant == "volume"


def test_alltoall_cut_finds_the_bisection_of_a_ring():
    lb = lower_bounds(ring(4), alltoall(4), SIZE)
    # Two adjacent GPUs send 4 slots of 0.25 GB to the other two over two links.
    assert lb.cut_s == approx(1.0 / 20)
    assert len(lb.cut_witness) == 2
    assert lb.egress_s == approx(0.75 / 20)


def test_alltoall_cut_finds_half_a_torus():
    # One row (4 GPUs, 8 links out) is a local optimum for one-node moves; two rows send
    # 8 x 8 slots of 1/16 GB over 8 links of 25 GB/s: 20 ms.
    lb = lower_bounds(torus(4, 4), alltoall(16), SIZE)
    assert lb.cut_s == approx(4 / 200)
    assert len(lb.cut_witness) == 8


def test_teccl_reference_figures():
    # reference.md: DGX-2 x2 AllGather 1 GB meets its ingress bound, 7,750 us.
    lb = lower_bounds(dgx2_x2(), allgather(32), SIZE)
    assert lb.ingress_s * 1e6 == approx(7750.0)
    assert lb.best_s == approx(lb.ingress_s)
    # NDv2 x2 AllGather 1 GB: a chassis' 0.5 GB leaves through one 12.5 GB/s link: 40 ms.
    lb = lower_bounds(ndv2_x2(), allgather(16), SIZE)
    assert lb.cut_s == approx(0.040)
    assert lb.dominant == "cut"
    assert sorted(lb.cut_witness) in (sorted([f"c0g{i}" for i in range(8)] + ["c0nic"]),
                                      sorted([f"c1g{i}" for i in range(8)] + ["c1nic"]))


@pytest.mark.parametrize("topo", [ring(4), star(4), two_groups(), lopsided(), chain(4)], ids=lambda t: t.name)
@pytest.mark.parametrize("kind", EVERY_KIND, ids=lambda k: k.value)
def test_cut_equals_enumeration_over_every_node_set(topo, kind):
    coll = standard(kind, topo.num_ranks, 1, root=1)
    assert lower_bounds(topo, coll, SIZE).cut_s == approx(brute_force_cut(coll, topo, SIZE))


def _random_topology(rng: random.Random):
    gpus = [f"g{i}" for i in range(rng.choice([3, 4]))]
    switches = [f"s{i}" for i in range(rng.choice([0, 1, 2]))]
    names = gpus + switches
    while True:
        edges = [(a, b, rng.choice([1, 2, 5, 10]) * GB, rng.choice([1, 2]))
                 for a in names for b in names if a != b and rng.random() < 0.4]
        g = nx.DiGraph()
        g.add_nodes_from(names)
        g.add_edges_from((a, b) for a, b, *_ in edges)
        if nx.is_strongly_connected(g):
            return build("random", gpus, switches, edges, directed=True)


def test_cut_equals_enumeration_on_random_directed_topologies():
    rng = random.Random(7)
    for _ in range(6):
        topo = _random_topology(rng)
        for kind in EVERY_KIND:
            coll = standard(kind, topo.num_ranks, 1, root=rng.randrange(topo.num_ranks))
            assert lower_bounds(topo, coll, SIZE).cut_s == approx(brute_force_cut(coll, topo, SIZE)), kind


def test_reducescatter_is_allgather_with_links_reversed():
    topo = lopsided()
    n = topo.num_ranks
    # Equal sizes mean equal slots: nccl-tests counts AllGather's n-slot output and
    # ReduceScatter's n-slot input.
    rs = lower_bounds(topo, standard("reducescatter", n), SIZE).cut_s
    ag = lower_bounds(reversed_topology(topo), allgather(n), SIZE).cut_s
    assert rs == approx(ag)


def test_cut_of_a_given_set_matches_the_definition():
    topo = two_groups()
    coll = standard("alltoall", 4)
    for nodes in ({"a0"}, {"a0", "sa"}, {"a0", "a1", "sa"}, {"a0", "b1", "sb"}):
        expected = SIZE / 4 * naive_crossing(coll, topo, nodes) / naive_out_capacity(topo, nodes)
        assert cut_bound_of(topo, coll, SIZE, nodes) == approx(expected)


def _send_recv(ranks: int, src: int, dst: int) -> Collective:
    inputs = tuple((frozenset({ChunkId(r, 0)}),) for r in range(ranks))
    outputs = tuple(((frozenset({ChunkId(src, 0)}) if r == dst else None),) for r in range(ranks))
    return Collective("sendrecv", CollectiveKind.CUSTOM, ranks, 1, inputs, outputs)


def test_custom_point_to_point_demand():
    # g0 -> g3 on a ring: two disjoint 10 GB/s routes, one slot of 1 GB.
    lb = lower_bounds(ring(4), _send_recv(4, 0, 3), SIZE)
    assert lb.cut_s == approx(1 / 20)
    assert lb.ingress_s == approx(1 / 20)
    assert lb.latency_s == approx(1 * US)
    # One message between the cut witness's two sides, whose entering links carry
    # 2 x 10 GB/s each way (one message over all 80 GB/s of GPU in-capacity would be 1/80).
    assert lb.volume_s == approx(1 / 40)


def test_overlapping_requirements_count_only_what_cannot_share_a_message():
    a, b, c = ChunkId(0, 0), ChunkId(1, 0), ChunkId(2, 0)
    single = lambda r: (frozenset({ChunkId(r, 0)}),)  # noqa: E731
    # Rank 2 holds c and needs a+b and a+c: the second needs only a (one message can
    # carry a for both), the first a+b; the missing sets {a, b} and {a} overlap.
    coll = Collective("overlap", CollectiveKind.CUSTOM, 3, 1, (single(0), single(1), single(2)),
                      ((None, None), (None, None), (frozenset({a, b}), frozenset({a, c}))))
    reqs = requirements(coll)
    assert [sorted(r.missing_at(2)) for r in reqs] == [[a, b], [a]]
    assert greedy_disjoint(r.missing_at(2) for r in reqs) == [frozenset({a})]
    lb = lower_bounds(star(3), coll, SIZE)
    assert lb.ingress_s == approx(SIZE / 2 / 10 / GB)  # one slot of 0.5 GB over 10 GB/s


def test_unreachable_demand_is_an_error():
    topo = build("oneway", ["g0", "g1"], [], [("g0", "g1", GB)], directed=True)
    with pytest.raises(CollcError, match="no path of links leads to g0"):
        lower_bounds(topo, allgather(2), SIZE)


def test_chunk_nobody_holds_is_an_error():
    inputs = ((frozenset({ChunkId(0, 0)}),), (frozenset({ChunkId(1, 0)}),))
    coll = Collective("bad", CollectiveKind.CUSTOM, 2, 1, inputs, ((frozenset({ChunkId(1, 5)}),), (None,)))
    with pytest.raises(CollcError, match=r"no rank's input holds chunk\(1, 5\)"):
        lower_bounds(ring(2), coll, SIZE)


def test_rank_count_mismatch_is_an_error():
    with pytest.raises(CollcError, match="4 ranks but topology 'ring3' has 3 GPUs"):
        lower_bounds(ring(3), allgather(4), SIZE)


def test_json_has_microseconds_and_witness():
    data = lower_bounds(two_groups(), allgather(4), SIZE).to_json()
    assert data["cut_us"] == approx(500_000.0)
    assert data["best_us"] == data["cut_us"]
    assert data["dominant"] == "cut"
    assert len(data["cut_witness"]) == 3
    # The volume bound names the grouping of GPUs it counts messages between.
    assert data["volume_partition"] == "links above 1 GB/s (2 groups)"
    assert data["volume_us"] == approx(500_000.0)
    assert set(data) >= {"volume_s", "volume_us", "volume_partition"}


def _direct(coll: Collective, transfers) -> Schedule:
    """One step of copies (src rank, input index, dst rank, output index), all at once."""
    ops = [Op(i, OpKind.COPY, Loc(src, Buffer.INPUT, si), Loc(dst, Buffer.OUTPUT, di))
           for i, (src, si, dst, di) in enumerate(transfers)]
    return Schedule("direct", coll, "t", tuple(ops))


def test_direct_alltoall_on_a_switch_meets_the_ingress_bound():
    n = 4
    sched = _direct(alltoall(n), [(s, d, d, s) for s in range(n) for d in range(n)])
    verify(sched, star(n))
    lb = lower_bounds(star(n), alltoall(n), SIZE)
    sim = simulate(sched, star(n), SIZE, sharing="fair")
    assert sim.time_s == approx(lb.best_s + 2 * US)


def test_bounds_hold_for_simulated_ring_schedules():
    for n in (3, 4, 6):
        lb = lower_bounds(ring(n), allgather(n), SIZE)
        for sharing in ("fifo", "fair"):
            assert lb.best_s <= simulate(ring_allgather(n), ring(n), SIZE, sharing=sharing).time_s


def test_direct_allreduce_on_a_switch_meets_the_volume_bound():
    # Reduce-scatter by three chained reductions into each rank's own slot (a
    # permutation per step), then every rank sends its sum to the three others.
    n = 4
    coll = standard("allreduce", n)
    ops: list[Op] = []
    last = {}
    for r in range(n):
        ops.append(Op(len(ops), OpKind.COPY, Loc(r, Buffer.INPUT, r), Loc(r, Buffer.OUTPUT, r)))
        last[r] = ops[-1].id
    for k in range(1, n):
        for r in range(n):
            s = (r + k) % n
            ops.append(Op(len(ops), OpKind.REDUCE, Loc(s, Buffer.INPUT, r), Loc(r, Buffer.OUTPUT, r),
                          deps=(last[r],), step=k))
            last[r] = ops[-1].id
    for r in range(n):
        for d in range(n):
            if d != r:
                ops.append(Op(len(ops), OpKind.COPY, Loc(r, Buffer.OUTPUT, r), Loc(d, Buffer.OUTPUT, r),
                              deps=(last[r],), step=n))
    sched = Schedule("direct_allreduce", coll, "star4", tuple(ops))
    verify(sched, star(n))
    lb = lower_bounds(star(n), coll, SIZE)
    assert lb.dominant == "volume" and lb.volume_s == approx(2 * (n - 1) / n * 1 / 10)
    sim = simulate(sched, star(n), SIZE, sharing="fair")
    assert sim.time_s == approx(lb.best_s + n * 2 * US)


def test_stdlib_topologies_reproduce_the_teccl_figures():
    from collc import frontend

    dgx2 = frontend.resolve_topology("dgx2")
    assert lower_bounds(dgx2, allgather(dgx2.num_ranks), SIZE).best_s * 1e6 == approx(7750.0)
    ndv2 = frontend.resolve_topology("ndv2")
    lb = lower_bounds(ndv2, allgather(ndv2.num_ranks), SIZE)
    assert lb.cut_s == approx(0.040) and lb.dominant == "cut"


@pytest.mark.parametrize("spec", ["alltoall", "alltoall(chunks=2)", "allgather", "allreduce"])
def test_messages_counted_on_arrays_equal_requirement_by_requirement(spec):
    """The grouped volume's count of one-chunk, one-holder, one-needer requirements on
    arrays equals `_messages_for` summed, over partitions of ranks into groups."""
    from collc.analysis.bounds import _messages_between, _messages_for
    import collc.frontend as fe
    from collc.analysis.demand import disjoint_requirements

    family = disjoint_requirements(tuple(r for r in requirements(fe.resolve_collective(spec, 8)) if r.needers))
    for group_of in [tuple(range(8)), (0, 0, 1, 1, 2, 2, 3, 3), (0, 1, 0, 1, 0, 1, 0, 1), (0,) * 7 + (1,)]:
        assert _messages_between(family, group_of) == sum(_messages_for(r, group_of) for r in family)
