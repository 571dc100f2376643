"""Symmetries of a synthesis network: the automorphisms of its topology (identical nodes
and rails, collc.analysis.symmetry) as permutations of its ranks, links and routes.

The steady-state method exploits them: it solves the rate LP for one source of every
orbit of GPUs and replicates that source's trees to the others
(collc.synthesis.steady.replicated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from collc.analysis.symmetry import generators
from collc.ir.topology import Topology
from collc.synthesis.network import Network


@dataclass(frozen=True)
class Symmetry:
    """Automorphisms of a network's GPUs: for each GPU rank, one that maps its orbit's
    representative to it, as permutations of ranks, links and routes."""

    representative: np.ndarray  # rank -> the representative of its orbit
    rank_map: np.ndarray  # (ranks, ranks): rank_map[s] maps representative[s] to s
    link_map: np.ndarray  # (ranks, links): the same automorphism on links
    routes: "_Routes"
    generators: int
    # rank -> how many times each generator was applied to reach it from its
    # representative (modulo the generator's order): the rank's place in its orbit, so
    # that coords[v] - coords[u] says how far apart two ranks are along each shift.
    coords: np.ndarray | None = None  # (ranks, generators)
    orders: np.ndarray | None = None  # (generators,): each generator's order

    def route_images(self, routes: tuple[int, ...]) -> np.ndarray | None:
        """(ranks, len(routes)): row s holds the images of `routes` under rank s's
        automorphism; None where one image is not a route of the network."""
        return self.routes.images(self.link_map, np.asarray(routes, dtype=np.int64))

    @property
    def representatives(self) -> list[int]:
        return sorted(set(int(r) for r in self.representative))

    def orbit(self, rep: int) -> list[int]:
        return [int(s) for s in np.flatnonzero(self.representative == rep)]


def find_symmetry(network: Network) -> Symmetry | None:
    """The symmetry the topology's names suggest and its links confirm; None when no
    candidate is an automorphism that also maps routes to routes."""
    topo = network.topology
    gens = generators(topo)
    if not gens:
        return None
    node_index = {n.name: i for i, n in enumerate(topo.nodes)}
    gpu_node = np.array([node_index[name] for name in network.gpu_names])
    rank_of_node = np.full(len(topo.nodes), -1)
    rank_of_node[gpu_node] = np.arange(network.ranks)
    # Schreier trees: from every orbit's smallest rank, the generators reach the others.
    n_nodes = len(topo.nodes)
    ident = np.arange(n_nodes)
    perm_of: dict[int, np.ndarray] = {}
    representative = np.full(network.ranks, -1)
    orders = np.array([_order(g) for g in gens], dtype=np.int64)
    coords = np.zeros((network.ranks, len(gens)), dtype=np.int64)
    for start in range(network.ranks):
        if representative[start] >= 0:
            continue
        perm_of[start] = ident
        representative[start] = start
        frontier = [start]
        while frontier:
            nxt = []
            for s in frontier:
                for k, g in enumerate(gens):
                    p = g[perm_of[s]]
                    t = int(rank_of_node[p[gpu_node[start]]])
                    if representative[t] < 0:
                        representative[t] = start
                        perm_of[t] = p
                        coords[t] = coords[s]
                        coords[t, k] = (coords[s, k] + 1) % orders[k]
                        nxt.append(t)
            frontier = nxt
    if len(set(representative.tolist())) == network.ranks:
        return None
    rank_map = np.stack([rank_of_node[perm_of[s][gpu_node]] for s in range(network.ranks)])
    link_map = _link_maps(topo, network, perm_of)
    routes = _Routes(network)
    # Routes must map to routes (the network keeps a few paths per pair, chosen by a
    # rule that names could break): checked here on the first ranks' routes, and again
    # on every tree the steady-state method replicates.
    if routes.images(link_map, np.arange(min(len(network.routes), 4096))) is None:
        return None
    return Symmetry(representative, rank_map, link_map, routes, len(gens), coords, orders)


def _order(perm: np.ndarray) -> int:
    """The order of a permutation: the least common multiple of its cycles' lengths."""
    seen = np.zeros(len(perm), dtype=bool)
    order = 1
    for i in range(len(perm)):
        if seen[i]:
            continue
        length, j = 0, i
        while not seen[j]:
            seen[j] = True
            j = int(perm[j])
            length += 1
        order = order * length // math.gcd(order, length)
    return order


def _link_maps(topo: Topology, network: Network, perm_of: dict[int, np.ndarray]) -> np.ndarray:
    node_index = {n.name: i for i, n in enumerate(topo.nodes)}
    ends = np.array([(node_index[l.src], node_index[l.dst]) for l in network.links], dtype=np.int64)
    n_nodes = len(topo.nodes)
    # A link as the number src x n + dst: a sorted array finds the image's index.
    code = ends[:, 0] * n_nodes + ends[:, 1]
    order = np.argsort(code)
    out = np.empty((network.ranks, len(network.links)), dtype=np.int64)
    for s in range(network.ranks):
        p = perm_of[s]
        img = p[ends[:, 0]] * n_nodes + p[ends[:, 1]]
        out[s] = order[np.searchsorted(code, img, sorter=order)]
    return out


class _Routes:
    """Routes keyed by their links, to find the route a link permutation maps one to."""

    def __init__(self, network: Network):
        self.n_links = len(network.links)
        self.width = max(len(r.links) for r in network.routes)
        padded = np.full((len(network.routes), self.width), self.n_links, dtype=np.int64)
        for r in network.routes:
            padded[r.index, :len(r.links)] = r.links
        self.padded = padded
        code = self.codes(padded)
        self.order = np.argsort(code)
        self.sorted_code = code[self.order]

    def codes(self, links: np.ndarray) -> np.ndarray:
        base = self.n_links + 1
        out = np.zeros(links.shape[:-1], dtype=np.int64)
        for k in range(self.width):
            out = out * base + links[..., k]
        return out

    def images(self, link_map: np.ndarray, routes: np.ndarray) -> np.ndarray | None:
        """For every row of link_map, the routes `routes` map to (None if one is no route)."""
        ext = np.concatenate([link_map, np.full((link_map.shape[0], 1), self.n_links)], axis=1)
        img = self.codes(ext[:, self.padded[routes]])
        pos = np.minimum(np.searchsorted(self.sorted_code, img), len(self.sorted_code) - 1)
        if not np.array_equal(self.sorted_code[pos], img):
            return None
        return self.order[pos]
