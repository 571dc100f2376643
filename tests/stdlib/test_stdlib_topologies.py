"""The standard library's topologies: sizes, link figures, and the published bounds
they must reproduce."""

from __future__ import annotations

from collections import Counter

import pytest

from collc.frontend import resolve_topology
from collc.ir.topology import NodeKind, Topology

# reference.md section 2 (TE-CCL artifact, teccl/topologies/dgx1.py)
DGX1_MULTIPLICITY = [
    [0, 2, 1, 1, 2, 0, 0, 0], [2, 0, 1, 2, 0, 1, 0, 0], [1, 1, 0, 2, 0, 0, 2, 0], [1, 2, 2, 0, 0, 0, 0, 1],
    [2, 0, 0, 0, 0, 2, 1, 1], [0, 1, 0, 0, 2, 0, 1, 2], [0, 0, 2, 0, 1, 1, 0, 2], [0, 0, 0, 1, 1, 2, 2, 0],
]


def _kinds(topo: Topology) -> Counter:
    return Counter(n.kind for n in topo.nodes)


def _egress(topo: Topology, inside: set[str]) -> float:
    return sum(l.capacity for l in topo.links if l.src in inside and l.dst not in inside)


def test_dgx1():
    topo = resolve_topology("dgx1")
    assert _kinds(topo) == {NodeKind.GPU: 8} and len(topo.links) == 32
    for a in range(8):
        for b in range(8):
            link = topo.link_map.get((f"g[{a}]", f"g[{b}]"))
            assert (link.multiplicity if link else 0) == DGX1_MULTIPLICITY[a][b]
            if link:
                assert (link.bandwidth, link.latency) == (25e9, pytest.approx(0.7e-6))


def test_ndv2_two_chassis_reproduces_the_40_ms_cut_bound():
    topo = resolve_topology("ndv2(chassis=2)")
    assert _kinds(topo) == {NodeKind.GPU: 16} and len(topo.links) == 2 * 32 + 2
    ib = topo.link("c[0].g[0]", "c[1].g[1]")
    assert (ib.bandwidth, ib.latency, ib.multiplicity) == (12.5e9, pytest.approx(1.3e-6), 1)
    assert topo.link("c[1].g[0]", "c[0].g[1]").bandwidth == 12.5e9
    assert topo.link("c[1].g[2]", "c[1].g[3]").capacity == 50e9  # a doubled NVLink
    chassis0 = {n.name for n in topo.nodes if n.name.startswith("c[0].")}
    assert _egress(topo, chassis0) == 12.5e9
    # 1 GB AllGather: each chassis must send its half (0.5 GB) across the cut.
    assert 0.5e9 / _egress(topo, chassis0) == pytest.approx(40e-3)


def test_ndv2_more_chassis_share_an_infiniband_switch():
    topo = resolve_topology("ndv2(chassis=4)")
    assert _kinds(topo) == {NodeKind.GPU: 32, NodeKind.SWITCH: 1}
    for k in range(4):
        inside = {n.name for n in topo.nodes if n.name.startswith(f"c[{k}].")}
        assert _egress(topo, inside) == 12.5e9


def test_dgx2_two_chassis_reproduces_the_ingress_bound():
    topo = resolve_topology("dgx2(chassis=2)")
    assert _kinds(topo) == {NodeKind.GPU: 32, NodeKind.SWITCH: 2} and len(topo.links) == 2 * 32 + 16
    up = topo.link("c[0].g[5]", "c[0].nvswitch")
    assert (up.bandwidth, up.latency) == (125e9, pytest.approx(0.35e-6))
    ib = topo.link("c[1].g[3]", "c[0].g[2]")
    assert (ib.bandwidth, ib.latency) == (12.5e9, pytest.approx(2.6e-6))
    assert ("c[1].g[2]", "c[0].g[3]") not in topo.link_map  # odd GPUs send, even GPUs receive
    # Every GPU receives through its switch port: 31/32 GB at 125 GB/s = 7.75 ms.
    assert (31 / 32) * 1e9 / topo.link("c[0].nvswitch", "c[0].g[0]").capacity == pytest.approx(7.75e-3)


def test_dgx_h100_two_nodes():
    topo = resolve_topology("dgx_h100(nodes=2)")
    assert _kinds(topo) == {NodeKind.GPU: 16, NodeKind.SWITCH: 2 + 8, NodeKind.NIC: 16}
    assert len(topo.links) == 96
    assert topo.link("node[1].g[3]", "node[1].nvswitch").bandwidth == 450e9
    assert topo.link("node[0].g[2]", "node[0].hca[2]").bandwidth == 64e9
    rail = topo.link("node[1].hca[5]", "rail[5]")
    assert rail.bandwidth == 50e9 and rail.latency == pytest.approx(1e-6)
    assert {l.dst for l in topo.out_links["rail[5]"]} == {"node[0].hca[5]", "node[1].hca[5]"}


def test_ring_topology():
    topo = resolve_topology("ring(8)")
    assert _kinds(topo) == {NodeKind.GPU: 8} and len(topo.links) == 16
    assert all(l.bandwidth == 25e9 and l.multiplicity == 1 for l in topo.links)
    assert topo.link("g[7]", "g[0]").latency == pytest.approx(0.7e-6)


def test_mi250():
    one = resolve_topology("mi250")
    assert _kinds(one) == {NodeKind.GPU: 16} and len(one.links) == 56
    assert one.link("c[0].g[0]", "c[0].g[1]").multiplicity == 4
    assert one.link("c[0].g[0]", "c[0].g[4]").multiplicity == 2
    assert sum(l.capacity for l in one.out_links["c[0].g[0]"]) == 7 * 50e9
    two = resolve_topology("mi250(chassis=2)")
    assert _kinds(two) == {NodeKind.GPU: 32, NodeKind.SWITCH: 17} and len(two.links) == 208
    assert two.link("c[1].g[3]", "pair[9]").bandwidth == 25e9
    assert two.link("pair[9]", "spine").bandwidth == 25e9


@pytest.mark.parametrize("spec, gpus, degree", [("torus2d(x=4, y=4)", 16, 4), ("torus2d(x=3, y=5)", 15, 4),
                                                ("hypercube(d=4)", 16, 4), ("switch(n=5)", 5, 1)])
def test_regular_topologies(spec, gpus, degree):
    topo = resolve_topology(spec)
    assert topo.num_ranks == gpus
    assert all(len(topo.out_links[g.name]) == degree for g in topo.gpus)
