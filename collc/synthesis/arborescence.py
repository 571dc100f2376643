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
    # Every node outside a cycle is a group of its own, numbered after the cycles.
    singles = np.flatnonzero(group < 0)
    k = len(members)
    group[singles] = np.arange(k, k + len(singles))
    m = k + len(singles)
    in_cycle = group < k
    # Entering a cycle at v replaces v's cycle edge: charge only the difference.
    adjusted = c - np.where(in_cycle, best, 0.0)[None, :]

    row_min = np.empty((m, n))
    row_arg = np.empty((m, n), dtype=np.int64)
    row_min[k:] = adjusted[singles]
    row_arg[k:] = singles[:, None]
    for a, mem in enumerate(members):
        sub = adjusted[mem]
        j = np.argmin(sub, axis=0)
        row_min[a] = sub[j, np.arange(n)]
        row_arg[a] = mem[j]
    small = np.empty((m, m))
    col_arg = np.empty((m, m), dtype=np.int64)
    small[:, k:] = row_min[:, singles]
    col_arg[:, k:] = singles[None, :]
    for b, mem in enumerate(members):
        sub = row_min[:, mem]
        j = np.argmin(sub, axis=1)
        small[:, b] = sub[np.arange(m), j]
        col_arg[:, b] = mem[j]
    np.fill_diagonal(small, INF)

    sub_parent = min_arborescence(small, int(group[root]))
    out = parent.copy()
    entered = np.flatnonzero(sub_parent >= 0)  # each group's edge in: into one of its nodes
    via = sub_parent[entered]
    v = col_arg[via, entered]
    out[v] = row_arg[via, v]
    out[root] = -1
    return out


def _cycles(parent: np.ndarray) -> list[list[int]]:
    up = parent.tolist()  # Python ints: this walk is scalar work, slow on numpy items
    n = len(up)
    state = [0] * n  # 0 new, 1 on the current walk, 2 done
    cycles: list[list[int]] = []
    for s in range(n):
        if state[s]:
            continue
        walk = []
        v = s
        while v >= 0 and state[v] == 0:
            state[v] = 1
            walk.append(v)
            v = up[v]
        if v >= 0 and state[v] == 1:
            cycles.append(walk[walk.index(v):])
        for u in walk:
            state[u] = 2
    return cycles


def tree_cost(cost: np.ndarray, parent: np.ndarray) -> float:
    return float(sum(cost[p, v] for v, p in enumerate(parent) if p >= 0))
