"""The GPU-level view of a topology that every synthesis method works on.

Only GPUs hold data, so a transfer always runs from one GPU to another; between them it
may cross switches and NICs, which forward without storing or copying. A `Route` is one
such path (a direct link, or GPU -> switch ... -> GPU). Methods pick routes; capacity is
charged to every physical link a route crosses, so two transfers through one switch port
share it, and a switch never multiplies data (one transfer per destination).

Time of one transfer follows the alpha-beta model of the simulator: the route's summed
link latencies plus bytes over its bottleneck capacity.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from collc.ir.graphs import strongly_connected
from collc.ir.topology import Link, NodeKind, Topology

if TYPE_CHECKING:
    import networkx as nx

# Several equally short paths may join two GPUs through a switched fabric; keeping a few
# gives the solvers a choice without letting a fat tree multiply the model.
MAX_ROUTES_PER_PAIR = 4


@dataclass(frozen=True)
class Route:
    index: int
    src: int  # rank of the sending GPU
    dst: int  # rank of the receiving GPU
    nodes: tuple[str, ...]  # from the sending GPU to the receiving GPU, both included
    links: tuple[int, ...]  # indices into Network.links, in path order
    latency: float  # seconds: the sum over the path
    bandwidth: float  # bytes/s: the narrowest link's capacity

    def seconds(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth

    @property
    def hops(self) -> int:
        return len(self.links)


class Network:
    """Routes between GPUs of a topology, with the physical links each one uses."""

    def __init__(self, topology: Topology, max_routes_per_pair: int = MAX_ROUTES_PER_PAIR):
        self.topology = topology
        self.links: tuple[Link, ...] = topology.links
        self.link_index = {(l.src, l.dst): i for i, l in enumerate(self.links)}
        self.ranks = topology.num_ranks
        self.gpu_names = tuple(g.name for g in topology.gpus)
        self.rank_of = {name: r for r, name in enumerate(self.gpu_names)}
        routes: list[Route] = []
        for u in range(self.ranks):
            for path in self._paths_from(self.gpu_names[u], max_routes_per_pair):
                routes.append(self._route(len(routes), path))
        self.routes: tuple[Route, ...] = tuple(routes)

    # --- construction ----------------------------------------------------------
    def _paths_from(self, start: str, limit: int) -> list[tuple[str, ...]]:
        """Fewest-hop paths from a GPU to every other GPU whose inner nodes hold no data."""
        topo = self.topology
        dist = {start: 0}
        preds: dict[str, list[str]] = {}
        frontier = [start]
        reached_gpus: list[str] = []
        while frontier:
            nxt: list[str] = []
            for a in frontier:
                for link in topo.out_links[a]:
                    b = link.dst
                    if b == start:
                        continue
                    if b not in dist:
                        dist[b] = dist[a] + 1
                        preds[b] = [a]
                        if topo.node(b).kind is NodeKind.GPU:
                            reached_gpus.append(b)
                        else:
                            nxt.append(b)
                    elif dist[b] == dist[a] + 1:
                        preds[b].append(a)
            frontier = nxt
        paths: list[tuple[str, ...]] = []
        for g in sorted(reached_gpus, key=lambda n: self.rank_of[n]):
            found = self._unwind(start, g, preds, limit * 4)
            found.sort(key=lambda p: (-self._bottleneck(p), self._latency(p), p))
            paths.extend(found[:limit])
        return paths

    def _unwind(self, start: str, end: str, preds: dict[str, list[str]], cap: int) -> list[tuple[str, ...]]:
        out: list[tuple[str, ...]] = []
        stack: list[tuple[str, tuple[str, ...]]] = [(end, (end,))]
        while stack and len(out) < cap:
            node, suffix = stack.pop()
            if node == start:
                out.append(suffix)
                continue
            for p in sorted(preds[node], reverse=True):
                stack.append((p, (p,) + suffix))
        return out

    def _bottleneck(self, path: tuple[str, ...]) -> float:
        return min(self.links[self.link_index[(a, b)]].capacity for a, b in zip(path, path[1:]))

    def _latency(self, path: tuple[str, ...]) -> float:
        return sum(self.links[self.link_index[(a, b)]].latency for a, b in zip(path, path[1:]))

    def _route(self, index: int, path: tuple[str, ...]) -> Route:
        links = tuple(self.link_index[(a, b)] for a, b in zip(path, path[1:]))
        return Route(index, self.rank_of[path[0]], self.rank_of[path[-1]], path, links,
                     self._latency(path), self._bottleneck(path))

    # --- queries ---------------------------------------------------------------
    @cached_property
    def out_routes(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in range(self.ranks)]
        for r in self.routes:
            out[r.src].append(r.index)
        return tuple(tuple(x) for x in out)

    @cached_property
    def in_routes(self) -> tuple[tuple[int, ...], ...]:
        inc: list[list[int]] = [[] for _ in range(self.ranks)]
        for r in self.routes:
            inc[r.dst].append(r.index)
        return tuple(tuple(x) for x in inc)

    @cached_property
    def pair_routes(self) -> dict[tuple[int, int], tuple[int, ...]]:
        pairs: dict[tuple[int, int], list[int]] = {}
        for r in self.routes:
            pairs.setdefault((r.src, r.dst), []).append(r.index)
        return {k: tuple(v) for k, v in pairs.items()}

    @cached_property
    def link_routes(self) -> tuple[tuple[int, ...], ...]:
        """For every physical link, the routes that cross it."""
        by_link: list[list[int]] = [[] for _ in self.links]
        for r in self.routes:
            for l in r.links:
                by_link[l].append(r.index)
        return tuple(tuple(x) for x in by_link)

    @cached_property
    def used_links(self) -> tuple[int, ...]:
        return tuple(i for i, rs in enumerate(self.link_routes) if rs)

    def rank_graph(self) -> "nx.DiGraph":
        import networkx as nx  # heavy (0.15-0.25 s to import): only the searches below need it

        g = nx.DiGraph()
        g.add_nodes_from(range(self.ranks))
        g.add_edges_from((r.src, r.dst) for r in self.routes)
        return g

    def hop_seconds(self, nbytes: float) -> dict[tuple[int, int], float]:
        """Fastest single transfer time between every directly routed pair."""
        out: dict[tuple[int, int], float] = {}
        for r in self.routes:
            t = r.seconds(nbytes)
            key = (r.src, r.dst)
            if t < out.get(key, float("inf")):
                out[key] = t
        return out

    def shortest_seconds(self, nbytes: float) -> list[list[float]]:
        """All-pairs fastest store-and-forward time of one chunk (relaying through GPUs)."""
        import networkx as nx  # heavy (0.15-0.25 s to import): loaded only where it is used

        g = nx.DiGraph()
        g.add_nodes_from(range(self.ranks))
        for (a, b), t in self.hop_seconds(nbytes).items():
            g.add_edge(a, b, weight=t)
        inf = float("inf")
        dist = [[inf] * self.ranks for _ in range(self.ranks)]
        for a, row in nx.all_pairs_dijkstra_path_length(g, weight="weight"):
            for b, t in row.items():
                dist[a][b] = t
        return dist

    @cached_property
    def _components(self) -> tuple[dict[int, int], "nx.DiGraph"]:
        """Each rank's strongly connected component, and the graph of components (a DAG):
        a rank reaches another in its own component or in a component below its own."""
        import networkx as nx  # heavy (0.15-0.25 s to import): only a partly connected network needs it

        cond = nx.condensation(self.rank_graph())
        return cond.graph["mapping"], cond

    @property
    def strongly_connected(self) -> bool:
        """Whether every GPU can reach every other."""
        return strongly_connected(self.ranks, ((r.src, r.dst) for r in self.routes))

    def unreachable(self, pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        import networkx as nx  # heavy (0.15-0.25 s to import): only a partly connected network gets here

        mapping, cond = self._components
        below: dict[int, set[int]] = {}
        out = []
        for a, b in pairs:
            ca, cb = mapping[a], mapping[b]
            if ca == cb:
                continue
            if ca not in below:
                below[ca] = nx.descendants(cond, ca)
            if cb not in below[ca]:
                out.append((a, b))
        return out


def reversed_topology(topology: Topology) -> Topology:
    """Every link turned around: a schedule on it, run backwards in time, fits the original."""
    links = tuple(Link(l.dst, l.src, l.bandwidth, l.latency, l.multiplicity) for l in topology.links)
    return Topology(topology.name, topology.nodes, links, topology.description)
