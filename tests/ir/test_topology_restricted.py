"""Topology.restricted_to: the sub-cluster a group of GPUs runs on (a profiled job's
communicator, a pipeline stage's data-parallel replicas)."""

import pytest

from collc import frontend
from collc.ir.topology import Link, Node, NodeKind, Topology


def _small() -> Topology:
    """g0..g3 on a switch; g0-g1 and g2-g3 also joined directly; a NIC on the switch."""
    gpus = tuple(Node(f"g{i}", NodeKind.GPU, i, sms=80) for i in range(4))
    others = (Node("sw", NodeKind.SWITCH), Node("nic", NodeKind.NIC))
    links = []
    for a, b in (("g0", "sw"), ("g1", "sw"), ("g2", "sw"), ("g3", "sw"), ("sw", "nic"), ("g0", "g1"),
                 ("g2", "g3")):
        links += [Link(a, b, 1e9, 1e-6), Link(b, a, 1e9, 1e-6)]
    # A switch declared between GPUs, as dgx2 does: the order of nodes must not matter.
    return Topology("small", (gpus[0], others[0], gpus[1], gpus[2], gpus[3], others[1]), tuple(links), "test")


def test_keeps_the_chosen_gpus_switches_nics_and_the_links_among_them():
    topo = _small()
    sub = topo.restricted_to((3, 1))
    assert [(g.name, g.rank) for g in sub.gpus] == [("g3", 0), ("g1", 1)]
    assert [n.name for n in sub.nodes] == ["g3", "g1", "sw", "nic"]
    kept = {(l.src, l.dst) for l in sub.links}
    assert kept == {("g1", "sw"), ("sw", "g1"), ("g3", "sw"), ("sw", "g3"), ("sw", "nic"), ("nic", "sw")}
    # Links keep the topology's order and figures.
    assert list(sub.links) == [l for l in topo.links if (l.src, l.dst) in kept]
    assert sub.name == "small[3,1]" and sub.description == "test"
    assert all(g.sms == 80 for g in sub.gpus)


def test_the_link_between_two_chosen_gpus_stays():
    sub = _small().restricted_to((2, 3))
    assert sub.link_map[("g2", "g3")].capacity == 1e9
    assert sub.num_ranks == 2 and sub.gpu(1).name == "g3"


def test_all_gpus_in_order_is_the_topology_itself_unless_renamed():
    topo = frontend.resolve_topology("dgx_h100")
    assert topo.restricted_to(tuple(range(8))) is topo
    renamed = topo.restricted_to(tuple(range(8)), name="whole")
    assert renamed.name == "whole" and renamed.links == topo.links
    reordered = topo.restricted_to((1, 0, 2, 3, 4, 5, 6, 7))
    assert reordered is not topo and reordered.gpu(0).name == topo.gpu(1).name


def test_dgx_h100_pair_keeps_its_switches_and_nics_but_not_the_other_gpus():
    topo = frontend.resolve_topology("dgx_h100")
    sub = topo.restricted_to((4, 6))
    assert [(g.name, g.rank) for g in sub.gpus] == [("node[0].g[4]", 0), ("node[0].g[6]", 1)]
    assert {n.kind for n in sub.nodes} == {NodeKind.GPU, NodeKind.SWITCH, NodeKind.NIC}
    names = {n.name for n in sub.nodes}
    assert all(l.src in names and l.dst in names for l in sub.links)
    assert not any("node[0].g[5]" in (l.src, l.dst) for l in sub.links)
    forwarding = [n for n in topo.nodes if n.kind is not NodeKind.GPU]
    assert sub.nodes[2:] == tuple(forwarding)


def test_a_gpu_named_twice_or_out_of_range_is_refused():
    topo = _small()
    with pytest.raises(ValueError, match="more than once"):
        topo.restricted_to((1, 1))
    with pytest.raises(IndexError):
        topo.restricted_to((0, 9))
