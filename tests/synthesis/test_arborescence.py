import networkx as nx
import numpy as np
import pytest

from collc.synthesis.arborescence import NoArborescence, min_arborescence, tree_cost


def _reference(cost, root):
    n = len(cost)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for u in range(n):
        for v in range(n):
            if u != v and v != root and np.isfinite(cost[u, v]):
                g.add_edge(u, v, weight=cost[u, v])
    try:
        t = nx.minimum_spanning_arborescence(g)
    except nx.NetworkXException:
        return None
    return sum(d["weight"] for _, _, d in t.edges(data=True))


@pytest.mark.parametrize("seed", range(40))
def test_matches_networkx_on_random_graphs(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 10))
    cost = rng.integers(1, 30, size=(n, n)).astype(float)
    cost[rng.random((n, n)) < 0.35] = np.inf
    root = int(rng.integers(0, n))
    want = _reference(cost, root)
    if want is None:
        with pytest.raises(NoArborescence):
            min_arborescence(cost, root)
        return
    parent = min_arborescence(cost, root)
    assert parent[root] == -1
    for v in range(n):  # every node leads back to the root without a cycle
        seen, x = set(), v
        while x != root:
            assert x not in seen
            seen.add(x)
            x = int(parent[x])
    assert tree_cost(cost, parent) == pytest.approx(want)
