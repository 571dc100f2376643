"""Identical nodes: the symmetry found from names and checked on links, the rate LP
solved once per orbit and replicated, and the replicated schedule verified."""

from __future__ import annotations

import numpy as np
import pytest
import topos
from hypothesis import given, settings, strategies as st

from collc.analysis import bounds
from collc.analysis.symmetry import generators
from collc.ir import Link
from collc.ir.collective import standard
from collc.ir.topology import Topology
from collc.synthesis.candidates import problem_for, realize
from collc.synthesis.network import Network
from collc.synthesis.plan import Status
from collc.synthesis.problem import build_problem
from collc.synthesis.progress import Progress
from collc.synthesis.solver import Deadline, SolverOptions
from collc.synthesis.steady.pipelining import pipelined_plan
from collc.synthesis.steady.rates import _replicated_rates
from collc.synthesis.steady.replicated import link_orbits
from collc.synthesis.steady.trees import tree_rates
from collc.synthesis.symmetry import find_symmetry
from collc.synthesis.timing import DEFAULT_MODEL
from collc.verify import verify

MIB = 1 << 20


def test_dgx_h100_nodes_and_rails_form_one_orbit():
    net = Network(topos.dgx_h100(4))
    sym = find_symmetry(net)
    assert sym is not None and sym.representatives == [0]
    # Each automorphism maps rank 0 to its rank, and every link to a link alike.
    assert all(int(sym.rank_map[s][0]) == s for s in range(net.ranks))
    for s in (5, 17, 31):
        for l, img in enumerate(sym.link_map[s]):
            a, b = net.links[l], net.links[int(img)]
            assert (a.bandwidth, a.latency, a.multiplicity) == (b.bandwidth, b.latency, b.multiplicity)


def test_no_symmetry_is_claimed_where_links_differ():
    topo = topos.dgx_h100(2)
    # Slow down one NIC uplink of node 1: shifting nodes is no longer an automorphism.
    links = tuple(Link(l.src, l.dst, l.bandwidth / 2, l.latency, l.multiplicity)
                  if (l.src, l.dst) == ("node[1].hca[3]", "rail[3]") else l for l in topo.links)
    odd = Topology(topo.name, topo.nodes, links, topo.description)
    assert len(generators(topo)) == 2
    assert generators(odd) == []
    assert find_symmetry(Network(odd)) is None
    assert find_symmetry(Network(topos.dgx1())) is None


def test_replicated_rates_match_the_full_lp_and_the_schedule_verifies():
    topo = topos.dgx_h100(2)
    coll = standard("allgather", topo.num_ranks)
    problem = build_problem(coll, Network(topo), 256 * MIB)
    rates = _replicated_rates(problem, SolverOptions(), Deadline(60), Progress(False), 0.97)
    assert rates is not None and rates.replicated == 1 and rates.status is Status.OPTIMAL
    full = tree_rates(problem, SolverOptions(), Deadline(60), Progress(False), 0.97)
    assert rates.seconds == pytest.approx(full.seconds, rel=1e-6)
    bound = bounds.lower_bounds(topo, coll, 256 * MIB).best_s
    assert rates.seconds == pytest.approx(bound, rel=1e-6)
    # Every source has its representative's trees, mapped onto its own node and rail.
    assert len(rates.shares) == topo.num_ranks
    for (root, _), structures in rates.shares.items():
        for routes, _ in structures:
            assert problem.network.routes[routes[0]].src == root
    # Pipelined over 32 chunks per rank: correct, and near the bound (on 2 nodes
    # NVSwitch ingress, saturated, decides T: the hardest case for pipelining).
    fine = problem_for(problem.network, coll, 256 * MIB, 32)
    cand = realize(pipelined_plan(fine, rates), DEFAULT_MODEL)
    verify(topos.realized_schedule(cand, topo), topo)
    assert cand.estimate_s <= bound * 1.12


def test_cut_search_over_orbits_finds_the_exhaustive_bound(monkeypatch):
    topo = topos.dgx_h100(4)
    coll = standard("allgather", topo.num_ranks)
    fast = bounds.lower_bounds(topo, coll, 256 * MIB)
    import collc.analysis.symmetry as symmetry

    monkeypatch.setattr(symmetry, "generators", lambda t: [])
    bounds._lower_bounds.cache_clear()
    slow = bounds.lower_bounds(topo, coll, 256 * MIB)
    assert fast.cut_s == pytest.approx(slow.cut_s, rel=1e-12)
    assert np.isclose(fast.best_s, slow.best_s)


