"""Symmetries of a topology: identical nodes and rails, found from its names and checked.

Large clusters repeat themselves: node k+1 is wired like node k, rail i+1 like rail i.
The lower bounds (collc.analysis.bounds) search cuts from one GPU of every orbit only,
and the steady-state method solves its rate LP for one source of every orbit and
replicates that source's trees to the others (collc.synthesis.symmetry carries these
automorphisms over to a synthesis network's ranks, links and routes).

Finding automorphisms of a general graph is hard; finding the ones a cluster's
description makes obvious is not. Node names carry indices (`node[3].g[5]`, `rail[5]`);
a candidate automorphism adds 1 (modulo the index's range) to some of those index
positions at once, and is kept only if it maps every node to a node of the same kind
and every link to a link with the same bandwidth, latency and multiplicity. A candidate
that fails costs nothing but the check, so the names only ever decide how much symmetry
is found, never whether what is used is right.
"""

from __future__ import annotations

import re
from collections import defaultdict
from itertools import combinations

import numpy as np

from collc.ir.topology import Topology

_INDEX = re.compile(r"\[(\d+)\]")
# Index positions of one range size tried together, at most (2^6 subsets).
MAX_POSITIONS = 6


def generators(topo: Topology) -> list[np.ndarray]:
    """Index shifts that are automorphisms, as permutations of node indices."""
    names = [n.name for n in topo.nodes]
    template: list[str] = []
    values: list[tuple[int, ...]] = []
    for name in names:
        template.append(_INDEX.sub("[#]", name))
        values.append(tuple(int(v) for v in _INDEX.findall(name)))
    by_position: dict[tuple[str, int], set[int]] = defaultdict(set)
    for t, vs in zip(template, values):
        for k, v in enumerate(vs):
            by_position[(t, k)].add(v)
    # Positions whose values are exactly 0..m-1, grouped by m: the candidates to shift.
    by_range: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for pos, vs in sorted(by_position.items()):
        m = len(vs)
        if m > 1 and vs == set(range(m)):
            by_range[m].append(pos)
    index = {name: i for i, name in enumerate(names)}
    check = _AutomorphismCheck(topo, index)
    found: list[np.ndarray] = []
    kept: list[frozenset] = []
    for m, positions in sorted(by_range.items()):
        positions = positions[:MAX_POSITIONS]
        for size in range(1, len(positions) + 1):
            for subset in combinations(positions, size):
                chosen = frozenset(subset)
                if any(k <= chosen for k in kept):
                    continue  # a smaller shift already covers it
                perm = _shift(names, template, values, chosen, m, index)
                if perm is not None and check(perm):
                    kept.append(chosen)
                    found.append(perm)
    return found


def _shift(names: list[str], template: list[str], values: list[tuple[int, ...]], positions: frozenset,
           m: int, index: dict[str, int]) -> np.ndarray | None:
    perm = np.empty(len(names), dtype=np.int64)
    for i, (t, vs) in enumerate(zip(template, values)):
        if not any((t, k) in positions for k in range(len(vs))):
            perm[i] = i
            continue
        new = [(v + 1) % m if (t, k) in positions else v for k, v in enumerate(vs)]
        parts = t.split("[#]")
        name = parts[0] + "".join(f"[{v}]{p}" for v, p in zip(new, parts[1:]))
        j = index.get(name)
        if j is None:
            return None
        perm[i] = j
    if len(set(perm.tolist())) != len(perm):
        return None
    return perm


class _AutomorphismCheck:
    def __init__(self, topo: Topology, index: dict[str, int]):
        self.kinds = [n.kind for n in topo.nodes]
        self.gpu_rank = [n.rank for n in topo.nodes]
        self.links = {(index[l.src], index[l.dst]): (l.bandwidth, l.latency, l.multiplicity) for l in topo.links}

    def __call__(self, perm: np.ndarray) -> bool:
        if any(self.kinds[int(perm[i])] != k for i, k in enumerate(self.kinds)):
            return False
        for (a, b), attrs in self.links.items():
            if self.links.get((int(perm[a]), int(perm[b]))) != attrs:
                return False
        return True
