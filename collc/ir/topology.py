"""The topology IR: nodes (GPUs, switches, NICs) joined by directed links.

Units are SI throughout: bandwidth in bytes per second, latency in seconds.
A two-way link in the language becomes two directed `Link`s here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any, Sequence


class NodeKind(str, Enum):
    """What a node is. Only GPUs hold buffers; switches and NICs forward."""

    GPU = "gpu"
    SWITCH = "switch"
    NIC = "nic"


@dataclass(frozen=True)
class Node:
    name: str
    kind: NodeKind
    # The collective rank of a GPU (its position in declaration order); None otherwise.
    rank: int | None = None
    # A GPU's streaming multiprocessors (AMD: compute units), when the topology says:
    # how many threadblocks can be resident at once (see backends/msccl_xml/limits.py).
    sms: int | None = None

    @property
    def holds_data(self) -> bool:
        return self.kind is NodeKind.GPU


@dataclass(frozen=True)
class Link:
    """A directed link. `bandwidth` is per lane; `multiplicity` lanes run in parallel."""

    src: str
    dst: str
    bandwidth: float  # bytes per second, one lane
    latency: float  # seconds
    multiplicity: int = 1

    @property
    def capacity(self) -> float:
        """Bytes per second over all lanes."""
        return self.bandwidth * self.multiplicity


@dataclass(frozen=True)
class Topology:
    name: str
    nodes: tuple[Node, ...]
    links: tuple[Link, ...]
    # Free-form provenance (where the figures come from); not used by passes.
    description: str = ""
    _index: dict[str, Node] = field(default=None, init=False, repr=False, compare=False, hash=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {n.name: n for n in self.nodes})

    # --- lookups -----------------------------------------------------------------
    def node(self, name: str) -> Node:
        return self._index[name]

    def has_node(self, name: str) -> bool:
        return name in self._index

    @cached_property
    def gpus(self) -> tuple[Node, ...]:
        """GPU nodes ordered by rank."""
        return tuple(sorted((n for n in self.nodes if n.kind is NodeKind.GPU), key=lambda n: n.rank))

    @property
    def num_ranks(self) -> int:
        return len(self.gpus)

    def gpu(self, rank: int) -> Node:
        return self.gpus[rank]

    @cached_property
    def out_links(self) -> dict[str, tuple[Link, ...]]:
        out: dict[str, list[Link]] = {n.name: [] for n in self.nodes}
        for link in self.links:
            out[link.src].append(link)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def in_links(self) -> dict[str, tuple[Link, ...]]:
        inc: dict[str, list[Link]] = {n.name: [] for n in self.nodes}
        for link in self.links:
            inc[link.dst].append(link)
        return {k: tuple(v) for k, v in inc.items()}

    @cached_property
    def link_map(self) -> dict[tuple[str, str], Link]:
        """(src, dst) -> link. Parallel links between one pair are merged by the front end."""
        return {(l.src, l.dst): l for l in self.links}

    def link(self, src: str, dst: str) -> Link:
        return self.link_map[(src, dst)]

    # --- restriction ---------------------------------------------------------------
    def restricted_to(self, gpus: Sequence[int], name: str | None = None) -> "Topology":
        """The sub-cluster of the GPUs of ranks `gpus`: those GPUs (the i-th given becomes
        rank i, keeping its name and SM count), every switch and NIC, and the links among
        them. The other GPUs go with their links: GPUs do not forward data in collc's
        model, so a group of GPUs (a communicator, a stage's replicas) runs on this
        alone. Node order: the chosen GPUs in their new rank order, then the switches and
        NICs in this topology's order; links keep this topology's order.

        Named `name`, by default `NAME[r0,r1,...]` with the ranks given; all the GPUs in
        rank order under this topology's own name give this topology itself."""
        chosen = [self.gpu(g) for g in gpus]
        if len({n.name for n in chosen}) != len(chosen):
            raise ValueError(f"restricted_to: GPU ranks {tuple(gpus)} name a GPU more than once")
        if tuple(gpus) == tuple(range(self.num_ranks)) and name in (None, self.name):
            return self
        forwarding = tuple(n for n in self.nodes if n.kind is not NodeKind.GPU)
        nodes = tuple(Node(n.name, NodeKind.GPU, i, n.sms) for i, n in enumerate(chosen)) + forwarding
        keep = {n.name for n in nodes}
        links = tuple(l for l in self.links if l.src in keep and l.dst in keep)
        shown = name if name is not None else f"{self.name}[{','.join(map(str, gpus))}]"
        return Topology(shown, nodes, links, self.description)

    @cached_property
    def direct_reach(self) -> dict[int, frozenset[int]]:
        """rank -> ranks reachable by a path whose inner nodes are switches or NICs (a GPU
        on the way would have to store and forward, which takes ops of its own). Cached
        on the topology, and gone with it: the verifier asks once per schedule."""
        reach: dict[int, frozenset[int]] = {}
        for gpu in self.gpus:
            seen, stack, found = {gpu.name}, [gpu.name], set()
            while stack:
                for link in self.out_links[stack.pop()]:
                    if link.dst in seen:
                        continue
                    seen.add(link.dst)
                    node = self.node(link.dst)
                    if node.kind is NodeKind.GPU:
                        found.add(node.rank)
                    else:
                        stack.append(link.dst)
            reach[gpu.rank] = frozenset(found)
        return reach

    def to_networkx(self):  # -> networkx.DiGraph
        """A DiGraph with `capacity` (bytes/s) and `latency` (s) on every edge."""
        import networkx as nx

        g = nx.DiGraph()
        for n in self.nodes:
            g.add_node(n.name, kind=n.kind.value, rank=n.rank)
        for l in self.links:
            g.add_edge(l.src, l.dst, capacity=l.capacity, latency=l.latency, bandwidth=l.bandwidth,
                       multiplicity=l.multiplicity)
        return g

    # --- JSON --------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "nodes": [{"name": n.name, "kind": n.kind.value, "rank": n.rank,
                       **({"sms": n.sms} if n.sms is not None else {})} for n in self.nodes],
            "links": [
                {"src": l.src, "dst": l.dst, "bandwidth": l.bandwidth, "latency": l.latency,
                 "multiplicity": l.multiplicity}
                for l in self.links
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Topology":
        return cls(
            name=data["name"],
            description=data.get("description", ""),
            nodes=tuple(Node(d["name"], NodeKind(d["kind"]), d.get("rank"), d.get("sms")) for d in data["nodes"]),
            links=tuple(Link(d["src"], d["dst"], float(d["bandwidth"]), float(d["latency"]),
                             int(d.get("multiplicity", 1))) for d in data["links"]),
        )
