import pytest

from collc.diagnostics import SolverError
from collc.ir.collective import allgather, alltoall
from collc.synthesis.network import Network, reversed_topology
from collc.synthesis.problem import build_problem, refine
from topos import disconnected, dgx_h100, ndv2, switch, two_chassis


def test_routes_cross_switches_but_never_gpus():
    net = Network(switch(4))
    assert len(net.routes) == 12
    r = net.routes[net.pair_routes[(0, 3)][0]]
    assert r.nodes == ("g0", "sw", "g3")
    assert r.hops == 2 and r.latency == pytest.approx(1e-6)
    # Two chassis: ranks 1 and 2 are not joined by any switch-only path.
    net2 = Network(two_chassis(2))
    assert (1, 2) not in net2.pair_routes and (0, 2) in net2.pair_routes


def test_rail_topology_routes_keep_to_their_rail():
    net = Network(dgx_h100(2))
    same_rail = net.routes[net.pair_routes[(0, 8)][0]]
    assert same_rail.nodes == ("node[0].g[0]", "node[0].hca[0]", "rail[0]", "node[1].hca[0]", "node[1].g[0]")
    assert same_rail.bandwidth == pytest.approx(50e9)  # 400 Gbit/s on the rail
    assert (0, 9) not in net.pair_routes  # another rail: only through a GPU of the node


def test_reversed_topology_turns_every_link():
    topo = ndv2()
    rev = reversed_topology(topo)
    assert ("c[1].g[1]", "c[0].g[0]") in rev.link_map and ("c[0].g[0]", "c[1].g[1]") not in rev.link_map
    assert len(rev.links) == len(topo.links)


def test_unreachable_gpus_fail_before_solving():
    with pytest.raises(SolverError, match=r"g0 \(rank 0\) has no path of links to GPU g2"):
        build_problem(allgather(4), Network(disconnected(4)), 1 << 20)


def test_refinement_splits_slots_and_keeps_name_and_slot_sizes():
    coll = alltoall(4)
    fine = refine(coll, 3)
    assert fine.chunks == 3 and fine.name == coll.name and fine.kind == coll.kind
    p = build_problem(fine, Network(switch(4)), 12 << 20)
    assert p.slot_bytes == pytest.approx((12 << 20) / 12)
    assert sum(len(c.demand) for c in p.commodities) == 4 * 3 * 3
