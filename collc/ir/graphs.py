"""Small graph searches on plain node lists, for the paths that must not pay for
importing networkx (0.15-0.25 s of CPU, a tenth of the README's compile): connected
components, strong connectivity and minimum cuts; and sets of node ids held as bit
masks. The rarer searches (condensations of a network that is not strongly connected,
all-pairs shortest paths) still use networkx, imported where they run."""

from __future__ import annotations

import math
from collections import deque
from typing import Hashable, Iterable, TypeVar

Node = TypeVar("Node", bound=Hashable)


def connected_components(nodes: Iterable[Node], edges: Iterable[tuple[Node, Node]]) -> list[set[Node]]:
    """The components of the undirected graph, in the order networkx's
    `connected_components` yields them: by the first of `nodes` each holds (a node
    named only by an edge comes after every one of `nodes`, in the order edges name it)."""
    adjacent: dict[Node, list[Node]] = {n: [] for n in nodes}
    for a, b in edges:
        adjacent.setdefault(a, []).append(b)
        adjacent.setdefault(b, []).append(a)
    seen: set[Node] = set()
    out: list[set[Node]] = []
    for start in adjacent:
        if start in seen:
            continue
        component = {start}
        queue = deque((start,))
        while queue:
            for m in adjacent[queue.popleft()]:
                if m not in component:
                    component.add(m)
                    queue.append(m)
        seen |= component
        out.append(component)
    return out


def strongly_connected(count: int, edges: Iterable[tuple[int, int]]) -> bool:
    """Whether every one of the nodes 0..count-1 reaches every other along the directed
    edges."""
    return count <= 1 or mutually_reachable(range(count), range(count), edges)


def mutually_reachable(targets: Iterable[Node], nodes: Iterable[Node], edges: Iterable[tuple[Node, Node]]) -> bool:
    """Whether each of `targets` (some of `nodes`) reaches every other along the directed
    edges, through any nodes: the first reaches all, and all reach the first."""
    forward: dict[Node, list[Node]] = {n: [] for n in nodes}
    backward: dict[Node, list[Node]] = {n: [] for n in forward}
    for a, b in edges:
        forward[a].append(b)
        backward[b].append(a)
    wanted = list(targets)
    if len(wanted) <= 1:
        return True
    return all(set(wanted) <= _reached(adjacent, wanted[0]) for adjacent in (forward, backward))


def _reached(adjacent: dict[Node, list[Node]], start: Node) -> set[Node]:
    """The nodes `start` reaches (itself included)."""
    seen = {start}
    stack = [start]
    while stack:
        for m in adjacent[stack.pop()]:
            if m not in seen:
                seen.add(m)
                stack.append(m)
    return seen


def minimum_cut(capacity: dict[Node, dict[Node, float]], source: Node, sink: Node) -> tuple[float, set[Node]]:
    """(the maximum flow's value, the source side of a minimum cut) of the directed graph
    whose edge u -> v carries at most `capacity[u][v]` (math.inf: no limit); every node
    must be a key of `capacity`. The source side is the largest one: every node that
    cannot reach the sink in the residual network of a maximum flow. That set is the same
    for every maximum flow (it is networkx's `minimum_cut` partition), so this answers as
    networkx does without importing it. Dinic's algorithm: breadth-first levels, then
    blocking flows along them."""
    residual: dict[Node, dict[Node, float]] = {u: dict(out) for u, out in capacity.items()}
    for u, out in capacity.items():
        for v in out:
            residual[v].setdefault(u, 0.0)
    value = 0.0
    while True:
        level = _levels(residual, source, sink)
        if sink not in level:
            break
        value += _blocking_flow(residual, level, source, sink)
    return value, set(residual) - _reaching(residual, sink)


def _levels(residual: dict[Node, dict[Node, float]], source: Node, sink: Node) -> dict[Node, int]:
    """Each node's distance from the source along edges with room left (up to the sink's)."""
    level = {source: 0}
    queue = deque((source,))
    while queue:
        u = queue.popleft()
        if u == sink:
            break
        for v, room in residual[u].items():
            if room > 0.0 and v not in level:
                level[v] = level[u] + 1
                queue.append(v)
    return level


def _blocking_flow(residual: dict[Node, dict[Node, float]], level: dict[Node, int], source: Node,
                   sink: Node) -> float:
    """Augment along shortest paths of the level graph until none is left; the flow sent.
    A path's bottleneck edge is set to exactly 0 room (not `room - room`), so that a
    saturated edge is saturated whatever the rounding."""
    ahead = {u: [v for v in out if level.get(v, -1) == level[u] + 1] for u, out in residual.items() if u in level}
    position = dict.fromkeys(ahead, 0)
    dead: set[Node] = set()
    sent = 0.0
    path = [source]
    while True:
        u = path[-1]
        if u == sink:
            hops = list(zip(path, path[1:]))
            delta = min(residual[a][b] for a, b in hops)
            for a, b in hops:
                room = residual[a][b]
                residual[a][b] = 0.0 if room == delta else room - delta
                residual[b][a] += delta
            sent += delta
            path = [source]
            continue
        forward, i = ahead[u], position[u]
        while i < len(forward) and (forward[i] in dead or not residual[u][forward[i]] > 0.0):
            i += 1
        position[u] = i
        if i < len(forward):
            path.append(forward[i])
        elif u == source:
            return sent
        else:
            dead.add(u)        # no way on from here: never tried again in this phase
            path.pop()


def _reaching(residual: dict[Node, dict[Node, float]], sink: Node) -> set[Node]:
    """The nodes that reach the sink along edges with room left."""
    into: dict[Node, list[Node]] = {u: [] for u in residual}
    for u, out in residual.items():
        for v, room in out.items():
            if room > 0.0:
                into[v].append(u)
    return _reached(into, sink)


def mask_of(members: Iterable[int]) -> int:
    """A set of non-negative integers as a bit mask (bit v for v)."""
    out = 0
    for v in members:
        out |= 1 << v
    return out


def mask_members(mask: int) -> list[int]:
    """The members of a set of non-negative integers held as a bit mask (bit v for v),
    lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out
