"""Minimum-cost spanning arborescences (Chu-Liu/Edmonds) on dense cost matrices.

The steady-state method prices a spanning tree per source in every iteration of its
column generation; networkx's general implementation is too slow for that at 64 GPUs,
so this one works on numpy matrices and contracts every cycle of a round at once.
"""

from __future__ import annotations

import numpy as np

INF = np.inf


class NoArborescence(ValueError):
    """Some node cannot be reached from the root."""


def min_arborescence(cost: np.ndarray, root: int) -> np.ndarray:
    """parent[v] of a minimum-cost arborescence rooted at `root` that spans every node
    (parent[root] = -1). cost[u, v] is the cost of edge u -> v; inf where there is none."""
    n = cost.shape[0]
    c = np.array(cost, dtype=float)
    np.fill_diagonal(c, INF)
    c[:, root] = INF
    parent = np.argmin(c, axis=0)
    parent[root] = -1
    best = c[parent, np.arange(n)]
    best[root] = 0.0
    if np.isinf(best).any():
        raise NoArborescence(f"node {int(np.argmax(np.isinf(best)))} is unreachable")
    cycles = _cycles(parent)
    if not cycles:
        return parent

    group = np.full(n, -1, dtype=np.int64)
    members: list[np.ndarray] = []
    for cyc in cycles:
        group[cyc] = len(members)
        members.append(np.asarray(cyc))
    for v in range(n):
        if group[v] < 0:
            group[v] = len(members)
            members.append(np.asarray([v]))
    m = len(members)
    in_cycle = np.zeros(n, dtype=bool)
    for cyc in cycles:
        in_cycle[cyc] = True
    # Entering a cycle at v replaces v's cycle edge: charge only the difference.
    adjusted = c - np.where(in_cycle, best, 0.0)[None, :]

    row_min = np.empty((m, n))
    row_arg = np.empty((m, n), dtype=np.int64)
    for a, mem in enumerate(members):
        if len(mem) == 1:
            row_min[a] = adjusted[mem[0]]
            row_arg[a] = mem[0]
        else:
            sub = adjusted[mem]
            k = np.argmin(sub, axis=0)
            row_min[a] = sub[k, np.arange(n)]
            row_arg[a] = mem[k]
    small = np.empty((m, m))
    col_arg = np.empty((m, m), dtype=np.int64)
    for b, mem in enumerate(members):
        if len(mem) == 1:
            small[:, b] = row_min[:, mem[0]]
            col_arg[:, b] = mem[0]
        else:
            sub = row_min[:, mem]
            k = np.argmin(sub, axis=1)
            small[:, b] = sub[np.arange(m), k]
            col_arg[:, b] = mem[k]
    np.fill_diagonal(small, INF)

    sub_parent = min_arborescence(small, int(group[root]))
    out = parent.copy()
    for b in range(m):
        a = sub_parent[b]
        if a < 0:
            continue
        v = col_arg[a, b]
        out[v] = row_arg[a, v]
    out[root] = -1
    return out


def _cycles(parent: np.ndarray) -> list[list[int]]:
    n = len(parent)
    state = np.zeros(n, dtype=np.int8)  # 0 new, 1 on the current walk, 2 done
    cycles: list[list[int]] = []
    for s in range(n):
        if state[s]:
            continue
        walk = []
        v = s
        while v >= 0 and state[v] == 0:
            state[v] = 1
            walk.append(v)
            v = int(parent[v])
        if v >= 0 and state[v] == 1:
            cycles.append(walk[walk.index(v):])
        for u in walk:
            state[u] = 2
    return cycles


def tree_cost(cost: np.ndarray, parent: np.ndarray) -> float:
    return float(sum(cost[p, v] for v, p in enumerate(parent) if p >= 0))
