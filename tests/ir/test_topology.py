"""`Topology.direct_reach`: which GPUs a transfer without a relaying GPU can join, kept
on the topology object (and freed with it)."""

import gc
import weakref

from collc.ir import Link, Node, NodeKind, Topology
from collc.verify import verify
from schedules import ring_allgather, ring_topology


def _two_islands() -> Topology:
    """g0 - s0 - g1 - g2: g1 joins g2 directly, and g0 reaches g1 through a switch, but
    g0 reaches g2 only through GPU g1 (which would have to store and forward)."""
    nodes = (Node("g0", NodeKind.GPU, 0), Node("g1", NodeKind.GPU, 1), Node("g2", NodeKind.GPU, 2),
             Node("s0", NodeKind.SWITCH))
    pairs = [("g0", "s0"), ("s0", "g0"), ("s0", "g1"), ("g1", "s0"), ("g1", "g2"), ("g2", "g1")]
    return Topology("islands", nodes, tuple(Link(a, b, 1e9, 1e-6) for a, b in pairs))


def test_direct_reach_stops_at_gpus_and_passes_switches():
    reach = _two_islands().direct_reach
    assert reach == {0: frozenset({1}), 1: frozenset({0, 2}), 2: frozenset({1})}


def test_direct_reach_is_computed_once_and_dies_with_its_topology():
    topo, sched = ring_topology(4), ring_allgather(4)  # not the front end's: it keeps what it resolved
    verify(sched, topo)
    assert "direct_reach" in vars(topo)  # the verifier asked for it
    assert topo.direct_reach is topo.direct_reach  # cached on the object
    gone = weakref.ref(topo)
    del topo, sched
    gc.collect()
    assert gone() is None  # no cache elsewhere keeps it alive
