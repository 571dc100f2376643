"""Unicast demands on identical nodes: the flow LP solved once per orbit of source and
destination pairs and replicated, its shortest-path pricing, and the staggered order
that keeps a destination from being sent to by every source at once."""

from __future__ import annotations

import math

import numpy as np
import pytest
import topos

from collc.analysis import bounds
from collc.ir.collective import standard
from collc.synthesis.auto import synthesize_copies
from collc.synthesis.candidates import problem_for, realize
from collc.synthesis.network import Network
from collc.synthesis.options import SynthesisOptions
from collc.synthesis.plan import Status
from collc.synthesis.problem import build_problem
from collc.synthesis.progress import Progress
from collc.synthesis.solver import Deadline, SolverOptions
from collc.synthesis.steady.flows import flow_rates
from collc.synthesis.steady.pipelining import _unicast_phase, pipelined_plan
from collc.synthesis.steady.rates import _replicated_rates
from collc.synthesis.steady.replicated_flow import pair_orbits, shortest_paths
from collc.synthesis.steady.solution import class_bytes
from collc.synthesis.symmetry import find_symmetry
from collc.synthesis.timing import DEFAULT_MODEL
from collc.verify import verify

MIB = 1 << 20


def test_replicated_rates_matches_the_whole_flow_lp_and_the_bound():
    topo = topos.dgx_h100(2)
    coll = standard("alltoall", topo.num_ranks)
    problem = build_problem(coll, Network(topo), 256 * MIB)
    rates = _replicated_rates(problem, SolverOptions(), Deadline(60), Progress(False), 0.97)
    # One orbit of ranks: the 15 pairs of rank 0 stand for all 240.
    assert rates is not None and rates.replicated == 15 and rates.status is Status.OPTIMAL
    whole = flow_rates(problem, SolverOptions(), Deadline(60), Progress(False))
    assert rates.seconds == pytest.approx(whole.seconds, rel=1e-6)
    bound = bounds.lower_bounds(topo, coll, 256 * MIB).best_s
    assert rates.seconds == pytest.approx(bound, rel=1e-6)
    # Every pair has paths from its source to its destination, whose shares add up to 1.
    assert len(rates.shares) == topo.num_ranks * (topo.num_ranks - 1)
    routes = problem.network.routes
    for (s, (d,)), paths in rates.shares.items():
        assert sum(share for _, share in paths) == pytest.approx(1.0)
        for path, _ in paths:
            assert routes[path[0]].src == s and routes[path[-1]].dst == d
            assert all(routes[a].dst == routes[b].src for a, b in zip(path, path[1:]))


def test_the_replicated_schedule_verifies_near_the_bound_at_one_chunk_per_pair():
    topo = topos.dgx_h100(4)
    coll = standard("alltoall", topo.num_ranks)
    problem = problem_for(Network(topo), coll, 1 << 30, 1)
    rates = _replicated_rates(problem, SolverOptions(), Deadline(60), Progress(False), 0.97)
    cand = realize(pipelined_plan(problem, rates), DEFAULT_MODEL)
    verify(topos.realized_schedule(cand, topo), topo)
    bound = bounds.lower_bounds(topo, coll, 1 << 30).best_s
    assert cand.estimate_s <= bound * 1.01


def test_a_peer_limit_is_kept_by_the_replicated_paths():
    topo = topos.dgx_h100(32)
    net = Network(topo)
    coll = standard("alltoall", topo.num_ranks)
    problem = build_problem(coll, net, 1 << 30)
    rates = _replicated_rates(problem, SolverOptions(max_peers=32), Deadline(120), Progress(False), 0.97)
    peers: dict[int, set[int]] = {}
    for paths in rates.shares.values():
        for path, _ in paths:
            for ri in path:
                peers.setdefault(net.routes[ri].src, set()).add(net.routes[ri].dst)
    # 7 GPUs of its node, and on its rail the nodes 1 to 25 ahead; the 6 further ahead
    # are two rail hops away.
    assert {len(p) for p in peers.values()} == {7 + 25}
    # Without the limit, each GPU reaches every other node on its rail directly.
    free = _replicated_rates(problem, SolverOptions(), Deadline(120), Progress(False), 0.97)
    direct: set[int] = set()
    for paths in free.shares.values():
        for path, _ in paths:
            if net.routes[path[0]].src == 0:
                direct.add(net.routes[path[0]].dst)
    assert len(direct) == 7 + 31
    # Crossing the rails twice costs rate: 25 + 2 x 6 rail hops per GPU's row of nodes
    # where 31 would do.
    assert rates.seconds == pytest.approx(free.seconds * 37 / 31, rel=2e-3)


