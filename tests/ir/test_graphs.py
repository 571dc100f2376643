"""collc.ir.graphs: the small searches that keep networkx off the compile path answer as
networkx does (networkx is a test dependency here: it is the reference)."""

from __future__ import annotations

import math
import random

import networkx as nx
import pytest

from collc.ir.graphs import connected_components, minimum_cut, mutually_reachable, strongly_connected


def _random_network(rng: random.Random) -> tuple[dict[int, dict[int, float]], nx.DiGraph]:
    n = rng.randint(2, 10)
    capacity: dict[int, dict[int, float]] = {i: {} for i in range(n)}
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for _ in range(rng.randint(0, 3 * n)):
        a, b = rng.sample(range(n), 2)
        # Repeating values (thirds, tenths) make ties and rounding, where cuts could differ.
        c = rng.choice([rng.random(), 0.1, 0.2, 0.3, 1 / 3, 2 / 3, 1.0]) * rng.choice([1.0, 1e9, 1e-6])
        capacity[a][b] = c
        g.add_edge(a, b, capacity=c)
    a, b = rng.sample(range(n), 2)
    if not g.has_edge(a, b) and (a, b) != (0, n - 1):
        capacity[a][b] = math.inf  # no limit, as networkx reads an edge without a capacity
        g.add_edge(a, b)
    return capacity, g


@pytest.mark.parametrize("seed", range(2))
def test_minimum_cut_is_networkx_cut(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(150):
        capacity, g = _random_network(rng)
        sink = len(capacity) - 1
        try:
            expected_value, (expected_side, _) = nx.minimum_cut(g, 0, sink)
        except nx.NetworkXUnbounded:
            continue
        value, side = minimum_cut(capacity, 0, sink)
        assert side == expected_side
        assert value == pytest.approx(expected_value, rel=1e-9, abs=1e-12)


def test_minimum_cut_takes_the_largest_source_side() -> None:
    # Two minimum cuts of value 1: {s} and {s, a}; the source side is every node that
    # cannot reach the sink with room left, so a belongs to it.
    capacity = {"s": {"a": 1.0}, "a": {"t": 5.0}, "t": {}}
    assert minimum_cut(capacity, "s", "t") == (1.0, {"s"})
    capacity = {"s": {"a": 5.0}, "a": {"t": 1.0}, "b": {}, "t": {}}
    assert minimum_cut(capacity, "s", "t") == (1.0, {"s", "a", "b"})


def test_connected_components_in_networkx_order() -> None:
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 9)
        edges = [tuple(rng.sample(range(n), 2)) for _ in range(rng.randint(0, n))] if n > 1 else []
        g = nx.Graph()
        g.add_nodes_from(range(n))
        g.add_edges_from(edges)
        assert connected_components(range(n), edges) == list(nx.connected_components(g))


def test_strong_connectivity_as_networkx() -> None:
    rng = random.Random(3)
    for _ in range(200):
        n = rng.randint(1, 7)
        edges = [tuple(rng.sample(range(n), 2)) for _ in range(rng.randint(0, 2 * n))] if n > 1 else []
        g = nx.DiGraph()
        g.add_nodes_from(range(n))
        g.add_edges_from(edges)
        assert strongly_connected(n, edges) == nx.is_strongly_connected(g)


def test_mutually_reachable_goes_through_other_nodes() -> None:
    edges = [("g0", "sw"), ("sw", "g1"), ("g1", "g0")]
    assert mutually_reachable(["g0", "g1"], ["g0", "g1", "sw"], edges)
    assert not mutually_reachable(["g0", "g1"], ["g0", "g1", "sw"], edges[:2])
