"""The `ring` builtin: a Hamiltonian cycle over fast hops, as NCCL searches rings."""

from __future__ import annotations
import pytest
from hypothesis import given, settings, strategies as st

from collc.frontend import find_ring, resolve_topology
from collc.frontend.rings import gpu_neighbours, ring_speed
from collc.ir.topology import Link, Node, NodeKind, Topology


def _hops(ring):
    return list(zip(ring, ring[1:] + ring[:1]))


def _is_cycle(ring, n):
    return sorted(ring) == list(range(n))


def test_dgx1_ring_uses_only_doubled_nvlinks():
    topo = resolve_topology("dgx1")
    ring = find_ring(topo)
    assert _is_cycle(ring, 8) and ring[0] == 0
    for a, b in _hops(ring):
        assert topo.link(f"g[{a}]", f"g[{b}]").multiplicity == 2
    assert ring_speed(topo, ring) == 50e9


def test_ndv2_ring_crosses_chassis_only_over_the_infiniband_links():
    topo = resolve_topology("ndv2(chassis=2)")
    ring = find_ring(topo)
    assert _is_cycle(ring, 16)
    crossings = [(a, b) for a, b in _hops(ring) if a // 8 != b // 8]
    assert sorted(crossings) == [(0, 9), (8, 1)]
    inside = [(a, b) for a, b in _hops(ring) if a // 8 == b // 8]
    assert all(topo.link(topo.gpu(a).name, topo.gpu(b).name).multiplicity == 2 for a, b in inside)


def test_paths_through_switches_and_nics_count_as_hops():
    topo = resolve_topology("dgx_h100(nodes=2)")
    neighbours = gpu_neighbours(topo)
    assert neighbours[0][1] == 450e9  # over the NVSwitch
    assert neighbours[0][8] == 50e9  # NIC, rail switch, NIC: 400 Gbit/s
    assert 9 not in neighbours[0]  # another rail: only through a GPU
    ring = find_ring(topo)
    assert _is_cycle(ring, 16) and ring_speed(topo, ring) == 50e9


def test_large_multi_node_rings_are_found():
    for spec, speed in [("ndv2(chassis=4)", 12.5e9), ("dgx2(chassis=2)", 12.5e9), ("mi250(chassis=2)", 25e9),
                        ("dgx_h100(nodes=4)", 50e9)]:
        topo = resolve_topology(spec)
        ring = find_ring(topo)
        assert _is_cycle(ring, topo.num_ranks)
        assert ring_speed(topo, ring) == speed, spec


def _line(n: int) -> Topology:
    nodes = tuple(Node(f"g{i}", NodeKind.GPU, i) for i in range(n))
    links = []
    for i in range(n - 1):
        links += [Link(f"g{i}", f"g{i + 1}", 1e9, 0.0), Link(f"g{i + 1}", f"g{i}", 1e9, 0.0)]
    return Topology(f"line{n}", nodes, tuple(links))


def test_falls_back_to_rank_order_without_a_hamiltonian_cycle():
    assert find_ring(_line(4)) == (0, 1, 2, 3)


def test_ring_is_deterministic():
    a = find_ring(resolve_topology("torus2d(x=4, y=4)"))
    find_ring.cache_clear()
    b = find_ring(resolve_topology("torus2d(x=4, y=4)"))
    assert a == b and _is_cycle(a, 16)


@pytest.mark.parametrize("spec,root", [("dgx1", 0), ("dgx1", 5), ("ring(8)", 3), ("ndv2(chassis=2)", 0),
                                       ("dgx_h100(nodes=2)", 9), ("torus2d(x=3, y=3)", 4)])
def test_tree_edges_are_paths_and_parents_come_first(spec, root):
    from collc.frontend import resolve_topology
    from collc.frontend.rings import find_tree, gpu_neighbours

    topo = resolve_topology(spec)
    order, parent = find_tree(topo, root)
    assert sorted(order) == list(range(topo.num_ranks)) and order[0] == root and parent[root] == -1
    seen = {root}
    neighbours = gpu_neighbours(topo)
    for r in order[1:]:
        assert parent[r] in seen, "a parent joins the tree before its children"
        assert r in neighbours[parent[r]], "every tree edge is a link or a path through switches"
        seen.add(r)
    fanout = max(sum(1 for p in parent if p == r) for r in range(topo.num_ranks))
    assert fanout <= 3


def test_tree_on_a_ring_is_shallow():
    from collc.frontend import resolve_topology
    from collc.frontend.rings import find_tree

    order, parent = find_tree(resolve_topology("ring(8)"), 0)

    def depth(r):
        return 0 if parent[r] == -1 else 1 + depth(parent[r])

    assert max(depth(r) for r in range(8)) == 4  # both directions around the ring


@pytest.mark.parametrize("spec", ["dgx1", "ndv2(chassis=2)", "dgx2(chassis=2)", "dgx_h100(nodes=2)",
                                  "torus2d(x=4, y=4)", "hypercube(d=4)", "mi250(chassis=2)", "ring(9)"])
def test_the_greedy_first_path_is_what_the_search_returns(spec, monkeypatch):
    """`_greedy_cycle` (no backtracking) is only a shortcut: with it switched off, the
    full search finds the same ring on every stdlib topology."""
    from collc.frontend import rings

    topo = resolve_topology(spec)
    rings.find_ring.cache_clear()
    fast = rings.find_ring(topo)
    monkeypatch.setattr(rings, "_greedy_cycle", lambda out_adj: None)
    rings.find_ring.cache_clear()
    assert rings.find_ring(topo) == fast
    rings.find_ring.cache_clear()


def test_the_greedy_path_gives_up_where_it_cannot_close():
    from collc.frontend.rings import _greedy_cycle

    # 0 -> 1 -> 2 -> 3 with no way back to 0: the search must backtrack (or fail).
    assert _greedy_cycle({0: [1], 1: [2], 2: [3], 3: [2]}) is None
    # 0 -> 2 first reaches a dead end (2 -> 0 only); the cycle is 0, 1, 2.
    assert _greedy_cycle({0: [2, 1], 1: [2], 2: [0]}) is None
    assert _greedy_cycle({0: [1, 2], 1: [2], 2: [0]}) == [0, 1, 2]


def _reference_search(out_adj, n):
    """The ring search as it was written with sets (before bit masks): the same cycle,
    or None, on any graph."""
    from collc.frontend.rings import SEARCH_BUDGET, _greedy_cycle

    greedy = _greedy_cycle(out_adj)
    if greedy is not None:
        return greedy
    in_adj = {v: set() for v in out_adj}
    for a, bs in out_adj.items():
        for b in bs:
            in_adj[b].add(a)
    out_sets = {a: set(bs) for a, bs in out_adj.items()}

    def viable(current, start, remaining):
        if not remaining:
            return True
        if in_adj[start].isdisjoint(remaining) or out_sets[current].isdisjoint(remaining):
            return False
        enter, leave = remaining | {current}, remaining | {start}
        if any(in_adj[u].isdisjoint(enter) or out_sets[u].isdisjoint(leave) for u in remaining):
            return False
        seen, frontier = {current}, [current]
        while frontier:
            frontier = [w for v in frontier for w in out_sets[v] if w in remaining and not (w in seen or seen.add(w))]
        return len(seen) == len(remaining) + 1

    path, remaining, stack, budget = [0], set(out_adj) - {0}, [iter(out_adj[0])], SEARCH_BUDGET
    while stack:
        advanced = False
        for nxt in stack[-1]:
            if nxt not in remaining:
                continue
            budget -= 1
            if budget < 0:
                return None
            remaining.discard(nxt)
            if viable(nxt, 0, remaining):
                path.append(nxt)
                if not remaining:
                    if 0 in out_sets[nxt]:
                        return path
                    path.pop()
                    remaining.add(nxt)
                    continue
                stack.append(iter(out_adj[nxt]))
                advanced = True
                break
            remaining.add(nxt)
        if not advanced:
            stack.pop()
            if len(path) > 1:
                remaining.add(path.pop())
    return None


@given(st.integers(3, 11).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=4 * n))))
@settings(max_examples=300, deadline=None)
def test_the_search_on_bit_masks_finds_the_cycle_the_set_search_finds(graph):
    """The search keeps its sets of GPUs as bit masks (fast at 1,024 GPUs); on random
    directed graphs it returns what the same search over sets returns, cycle or None."""
    from collc.frontend.rings import _hamiltonian_cycle

    n, edges = graph
    out_adj = {v: sorted({b for a, b in edges if a == v and b != v}) for v in range(n)}
    assert _hamiltonian_cycle(out_adj, n) == _reference_search(out_adj, n)


def test_the_ring_of_1024_h100s_keeps_to_nvlink_inside_each_node():
    """dgx_h100(nodes=128): the greedy path cannot close, so the search runs (about 1,000
    viability checks of 1,024 GPUs); it gives the ring through each node's eight GPUs
    over NVLink and between nodes along a rail."""
    topo = resolve_topology("dgx_h100(nodes=128)")
    ring = find_ring(topo)
    assert _is_cycle(ring, 1024) and ring_speed(topo, ring) == 50e9
    assert ring[:10] == (0, 1, 2, 3, 4, 5, 6, 7, 15, 8)
    crossings = [(a, b) for a, b in _hops(ring) if a // 8 != b // 8]
    assert len(crossings) == 128 and all(a % 8 == b % 8 for a, b in crossings)