def test_an_asymmetric_demand_keeps_the_whole_flow_lp():
    topo = topos.dgx_h100(4)
    net = Network(topo)
    problem = build_problem(standard("gather", topo.num_ranks, 1, 3), net, 1 << 30)
    sym = find_symmetry(net)
    # (s, 3) maps back to (0, d') with d' depending on s: those pairs are not classes.
    assert pair_orbits(class_bytes(problem), sym, net.ranks) is None
    assert _replicated_rates(problem, SolverOptions(), Deadline(60), Progress(False), 0.97) is None


def test_shortest_paths_relay_where_two_routes_are_cheaper_than_one():
    inf = math.inf
    # Routes (as matrix entries): 0->1 costs 1, 1->2 costs 1, 0->2 costs 5; 2->0 only.
    cost = np.array([[inf, 1.0, 5.0], [inf, inf, 1.0], [1.0, inf, inf]])
    best = np.array([[-1, 10, 11], [-1, -1, 12], [13, -1, -1]])
    paths = shortest_paths(cost, best, 0)
    assert paths == {1: (10,), 2: (10, 12)}
    assert shortest_paths(cost, best, 1) == {2: (12,), 0: (12, 13)}


def test_each_round_of_the_staggered_order_is_a_permutation():
    n = 12
    due: dict[float, list[tuple[int, int]]] = {}
    for s in range(n):
        for d in range(n):
            if s != d:
                due.setdefault(_unicast_phase((s, (d,)), n), []).append((s, d))
    assert len(due) == n - 1
    for pairs in due.values():
        assert sorted(s for s, _ in pairs) == list(range(n))
        assert sorted(d for _, d in pairs) == list(range(n))
    assert _unicast_phase((0, (1,)), n) == pytest.approx(1 / (n - 1))
    assert _unicast_phase((5, (4,)), n) == 1.0


def _alltoall_peers(nodes: int, max_peers: int, peer_limit: int | None):
    """The flow's most peers per GPU and time over the bound. Synthesized by the copy
    methods themselves (collc.synthesis.auto): where the runtime's limit binds on these
    nodes, the entry point sends an AllToAll over the rails instead
    (tests/synthesis/test_rail_alltoall.py), and the flow is what remains elsewhere."""
    from collc import frontend

    topo = frontend.resolve_topology(f"dgx_h100(nodes={nodes})", None)
    coll = frontend.resolve_collective("alltoall", topo.num_ranks, None)
    options = SynthesisOptions(progress=False, max_peers=max_peers, peer_limit=peer_limit or 0)
    result = synthesize_copies(Network(topo), coll, 1 << 30, options, Deadline(600), Progress(False))
    verify(result.schedule, topo)
    peers: dict[int, set[int]] = {}
    for op in result.schedule.ops:
        if op.src.rank != op.dst.rank:
            peers.setdefault(op.src.rank, set()).add(op.dst.rank)
    ratio = result.estimate_s / bounds.lower_bounds(topo, coll, 1 << 30).best_s
    return max(len(p) for p in peers.values()), ratio


def test_a_peer_budget_keeps_the_nearest_nodes_direct_and_relays_the_rest():
    # 64 GPUs: 7 node peers and 7 rail peers. 12 peers allow node offsets 1..5 directly;
    # offsets 6 and 7 cross the rails twice: 8 x (5 + 2 x 2) = 72 rail hops per GPU
    # where 56 would do, so the rate is 72 / 56 of the bound.
    most, ratio = _alltoall_peers(8, 12, None)
    assert most == 12
    assert ratio == pytest.approx(72 / 56, rel=2e-3)


def test_past_a_runtime_limit_a_flow_keeps_four_fifths_of_it():
    # max_peers=4 where a GPU would have 14 > 12 peers: a flow takes 9 (four fifths
    # of 12), not 4: node offsets 1 and 2 directly, the others over 2 to 4 rail hops.
    most, ratio = _alltoall_peers(8, 4, 12)
    assert most == 9
    assert ratio == pytest.approx(8 * (1 + 1 + 2 + 2 + 3 + 3 + 4) / 56, rel=2e-3)
    # Within the limit, no restriction.
    most, ratio = _alltoall_peers(8, 4, 14)
    assert most == 14 and ratio == pytest.approx(1.0, abs=2e-3)