def test_a_rooted_collective_keeps_every_flow_search():
    topo = topos.dgx_h100(2)
    model = bounds._CutModel(topo, bounds.disjoint_requirements(
        bounds.requirements(standard("broadcast", topo.num_ranks, root=0))), 1.0)
    # The root breaks the symmetry: no GPU may stand for another.
    assert len(model._orbit_representatives()) == topo.num_ranks


def _most_in_peers(schedule) -> int:
    peers: dict[int, set[int]] = {}
    for op in schedule.ops:
        if op.src.rank != op.dst.rank:
            peers.setdefault(op.dst.rank, set()).add(op.src.rank)
    return max(len(p) for p in peers.values())


def test_a_peer_limit_keeps_each_gpu_to_few_peers_at_the_same_rate():
    """max_peers restricts the representatives' trees to node shifts below ceil(sqrt(8)) = 3
    or multiples of it; the replicated schedule then has fewer peers per GPU (the star
    over 8 nodes gives 7 + 6 = 13) and, the rail links all being alike, the same time."""
    from collc.synthesis.core import synthesize
    from collc.synthesis.options import SynthesisOptions

    topo = topos.dgx_h100(8)
    coll = standard("allgather", 64)
    free = synthesize(topo, coll, 1 << 30, SynthesisOptions(progress=False, max_ops=1 << 16))
    few = synthesize(topo, coll, 1 << 30, SynthesisOptions(progress=False, max_ops=1 << 16, max_peers=8))
    assert _most_in_peers(free.schedule) == 13
    assert _most_in_peers(few.schedule) <= 8
    assert few.estimate_s == pytest.approx(free.estimate_s, rel=1e-3)
    verify(few.schedule, topo)  # raises if the schedule is wrong


def test_peer_mask_allows_small_shifts_and_multiples_of_the_root():
    from collc.synthesis.steady.replicated import peer_mask

    net = Network(topos.dgx_h100(16))
    sym = find_symmetry(net)
    src = np.array([r.src for r in net.routes])
    dst = np.array([r.dst for r in net.routes])
    assert peer_mask(sym, 0, src, dst) is None
    ok = peer_mask(sym, 32, src, dst)
    node_shift = int(np.flatnonzero(sym.orders == 16)[0])
    delta = (sym.coords[dst, node_shift] - sym.coords[src, node_shift]) % 16
    # ceil(sqrt(16)) = 4: shifts 0-3 and 4, 8, 12 are allowed; 5-7, 9-11, 13-15 are not.
    assert set(delta[ok].tolist()) == {0, 1, 2, 3, 4, 8, 12}
    assert not ok[np.isin(delta, [5, 6, 7, 9, 10, 11, 13, 14, 15])].any()


def _orbits_by_union_find(link_map: np.ndarray) -> list[int]:
    """The reference: a union-find over every (link, image) pair, each set named by its
    smallest link."""
    parent = list(range(link_map.shape[1]))

    def find(x: int) -> int:
        while parent[x] != x:
            x = parent[x]
        return x

    for row in link_map.tolist():
        for a, b in enumerate(row):
            ra, rb = find(a), find(b)
            parent[max(ra, rb)] = min(ra, rb)
    return [find(x) for x in range(link_map.shape[1])]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40).flatmap(lambda n: st.lists(st.permutations(range(n)), min_size=1, max_size=4)))
def test_link_orbits_are_the_components_of_links_and_their_images(perms):
    link_map = np.array(perms, dtype=np.int64)
    assert link_orbits(link_map).tolist() == _orbits_by_union_find(link_map)


def test_link_orbits_of_a_cluster_join_alike_links_only():
    net = Network(topos.dgx_h100(4))
    sym = find_symmetry(net)
    orbit = link_orbits(sym.link_map)
    assert orbit.tolist() == _orbits_by_union_find(sym.link_map)
    assert 1 < len(set(orbit.tolist())) < len(net.links)
    for l, o in enumerate(orbit.tolist()):
        a, b = net.links[l], net.links[o]
        assert o <= l and (a.bandwidth, a.latency) == (b.bandwidth, b.latency)
