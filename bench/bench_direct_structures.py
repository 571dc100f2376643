"""The direct AllReduce (collc.synthesis.direct) on dgx2(chassis=2), 1 GiB: what its XML
nodes are made of, whether path-shaped structures would hold more pieces, and whether
another list order drains the gatherings alongside the reductions. The schedule's time
over the lower bound is collc's model; XML nodes are those of the busiest rank at the
least (`msccl-coalesce`'s `node_estimate`, every receive that a send forwards counted
as fused; no `<tb>`s), against the MSCCL executor's 4,096.

Three parts:

- `trees`: the leaves of the trees the joint LP packs. With every forward fused, a
  tree over N ranks costs N - 1 + (its leaves) steps per piece (a leaf's one send or
  receive; every other rank one step per child, the first fused with its own receive),
  so a star costs 2N - 2 and a path N.
- `paths`: the same LP priced with Hamiltonian paths (one leaf per structure) instead
  of spanning trees, and with caterpillars (a path with `--extra-leaves` more ranks
  hanging off it as leaves), each then pipelined as synthesis pipelines the trees, at
  `--pieces`, next to the trees at the same counts. The path pricing is exact for this
  topology's shape (two chassis on a switch each, joined by single links between
  chosen GPUs; `PathGrid`); the caterpillars' is a heuristic (an upper bound on their
  best packing's time). Swapped in for the tree pricing here only.
- `order`: the tree schedule at `--order-pieces` pieces under other list orders
  (`direct_ops`'s `relay_lead` and `gather_lead`).

    python3 bench/bench_direct_structures.py [--parts trees,paths,order] [--pieces 32,48,64]
        [--extra-leaves 0,1]
        [--order-pieces 32] [--out bench/results/direct_structures.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from typing import Iterator

import numpy as np

from collc.analysis.bounds import lower_bounds
from collc.backends.msccl_xml.coalesce import node_estimate
from collc.frontend import resolve_topology
from collc.ir.collective import standard
from collc.ir.schedule import Schedule
from collc.synthesis import direct
from collc.synthesis.candidates import Candidate, to_result
from collc.synthesis.network import Network, reversed_topology
from collc.synthesis.options import SynthesisOptions
from collc.synthesis.progress import Progress
from collc.synthesis.solver import Deadline
from collc.synthesis.steady import trees
from collc.synthesis.steady.solution import RateSolution
from collc.synthesis.timing import sequence
from collc.verify import verify

GIB = 1 << 30
TOPOLOGY = "dgx2(chassis=2)"
OPTIONS = SynthesisOptions(progress=False)


class PathGrid(trees.RouteGrid):
    # Ranks a structure may hang off its path as leaves, besides the path's last rank
    # (0: Hamiltonian paths; more: caterpillars, priced by detaching the most profitable
    # leaves from the cheapest path, a heuristic).
    extra_leaves = 0

    """Tree pricing replaced by the cheapest Hamiltonian path from the root, for a
    network of two groups of ranks (chassis) in which every ordered pair of one group
    has one route (through its switch) and the groups are joined by single links.

    Why it is exact there: a route inside a group costs e_u + i_v (the sender's port
    to the switch and the receiver's port from it), so a path costs the sum of every
    rank's ingress but the root's, every rank's egress but the last one's, and for each
    hop between the groups that hop's price instead of its two ranks' switch ports. The
    path is then decided by its last rank and its hops between the groups, alternating
    in direction from the root's group: for every last rank and number of hops, the
    best hops of each direction are taken. The gauge of e and i inside a group does not
    change a path's cost (as many of its ranks send through the switch as receive from
    it, less the ends), so they are read off the route costs with one port set to 0."""

    def tree(self, nodes: tuple[int, ...], route_cost: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
        n = self.grid.shape[0]
        if len(nodes) != n:
            raise ValueError("paths are priced over every rank")
        idx = np.asarray(nodes)
        routes = self.grid[np.ix_(idx, idx)][:, :, 0]
        cost = np.append(route_cost, np.inf)[routes]
        group = self._groups(routes)
        e, i = _ports(cost, group)
        path = _cheapest_path(cost, group, e, i)
        parent = {b: a for a, b in zip(path, path[1:])}
        for _ in range(self.extra_leaves):
            if not _detach_leaf(path, parent, group, e):
                break
        return _as_routes(parent, routes)

    def _groups(self, routes: np.ndarray) -> np.ndarray:
        """Group of every position: ranks with routes both ways between them."""
        linked = routes != self.none
        both = linked & linked.T
        group = np.full(len(routes), -1)
        for u in range(len(routes)):
            if group[u] < 0:
                group[both[u] | (np.arange(len(routes)) == u)] = group.max() + 1
        if group.max() != 1:
            raise ValueError("PathGrid prices two groups of ranks only")
        return group


def _detach_leaf(path: list[int], parent: dict[int, int], group: np.ndarray, e: np.ndarray) -> bool:
    """Hang the path rank whose sending costs most (inside its group, not the root, the
    last rank or a hop's end) off the cheapest sender of its group, where that pays."""
    child_of = {par: child for child, par in parent.items() if child in path}  # along the path
    senders = [w for w in path if w in child_of]
    best: tuple[float, int, int] | None = None
    for v in path[1:-1]:
        before, after = parent[v], child_of[v]
        if group[before] != group[v] or group[after] != group[v]:
            continue
        others = [w for w in senders if w != v and group[w] == group[v]]
        if not others:
            continue
        w = min(others, key=lambda x: (e[x], x))
        gain = e[v] - e[w]
        if gain > 1e-15 and (best is None or gain > best[0]):
            best = (gain, v, w)
    if best is None:
        return False
    _, v, w = best
    parent[child_of[v]] = parent[v]
    parent[v] = w
    path.remove(v)
    return True


def _as_routes(parent: dict[int, int], routes: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A tree given by its parents as routes, parents before children, with depths."""
    children: dict[int, list[int]] = {}
    for child, par in sorted(parent.items()):
        children.setdefault(par, []).append(child)
    out, depths, frontier, depth = [], [], [0], 0
    while frontier:
        depth += 1
        nxt = []
        for u in frontier:
            for v in children.get(u, []):
                out.append(int(routes[u, v]))
                depths.append(depth)
                nxt.append(v)
        frontier = nxt
    if len(out) != len(routes) - 1:
        raise AssertionError("not a spanning tree")
    return tuple(out), tuple(depths)


def _ports(cost: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Egress and ingress prices e, i with cost[u, v] = e[u] + i[v] inside each group."""
    e, i = np.zeros(len(cost)), np.zeros(len(cost))
    for g in (0, 1):
        members = np.flatnonzero(group == g)
        a, b, c = members[:3]
        i[members] = cost[a, members]
        e[b] = cost[b, c] - i[c]
        i[a] = cost[b, a] - e[b]
        rest = members[(members != a) & (members != b)]
        e[rest] = cost[rest, a] - i[a]
    return e, i


def _cheapest_path(cost: np.ndarray, group: np.ndarray, e: np.ndarray, i: np.ndarray) -> list[int]:
    """The cheapest Hamiltonian path from position 0 (see PathGrid)."""
    n = len(cost)
    home, away = int(group[0]), 1 - int(group[0])
    # Hops between the groups by the group they leave, best saving first.
    hops: dict[int, list[tuple[float, int, int]]] = {home: [], away: []}
    for u, v in zip(*np.nonzero(np.isfinite(cost) & (group[:, None] != group[None, :]))):
        hops[int(group[u])].append((float(e[u] + i[v] - cost[u, v]), int(u), int(v)))
    for side in hops.values():
        side.sort(reverse=True)
    best: tuple[float, int, list, list, bool, bool] | None = None
    for last in range(1, n):
        ends_away = group[last] == away
        for root_sends in (False, True):
            for last_receives in (False, True):
                for back in range(0, len(hops[away]) + 1):
                    out = back + 1 if ends_away else back
                    pick = _hops(hops, home, away, last, out, back, root_sends, last_receives, ends_away)
                    if pick is None:
                        continue
                    there, again = pick
                    gain = sum(h[0] for h in there + again) + e[last]
                    if best is None or gain > best[0]:
                        best = (gain, last, there, again, root_sends, last_receives)
    if best is None:
        raise trees.NotApplicable("no Hamiltonian path from the root")
    _, last, there, again, root_sends, last_receives = best
    return _assemble(n, group, last, there, again, root_sends, last_receives)


def _hops(hops: dict[int, list[tuple[float, int, int]]], home: int, away: int, last: int, out: int, back: int,
          root_sends: bool, last_receives: bool, ends_away: bool) -> tuple[list, list] | None:
    """The best `out` hops leaving the root's group and `back` returning to it, the
    first sent by the root where root_sends and the final one received by `last` where
    last_receives; None where no such path exists."""
    if out < 1:
        return None
    # The root alone in its first segment (root_sends) and `last` alone in the final one
    # (last_receives): each group still needs a segment for its other ranks.
    alone_home = int(root_sends) + int(last_receives and not ends_away)
    alone_away = int(last_receives and ends_away)
    if back + 1 <= alone_home or out <= alone_away:
        return None
    fixed_there: list = []
    fixed_final: list = []
    if root_sends:
        fixed_there = [h for h in hops[home] if h[1] == 0 and h[2] != last][:1]
        if not fixed_there:
            return None
    if last_receives:
        fixed_final = [h for h in (hops[home] if ends_away else hops[away]) if h[2] == last and h[1] != 0][:1]
        if not fixed_final or set(fixed_final[0][1:]) & {x for h in fixed_there for x in h[1:]}:
            return None
    taken = {0, last}
    free_there = [h for h in hops[home] if not taken & set(h[1:])]
    free_again = [h for h in hops[away] if not taken & set(h[1:])]
    need_there = out - len(fixed_there) - (len(fixed_final) if ends_away else 0)
    need_again = back - (0 if ends_away else len(fixed_final))
    if need_there < 0 or need_again < 0 or need_there > len(free_there) or need_again > len(free_again):
        return None
    there = fixed_there + free_there[:need_there] + (fixed_final if ends_away else [])
    again = free_again[:need_again] + ([] if ends_away else fixed_final)
    used = [x for h in there + again for x in h[1:]]
    if len(set(used)) != len(used):
        return None
    return there, again


def _assemble(n: int, group: np.ndarray, last: int, there: list, again: list, root_sends: bool,
              last_receives: bool) -> list[int]:
    """The path: segments between the hops (alternately leaving and returning), every
    rank no hop or end uses in the first segment of its group that can hold it."""
    order = []
    for j, hop in enumerate(there):
        order.append(hop)
        if j < len(again):
            order.append(again[j])
    segments = [[0]]
    for _, u, v in order:
        if segments[-1][-1] != u:
            segments[-1].append(u)
        segments.append([v])
    if not last_receives:
        segments[-1].append(last)
    used = {0, last} | {x for h in order for x in h[1:]}
    for g in (0, 1):
        free = [p for p in range(n) if p not in used and group[p] == g]
        for j, seg in enumerate(segments):
            alone = (j == 0 and root_sends) or (j == len(segments) - 1 and last_receives)
            if group[seg[0]] == g and not alone:
                segments[j] = seg[:1] + free + seg[1:]
                break
    path = [p for seg in segments for p in seg]
    if sorted(path) != list(range(n)):
        raise AssertionError(f"not a Hamiltonian path: {path}")
    return path


@contextlib.contextmanager
def priced_by_paths() -> Iterator[None]:
    """Within: the tree LPs (collc.synthesis.steady.trees) price Hamiltonian paths."""
    saved = trees.RouteGrid
    trees.RouteGrid = PathGrid  # type: ignore[misc]
    try:
        yield
    finally:
        trees.RouteGrid = saved  # type: ignore[misc]


def leaves(routes: tuple[int, ...], network: Network) -> int:
    senders = {network.routes[r].src for r in routes}
    return sum(1 for r in routes if network.routes[r].dst not in senders)


def leaf_rows(rates: direct.JointRates, forward: Network, backward: Network) -> list[dict]:
    rows = []
    parts: list[tuple[str, RateSolution | None, Network]] = [
        ("reductions, joint LP", rates.reduce, backward), ("gatherings, joint LP", rates.gather, forward),
        ("reductions, own LP", rates.reduce_alone, backward), ("gatherings, own LP", rates.gather_alone, forward)]
    for name, solution, network in parts:
        assert solution is not None
        found = [(leaves(routes, network), share) for shares in solution.shares.values() for routes, share in shares]
        weight = sum(share for _, share in found)
        rows.append({"part": "trees", "structures": name, "count": len(found),
                     "leaves_weighted": sum(leaf * share for leaf, share in found) / weight,
                     "leaves_min": min(leaf for leaf, _ in found), "leaves_max": max(leaf for leaf, _ in found)})
    return rows


def step_breakdown(schedule: Schedule) -> dict:
    """The busiest rank's steps at the least, as node_estimate counts them, by kind."""
    ops = schedule.ops
    ranks = schedule.collective.ranks
    steps, sends, receives, fused, local = ([0] * ranks for _ in range(5))
    forwarded = bytearray(len(ops))
    for op in ops:
        r = op.src.rank
        steps[r] += 1
        if op.dst.rank == r:
            local[r] += 1
            continue
        sends[r] += 1
        receives[op.dst.rank] += 1
        steps[op.dst.rank] += 1
        for d in op.deps:
            a = ops[d]
            if not forwarded[d] and a.dst == op.src and a.src.rank != r and a.count == op.count:
                forwarded[d] = 1
                steps[r] -= 1
                fused[r] += 1
                break
    most = max(range(ranks), key=lambda r: (steps[r], -r))
    return {"rank": most, "steps": steps[most], "sends": sends[most], "receives": receives[most],
            "fused": fused[most], "local_copies": local[most], "mean_steps": sum(steps) / ranks}


def pipelined_row(label: str, cand: Candidate, coll, topo, bound: float, pieces: int, started: float) -> dict:
    schedule = to_result(cand, coll, topo, Deadline(900)).schedule
    verify(schedule, topo)
    nodes, _ = node_estimate(schedule)
    return {"part": label, "pieces": pieces, "time_over_bound": cand.estimate_s / bound, "xml_nodes_fused": nodes,
            "busiest": step_breakdown(schedule), "verified": True, "cpu_s": time.process_time() - started}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="trees,paths,order")
    ap.add_argument("--pieces", default="32,48,64", help="pieces per GPU's chunk for the path packings")
    ap.add_argument("--extra-leaves", default="0,1", help="leaves besides a path's last rank (0: paths)")
    ap.add_argument("--order-pieces", type=int, default=32)
    ap.add_argument("--relay-leads", default="0,0.02,0.05,0.08,0.1,0.12,0.15,0.2")
    ap.add_argument("--gather-leads", default="-0.02,0.01,0.02,0.04,0.08,0.15,0.3,1")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    topo = resolve_topology(TOPOLOGY)
    coll = standard("allreduce", topo.num_ranks, 1)
    forward, backward = Network(topo), Network(reversed_topology(topo))
    bound = lower_bounds(topo, coll, GIB).best_s
    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)

    def rates_for() -> direct.JointRates:
        joint = direct.joint_rates(forward, backward, coll, GIB, OPTIONS, Deadline(900), Progress(False))
        return direct.with_own_rates(joint, forward, backward, coll, GIB, OPTIONS, Deadline(900), Progress(False))

    t = time.process_time()
    tree_rates = rates_for()
    emit({"part": "trees", "structures": "LP", "joint_over_bound": tree_rates.seconds / bound,
          "cpu_s": time.process_time() - t})
    if "trees" in parts:
        for row in leaf_rows(tree_rates, forward, backward):
            emit(row)
    if "paths" in parts:
        for extra in (int(x) for x in args.extra_leaves.split(",") if x):
            label = "paths" if extra == 0 else f"paths with {extra} more leaves"
            t = time.process_time()
            PathGrid.extra_leaves = extra
            with priced_by_paths():
                path_rates = rates_for()
            assert path_rates.reduce_alone is not None and path_rates.gather_alone is not None
            emit({"part": label, "structures": "LP", "joint_over_bound": path_rates.seconds / bound,
                  "reduce_alone_over_bound": path_rates.reduce_alone.seconds / bound,
                  "gather_alone_over_bound": path_rates.gather_alone.seconds / bound,
                  "leaves": [row["leaves_max"] for row in leaf_rows(path_rates, forward, backward)],
                  "cpu_s": time.process_time() - t})
            for pieces in (int(p) for p in args.pieces.split(",") if p):
                t = time.process_time()
                cand = direct.direct_candidate(forward, backward, coll, GIB, pieces, path_rates, OPTIONS,
                                               Deadline(900), Progress(False))
                emit(pipelined_row(label, cand, coll, topo, bound, pieces, t))
        for pieces in (int(p) for p in args.pieces.split(",") if p):
            t = time.process_time()
            cand = direct.direct_candidate(forward, backward, coll, GIB, pieces, tree_rates, OPTIONS, Deadline(900),
                                           Progress(False))
            emit(pipelined_row("trees", cand, coll, topo, bound, pieces, t))
    if "order" in parts:
        k = args.order_pieces
        leads = [("relay_lead", float(x)) for x in args.relay_leads.split(",") if x]
        leads += [("gather_lead", float(x)) for x in args.gather_leads.split(",") if x]
        for name, value in [("default", 0.0)] + leads:
            t = time.process_time()
            kwargs = {} if name == "default" else {name: value}
            built = direct.direct_ops(forward, backward, coll, GIB, k, tree_rates, OPTIONS, Deadline(900),
                                      Progress(False), **kwargs)
            fine = built.plan.problem.collective
            seconds = sequence(built.ops, forward, fine.slot_bytes(GIB), OPTIONS.timing).seconds
            emit({"part": "order", "pieces": k, "knob": name, "value": value if kwargs else None,
                  "time_over_bound": seconds / bound, "cpu_s": time.process_time() - t})
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"topology": TOPOLOGY, "size": GIB, "bound_s": bound, "load_end": os.getloadavg()[0],
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
