"""The grouped volume bound: hand-computed values, groups that form a requirement
inside, and validity against the schedules collc synthesizes and the standard
library's algorithms on random small topologies."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis_nets import GB, build, two_groups
from collc import frontend
from collc.analysis.bounds import _messages_for, lower_bounds
from collc.analysis.demand import requirements
from collc.analysis.simulate import simulate
from collc.diagnostics import CollcError
from collc.ir import ChunkId, Collective, CollectiveKind, Topology
from collc.ir.collective import standard
from collc.synthesis.core import synthesize
from collc.synthesis.options import Method, SynthesisOptions

GIB = 1 << 30
SIZE = 10**9


def approx(x):
    return pytest.approx(x, rel=1e-9)


def three_switches(fast: float = 100 * GB, slow: float = 1 * GB) -> Topology:
    """Three 2-GPU groups, each on its own switch; every pair of switches joined by a slow link."""
    gpus = [f"{s}{i}" for s in "abc" for i in range(2)]
    edges = [(g, f"s{g[0]}", fast) for g in gpus]
    edges += [("sa", "sb", slow), ("sb", "sc", slow), ("sa", "sc", slow)]
    return build("three_switches", gpus, ["sa", "sb", "sc"], edges)


def test_dgx_h100_eight_nodes_allreduce_counts_messages_between_nodes():
    topo = frontend.resolve_topology("dgx_h100(nodes=8)")
    lb = lower_bounds(topo, standard("allreduce", 64), GIB)
    # Every chunk's sum leaves 7 nodes' parts and reaches 7 other nodes: 14 x M between
    # nodes, over 8 nodes x 8 rail links of 400 Gbit/s entering them.
    assert lb.volume_s == approx(2 * 7 * GIB / (8 * 8 * 50e9))
    assert lb.volume_s * 1e6 == pytest.approx(4697.62, abs=0.01)
    assert lb.volume_partition == "links above 50 GB/s (8 groups)"
    assert lb.dominant == "volume" and lb.best_s == lb.volume_s


def test_dgx_h100_two_nodes_allreduce_keeps_the_gossip_count_between_gpus_with_their_nics():
    topo = frontend.resolve_topology("dgx_h100(nodes=2)")
    lb = lower_bounds(topo, standard("allreduce", 16), GIB)
    # Between ranks: 2 x 15 messages per requirement. Into a GPU alone come 450 GB/s of
    # NVLink and 64 GB/s of PCIe from its NIC, but into the GPU with its NIC only 450 +
    # 50 GB/s (the rail); the two nodes as groups give only 2 x 1 x M / (2 x 400 GB/s).
    assert lb.volume_s == approx(2 * 15 * GIB / (16 * 500e9))
    assert lb.volume_partition == "GPUs with the NICs only they reach (16 groups)"


def test_dgx_h100_allgather_between_nodes_equals_the_cut():
    topo = frontend.resolve_topology("dgx_h100(nodes=8)")
    lb = lower_bounds(topo, standard("allgather", 64), GIB)
    assert lb.volume_s == approx(7 * GIB / (8 * 400e9))
    assert lb.volume_s == approx(lb.cut_s)
    assert lb.dominant == "cut"  # a tie goes to the cut, which names its witness


def test_three_switches_allreduce_beats_every_cut():
    lb = lower_bounds(three_switches(), standard("allreduce", 6), SIZE)
    # Per requirement 3 owner groups and 3 needing groups: 3 + 3 - 2 = 4 messages of
    # 1/6 GB, 6 requirements; 2 GB/s enters each switch's group: 4 GB / 6 GB/s.
    assert lb.volume_s == approx(4 / 6)
    assert lb.volume_partition == "links above 1 GB/s (3 groups)"
    assert lb.cut_s == approx(1 / 2)  # one group sends its 1 GB over 2 GB/s
    assert lb.dominant == "volume"


def test_two_switch_toy_allreduce():
    lb = lower_bounds(two_groups(), standard("allreduce", 4), SIZE)
    # 2 messages per requirement between the switches' groups, 4 of 1/4 GB, over 1 + 1 GB/s.
    assert lb.volume_s == approx(1.0)
    assert lb.cut_s == approx(1.0)


def _single(rank: int) -> tuple[frozenset, ...]:
    return (frozenset({ChunkId(rank, 0)}),)


def test_a_group_holding_every_chunk_does_not_need_the_requirement():
    # a1 and b0 need a0's and a1's chunks reduced: at a1 that is one message from a0,
    # but the group {a0, a1} forms it inside, and only b0's side needs a message.
    total = frozenset({ChunkId(0, 0), ChunkId(1, 0)})
    coll = Collective("pairsum", CollectiveKind.CUSTOM, 4, 1, tuple(_single(r) for r in range(4)),
                      ((None,), (total,), (total,), (None,)))
    (req,) = requirements(coll)
    assert req.needers == {1, 2}
    assert _messages_for(req, (0, 1, 2, 3)) == 2
    assert _messages_for(req, (0, 0, 1, 1)) == 1
    assert _messages_for(req, (0, 0, 0, 1)) == 0  # the needers' group holds it all
    lb = lower_bounds(two_groups(), coll, SIZE)
    assert lb.volume_s == approx(1 / 2)  # 1 GB between the sides, 1 + 1 GB/s entering them


def test_chunks_held_by_several_groups_count_once_per_disjoint_holder():
    # Rank 3 needs chunks x (held by ranks 0 and 2) and y (held by rank 1) reduced.
    x, y = ChunkId(0, 0), ChunkId(1, 0)
    inputs = ((frozenset({x}),), (frozenset({y}),), (frozenset({x}),), (frozenset({ChunkId(3, 0)}),))
    coll = Collective("mixed", CollectiveKind.CUSTOM, 4, 1, inputs,
                      ((None,), (None,), (None,), (frozenset({x, y}),)))
    (req,) = requirements(coll)
    # Between ranks: x's part leaves rank 0 or 2 and y's leaves rank 1 in messages of
    # their own (disjoint holders), or rank 3 gets the sum from one of them: 2 messages.
    assert _messages_for(req, (0, 1, 2, 3)) == 2
    assert _messages_for(req, (0, 0, 1, 1)) == 1  # group 0 holds x and y; group 1 needs
    assert _messages_for(req, (0, 1, 0, 1)) == 1  # group 1 holds y and needs; group 0 has x


# --- validity on random small topologies ----------------------------------------------

KINDS = ("allgather", "reducescatter", "allreduce", "alltoall")


@st.composite
def topologies(draw) -> Topology:
    """3-5 GPUs, 0-2 switches, links of a few capacities, some one-way; strongly connected."""
    n = draw(st.integers(3, 5))
    gpus = [f"g{i}" for i in range(n)]
    switches = [f"s{i}" for i in range(draw(st.integers(0, 2)))]
    names = gpus + switches
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    chosen = draw(st.lists(st.sampled_from(pairs), min_size=n, max_size=len(pairs), unique=True))
    edges = []
    for a, b in chosen:
        bw = draw(st.sampled_from([1, 2, 10, 50])) * GB
        way = draw(st.sampled_from(["both", "both", "ab", "ba", "uneven"]))
        if way in ("both", "uneven", "ab"):
            edges.append((a, b, bw))
        if way in ("both", "ba"):
            edges.append((b, a, bw))
        if way == "uneven":
            edges.append((b, a, draw(st.sampled_from([1, 2, 10, 50])) * GB))
    g = nx.DiGraph()
    g.add_nodes_from(names)
    g.add_edges_from((a, b) for a, b, _ in edges)
    if not nx.is_strongly_connected(g):
        # Close the loop through the GPUs so that every demand is reachable.
        edges += [(gpus[i], gpus[(i + 1) % n], 1 * GB) for i in range(n)]
        g.add_edges_from((gpus[i], gpus[(i + 1) % n]) for i in range(n))
        if not nx.is_strongly_connected(g):
            edges += [(s, gpus[0], 1 * GB) for s in switches] + [(gpus[0], s, 1 * GB) for s in switches]
    return build("random", gpus, switches, edges, directed=True)


@st.composite
def clusters(draw) -> Topology:
    """2-4 groups of 1-3 GPUs, each on a switch with fast links; slow links between the
    switches, some one-way or uneven (kept strongly connected): where the count between
    groups is the largest bound."""
    sizes = draw(st.lists(st.integers(1, 3), min_size=2, max_size=4))
    gpus, switches, edges = [], [], []
    for k, size in enumerate(sizes):
        sw = f"s{k}"
        switches.append(sw)
        for _ in range(size):
            g = f"g{len(gpus)}"
            gpus.append(g)
            fast = draw(st.sampled_from([40, 100])) * GB
            edges += [(g, sw, fast), (sw, g, draw(st.sampled_from([fast, fast / 2])))]
    for a in switches:
        for b in switches:
            bw = draw(st.sampled_from([0, 1, 1, 2])) if a != b else 0
            if bw:
                edges.append((a, b, bw * GB))
    links = {e[:2] for e in edges}
    for k, a in enumerate(switches):  # a one-way ring keeps every group reachable
        b = switches[(k + 1) % len(switches)]
        if (a, b) not in links:
            edges.append((a, b, 1 * GB))
    return build("clusters", gpus, switches, edges, directed=True)


def _stdlib_schedule(topo: Topology, kind: str):
    algo = "direct" if kind == "alltoall" else "ring"
    try:
        return frontend.instantiate_algorithm(algo, topo, standard(kind, topo.num_ranks))
    except CollcError:
        return None  # the algorithm does not fit this topology (no path, one-way links)


@settings(max_examples=20, deadline=None, database=None)
@given(topo=st.one_of(topologies(), clusters()), kind=st.sampled_from(KINDS))
def test_volume_never_exceeds_what_schedules_achieve(topo, kind):
    coll = standard(kind, topo.num_ranks)
    lb = lower_bounds(topo, coll, SIZE)
    # A small op budget: the bound must hold for any schedule, and at the default budget
    # an AllReduce on some drawn clusters is the direct one in ~1,000 pieces a chunk
    # (280,000 ops: a minute to list-schedule, for no more coverage).
    schedules = [synthesize(topo, coll, SIZE, SynthesisOptions(method=Method.STEADY, progress=False,
                                                              time_limit=20, max_ops=20_000)).schedule]
    ring = _stdlib_schedule(topo, kind)
    if ring is not None:
        schedules.append(ring)
    for sched in schedules:
        for sharing in ("fifo", "fair"):
            assert lb.volume_s <= simulate(sched, topo, SIZE, sharing=sharing).time_s * (1 + 1e-9), sched.name
