"""An alpha-beta simulator of schedules on topologies.

A transfer of b bytes over a path costs the sum of its links' latencies plus b over the
path's bottleneck capacity: data cuts through switches and NICs, while a relay through a
GPU is two ops of the schedule (the verifier rejects routes that cross a GPU). An op
starts once every op it depends on has finished. `op.count` slots of
`collective.slot_bytes(size_bytes)` bytes each make one op's bytes.

Two ways to share a link between transfers:
- `fifo`: each link serves one transfer at a time, in the schedule's order
  ((step, position in ops)). A transfer starts when its dependencies are done and every
  link of its path is free, holds each link l for b / capacity(l), and finishes after
  the path latency plus b / bottleneck.
- `fair`: every transfer whose dependencies are done sends at once, and links are
  shared max-min fairly among the transfers in flight, recomputed whenever one starts or
  finishes sending; a transfer finishes its path latency after its last byte is sent.

Local ops (source and destination on one rank) take b / local_bandwidth when that is
given and no time otherwise: a copy or reduction in device memory (TB/s) runs more than
ten times faster than a link (tens of GB/s), so by default the model keeps to what
bounds a collective, the links. Local ops do not contend with each other.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from operator import attrgetter
from typing import Any

import numpy as np

from collc.diagnostics import CollcError, ScheduleError
from collc.ir.schedule import Op, Schedule
from collc.ir.topology import Link, NodeKind, Topology


class Sharing(str, Enum):
    """How transfers share a link; the values are the tokens of the CLI and reports."""

    FIFO = "fifo"
    FAIR = "fair"


class OpTimes(Mapping[int, float]):
    """op id -> time, for a schedule whose ids are its positions: the list itself, read
    as a mapping (a dict of 3 million entries would cost hundreds of MB at 1,024 ranks).
    Compares equal to a dict with the same items."""

    __slots__ = ("_times",)

    def __init__(self, times: list[float]):
        self._times = times

    def __getitem__(self, op_id: int) -> float:
        if type(op_id) is not int or not 0 <= op_id < len(self._times):
            raise KeyError(op_id)
        return self._times[op_id]

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self._times)))

    def __len__(self) -> int:
        return len(self._times)

    def __repr__(self) -> str:
        return f"OpTimes({dict(self)!r})"


@dataclass(frozen=True)
class Simulation:
    time_s: float  # completion time of the whole schedule
    op_start: Mapping[int, float]  # op id -> time: a dict, or `OpTimes` where ids are positions
    op_finish: Mapping[int, float]
    # Every link of the topology, used or not: bytes carried, and the time it would
    # take to carry them at full capacity (bytes / capacity).
    link_bytes: dict[tuple[str, str], float]
    link_busy_s: dict[tuple[str, str], float]
    sharing: Sharing = Sharing.FIFO
    size_bytes: int = 0

    def utilization(self) -> dict[tuple[str, str], float]:
        """Busy time over completion time, per link (0.0 for an empty schedule)."""
        if self.time_s <= 0:
            return {k: 0.0 for k in self.link_busy_s}
        return {k: busy / self.time_s for k, busy in self.link_busy_s.items()}

    def to_json(self) -> dict[str, Any]:
        util = self.utilization()
        return {
            "sharing": self.sharing.value,
            "size_bytes": self.size_bytes,
            "time_s": self.time_s,
            "time_us": self.time_s * 1e6,
            "ops": [{"id": i, "start_us": self.op_start[i] * 1e6, "finish_us": self.op_finish[i] * 1e6}
                    for i in self.op_start],
            "links": [{"src": a, "dst": b, "bytes": self.link_bytes[(a, b)],
                       "busy_us": self.link_busy_s[(a, b)] * 1e6, "utilization": util[(a, b)]}
                      for (a, b) in self.link_bytes],
        }


@dataclass(frozen=True)
class Path:
    """A transfer's way through the topology, as link indices into `topology.links`."""

    links: tuple[int, ...]
    latency: float
    bottleneck: float


@dataclass
class Router:
    """Paths between GPUs: an op's own route, or the default one (cached per pair).

    The default path crosses only switches and NICs, with the fewest hops and then the
    widest bottleneck, ties broken by the node names along the path, so that a schedule
    always simulates the same way.
    """

    topology: Topology
    _link_index: dict[tuple[str, str], int] = field(init=False)
    _paths: dict[tuple[str, str], Path | None] = field(init=False, default_factory=dict)
    _routes: dict[tuple[str, ...], Path] = field(init=False, default_factory=dict)
    _fabric: dict[str, list[Link]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._link_index = {(l.src, l.dst): i for i, l in enumerate(self.topology.links)}

    def path_for(self, op: Op) -> Path:
        src = self.topology.gpu(op.src.rank).name
        dst = self.topology.gpu(op.dst.rank).name
        if op.route:
            return self._explicit(op, src, dst)
        if (src, dst) not in self._paths:
            self._paths.update(self._default_paths_from(src))
            self._paths.setdefault((src, dst), None)
        path = self._paths[(src, dst)]
        if path is None:
            raise CollcError(
                f"op {op.id}: no path from {src} to {dst} crosses only switches and NICs; relay it through a "
                "GPU explicitly (two ops: one into the relay's buffer, one out of it)", op.origin)
        return path

    def _explicit(self, op: Op, src: str, dst: str) -> Path:
        route = op.route
        if route[0] != src or route[-1] != dst:
            raise ScheduleError(f"op {op.id} is routed {' -> '.join(route)}, which does not run from {src} to {dst}",
                                op.origin)
        cached = self._routes.get(route)
        if cached is not None:
            return cached
        for mid in route[1:-1]:
            if self.topology.has_node(mid) and self.topology.node(mid).kind is NodeKind.GPU:
                raise ScheduleError(f"op {op.id} passes through GPU {mid} without storing; relay through a GPU "
                                    "with two ops", op.origin)
        idx = []
        for a, b in zip(route, route[1:]):
            if (a, b) not in self._link_index:
                raise ScheduleError(f"op {op.id} is routed over {a} -> {b}, which is not a link", op.origin)
            idx.append(self._link_index[(a, b)])
        path = self._make(tuple(idx))
        self._routes[route] = path
        return path

    def _make(self, idx: tuple[int, ...]) -> Path:
        links = [self.topology.links[i] for i in idx]
        for l in links:
            if l.capacity <= 0:
                raise CollcError(f"link {l.src} -> {l.dst} of topology '{self.topology.name}' has no capacity")
        return Path(idx, sum(l.latency for l in links), min(l.capacity for l in links))

    def path_between(self, src_rank: int, dst_rank: int) -> Path | None:
        """The default path from one GPU to another (None: there is none), found by a
        search that stops at the layer reaching `dst` and never expands links into other
        GPUs. It picks the path `path_for` picks, but costs what the fabric near the two
        GPUs costs instead of a search of the whole topology: asking for the S-1 stage
        boundaries of an S-stage pipeline stays linear in S."""
        topo = self.topology
        src, dst = topo.gpu(src_rank).name, topo.gpu(dst_rank).name
        if (src, dst) in self._paths:
            return self._paths[(src, dst)]
        best: dict[str, tuple[float, tuple[str, ...]]] = {src: (math.inf, (src,))}
        frontier = [src]
        found: tuple[float, tuple[str, ...]] | None = None
        while frontier and found is None:
            cand: dict[str, tuple[float, tuple[str, ...]]] = {}
            for node in frontier:
                width, names = best[node]
                direct = self._link_index.get((node, dst))
                if direct is not None:
                    entry = (min(width, topo.links[direct].capacity), names + (dst,))
                    if found is None or (-entry[0], entry[1]) < (-found[0], found[1]):
                        found = entry
                for link in self._fabric_out(node):
                    if link.dst in best:
                        continue
                    entry = (min(width, link.capacity), names + (link.dst,))
                    old = cand.get(link.dst)
                    if old is None or (-entry[0], entry[1]) < (-old[0], old[1]):
                        cand[link.dst] = entry
            best.update(cand)
            frontier = sorted(cand)
        path = None
        if found is not None:
            names = found[1]
            path = self._make(tuple(self._link_index[(a, b)] for a, b in zip(names, names[1:])))
        self._paths[(src, dst)] = path
        return path

    def _fabric_out(self, node: str) -> list[Link]:
        """`node`'s links into switches and NICs (the only nodes that pass data on)."""
        cached = self._fabric.get(node)
        if cached is None:
            topo = self.topology
            cached = [l for l in topo.out_links[node] if topo.node(l.dst).kind is not NodeKind.GPU]
            self._fabric[node] = cached
        return cached

    def _default_paths_from(self, src: str) -> dict[tuple[str, str], Path]:
        """Breadth-first layers from `src`; on each layer, keep for every node the widest
        path (then the smallest by names) among those with the fewest hops."""
        topo = self.topology
        best: dict[str, tuple[float, tuple[str, ...]]] = {src: (math.inf, (src,))}
        frontier = [src]
        out: dict[tuple[str, str], Path] = {}
        while frontier:
            cand: dict[str, tuple[float, tuple[str, ...]]] = {}
            for node in frontier:
                width, names = best[node]
                for link in topo.out_links[node]:
                    nxt = link.dst
                    if nxt in best:
                        continue
                    entry = (min(width, link.capacity), names + (nxt,))
                    old = cand.get(nxt)
                    if old is None or (-entry[0], entry[1]) < (-old[0], old[1]):
                        cand[nxt] = entry
            best.update(cand)
            # GPUs end a path; only switches and NICs pass data on.
            frontier = sorted(n for n in cand if topo.node(n).kind is not NodeKind.GPU)
            for n, (_, names) in cand.items():
                if topo.node(n).kind is NodeKind.GPU:
                    out[(src, n)] = self._make(tuple(self._link_index[(a, b)] for a, b in zip(names, names[1:])))
        return out


def simulate(schedule: Schedule, topology: Topology, size_bytes: int, sharing: str = "fifo",
             local_bandwidth: float | None = None) -> Simulation:
    """Time `schedule` on `topology` at `size_bytes` per rank's output buffer."""
    try:
        mode = Sharing(sharing)
    except ValueError:
        raise CollcError(f"unknown link sharing '{sharing}' (expected one of: "
                         f"{', '.join(s.value for s in Sharing)})") from None
    if topology.num_ranks != schedule.collective.ranks:
        raise CollcError(f"schedule '{schedule.name}' is for {schedule.collective.ranks} ranks but topology "
                         f"'{topology.name}' has {topology.num_ranks} GPUs")
    if size_bytes < 0:
        raise CollcError(f"size must not be negative (got {size_bytes} bytes)")
    if local_bandwidth is not None and local_bandwidth <= 0:
        raise CollcError(f"local bandwidth must be positive (got {local_bandwidth})")
    plan = _Plan.build(schedule, topology, size_bytes, local_bandwidth)
    start, finish, link_bytes = (_run_fifo if mode is Sharing.FIFO else _run_fair)(plan)
    if plan.ids_are_positions:
        op_start, op_finish = OpTimes(start), OpTimes(finish)
    else:
        ids = [op.id for op in schedule.ops]
        op_start, op_finish = dict(zip(ids, start)), dict(zip(ids, finish))
    links = topology.links
    return Simulation(
        time_s=max(finish, default=0.0),
        op_start=op_start,
        op_finish=op_finish,
        link_bytes={(l.src, l.dst): link_bytes[i] for i, l in enumerate(links)},
        link_busy_s={(l.src, l.dst): (link_bytes[i] / l.capacity if l.capacity > 0 else 0.0)
                     for i, l in enumerate(links)},
        sharing=mode,
        size_bytes=size_bytes,
    )


@dataclass
class _Plan:
    """The schedule flattened to arrays indexed by op position."""

    nbytes: list[float]
    paths: list[Path | None]  # None: a local op
    local_s: list[float]  # duration of local ops
    deps: list[list[int] | tuple[int, ...]]  # positions of each op's dependencies
    order: list[int]  # positions by (step, position)
    capacity: list[float]
    ops: tuple[Op, ...]
    ids_are_positions: bool = False

    @classmethod
    def build(cls, schedule: Schedule, topology: Topology, size_bytes: int,
              local_bandwidth: float | None) -> "_Plan":
        coll = schedule.collective
        slot = coll.slot_bytes(size_bytes)
        router = Router(topology)
        # Ids that are positions (every built or synthesized schedule) are unique, and
        # let the ops' own dependency tuples serve as position lists: no copy per op.
        ids_are_positions = _ids_are_positions(schedule.ops)
        position: dict[int, int] = {}
        for i, op in enumerate(() if ids_are_positions else schedule.ops):
            if op.id in position:
                raise ScheduleError(f"op {op.id} appears twice in schedule '{schedule.name}'", op.origin)
            position[op.id] = i
        nbytes, paths, local_s, deps = [], [], [], []
        by_pair: dict[tuple[int, int], Path] = {}  # (src rank, dst rank) -> default path
        # (route, src rank, dst rank) -> its path: the router's answer (and its checks)
        # depends on nothing else, and a steady-state schedule routes every transfer.
        by_route: dict[tuple[tuple[str, ...], int, int], Path] = {}
        op_bytes: dict[int, float] = {}  # count -> bytes, one float object per count
        for op in schedule.ops:
            b = op_bytes.get(op.count)
            if b is None:
                b = op_bytes[op.count] = slot * op.count
            nbytes.append(b)
            if op.src.rank != op.dst.rank:
                if op.route:
                    key = (op.route, op.src.rank, op.dst.rank)
                    path = by_route.get(key)
                    if path is None:
                        path = by_route[key] = router.path_for(op)
                    paths.append(path)
                else:
                    pair = (op.src.rank, op.dst.rank)
                    path = by_pair.get(pair)
                    if path is None:
                        path = by_pair[pair] = router.path_for(op)
                    paths.append(path)
                local_s.append(0.0)
            else:
                paths.append(None)
                local_s.append(b / local_bandwidth if local_bandwidth else 0.0)
            if ids_are_positions:
                for d in op.deps:
                    if not 0 <= d < len(schedule.ops):
                        raise ScheduleError(f"op {op.id} depends on op {d}, which is not in the schedule",
                                            op.origin)
                deps.append(op.deps)
                continue
            try:
                deps.append([position[d] for d in op.deps])
            except KeyError as exc:
                raise ScheduleError(f"op {op.id} depends on op {exc.args[0]}, which is not in the schedule",
                                    op.origin) from None
        # Positions by (step, position): a stable sort by step (no key tuple per op).
        steps = np.fromiter((op.step for op in schedule.ops), dtype=np.int64, count=len(schedule.ops))
        order = np.argsort(steps, kind="stable").tolist()
        return cls(nbytes, paths, local_s, deps, order, [l.capacity for l in topology.links], schedule.ops,
                   ids_are_positions)


def _ids_are_positions(ops: tuple[Op, ...]) -> bool:
    """Whether op i has id i, for every i (read by a C-level map: millions of ops)."""
    try:
        ids = np.fromiter(map(_ID_OF, ops), dtype=np.int64, count=len(ops))
    except (OverflowError, TypeError, ValueError):  # ids that are no int64 are no positions
        return False
    return bool(np.array_equal(ids, np.arange(len(ops))))


_ID_OF = attrgetter("id")


def _run_fifo(plan: _Plan) -> tuple[list[float], list[float], list[float]]:
    n = len(plan.ops)
    start = [0.0] * n
    finish = [math.nan] * n
    link_free = [0.0] * len(plan.capacity)
    link_bytes = [0.0] * len(plan.capacity)
    cap = plan.capacity
    for i in plan.order:
        ready = 0.0
        for d in plan.deps[i]:
            f = finish[d]
            if f != f:  # NaN: not simulated yet, so not at an earlier step
                op = plan.ops[i]
                raise ScheduleError(f"op {op.id} depends on op {plan.ops[d].id}, which is not at an earlier step",
                                    op.origin)
            if f > ready:
                ready = f
        path = plan.paths[i]
        if path is None:
            start[i] = ready
            finish[i] = ready + plan.local_s[i]
            continue
        b = plan.nbytes[i]
        t = ready
        for l in path.links:
            if link_free[l] > t:
                t = link_free[l]
        for l in path.links:
            link_free[l] = t + b / cap[l]
            link_bytes[l] += b
        start[i] = t
        finish[i] = t + path.latency + b / path.bottleneck
    return start, finish, link_bytes


def _run_fair(plan: _Plan) -> tuple[list[float], list[float], list[float]]:
    return _FairSharing(plan).run()


class _FairSharing:
    """Event-driven max-min fair sharing.

    Rates change only at events (a transfer starts or stops sending). All events at
    one instant are handled together, and rates are recomputed only for the transfers
    connected, through shared links, to a link whose set of transfers changed: a
    max-min fair allocation splits into independent ones over such components.
    """

    _SENT, _DONE = 0, 1  # event kinds: a flow sent its last byte; an op finished

    def __init__(self, plan: _Plan):
        self.plan = plan
        n = len(plan.ops)
        self.start = [0.0] * n
        self.finish = [math.nan] * n
        self.link_bytes = [0.0] * len(plan.capacity)
        self.waiting = [len(d) for d in plan.deps]
        self.dependents: list[list[int]] = [[] for _ in range(n)]
        for i, ds in enumerate(plan.deps):
            for d in ds:
                self.dependents[d].append(i)
        self.on_link: list[set[int]] = [set() for _ in plan.capacity]
        self.rate = [0.0] * n
        self.left = [0.0] * n  # bytes still to send, as of `since`
        self.since = [0.0] * n
        self.version = [0] * n
        self.events: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.touched: set[int] = set()

    def push(self, t: float, kind: int, i: int, version: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, i, version))

    def run(self) -> tuple[list[float], list[float], list[float]]:
        for i in range(len(self.plan.ops)):
            if not self.waiting[i]:
                self.begin(i, 0.0)
        self.reshare(0.0)
        while self.events:
            now = self.events[0][0]
            horizon = now + 1e-12 * max(1.0, abs(now))
            while self.events and self.events[0][0] <= horizon:
                t, _, kind, i, version = heapq.heappop(self.events)
                if kind == self._SENT:
                    if version == self.version[i]:
                        self.sent(i, t)
                else:
                    self.done(i, t)
            self.reshare(now)
        unfinished = [op for op, f in zip(self.plan.ops, self.finish) if f != f]
        if unfinished:
            ids = ", ".join(str(op.id) for op in unfinished[:5])
            raise ScheduleError(f"ops {ids}{', ...' if len(unfinished) > 5 else ''} never start: their "
                                "dependencies form a cycle", unfinished[0].origin)
        return self.start, self.finish, self.link_bytes

    def begin(self, i: int, t: float) -> None:
        self.start[i] = t
        path = self.plan.paths[i]
        if path is None:
            self.push(t + self.plan.local_s[i], self._DONE, i)
            return
        b = self.plan.nbytes[i]
        if b <= 0:
            self.push(t + path.latency, self._DONE, i)
            return
        self.left[i] = b
        self.since[i] = t
        self.rate[i] = 0.0
        for l in path.links:
            self.on_link[l].add(i)
            self.link_bytes[l] += b
            self.touched.add(l)

    def sent(self, i: int, t: float) -> None:
        path = self.plan.paths[i]
        assert path is not None
        self.left[i] = 0.0
        self.rate[i] = 0.0
        for l in path.links:
            self.on_link[l].discard(i)
            self.touched.add(l)
        self.push(t + path.latency, self._DONE, i)

    def done(self, i: int, t: float) -> None:
        self.finish[i] = t
        for j in self.dependents[i]:
            self.waiting[j] -= 1
            if not self.waiting[j]:
                self.begin(j, t)

    def reshare(self, now: float) -> None:
        if not self.touched:
            return
        flows, links = self._component(self.touched)
        self.touched = set()
        if not flows:
            return
        new_rate = self._max_min(flows, links)
        for i in flows:
            r = new_rate[i]
            if r == self.rate[i]:
                continue  # unchanged: its pending event stays right
            self.left[i] = max(0.0, self.left[i] - self.rate[i] * (now - self.since[i]))
            self.since[i] = now
            self.rate[i] = r
            self.version[i] += 1
            self.push(now + self.left[i] / r, self._SENT, i, self.version[i])

    def _component(self, seeds: set[int]) -> tuple[list[int], list[int]]:
        paths = self.plan.paths
        seen_links = set(seeds)
        stack = list(seeds)
        flows: set[int] = set()
        while stack:
            l = stack.pop()
            for i in self.on_link[l]:
                if i in flows:
                    continue
                flows.add(i)
                for l2 in paths[i].links:  # type: ignore[union-attr]
                    if l2 not in seen_links:
                        seen_links.add(l2)
                        stack.append(l2)
        return sorted(flows), sorted(seen_links)

    def _max_min(self, flows: list[int], links: list[int]) -> dict[int, float]:
        """Progressive filling: raise every rate together, freezing the flows of each link
        as it fills; a link's fair share only grows as others freeze, so a heap of
        shares with lazy updates finds the next link to fill."""
        paths = self.plan.paths
        room = {l: self.plan.capacity[l] for l in links}
        count = {l: len(self.on_link[l]) for l in links}
        heap = [(room[l] / count[l], l) for l in links if count[l]]
        heapq.heapify(heap)
        rate: dict[int, float] = {}
        while heap:
            share, l = heapq.heappop(heap)
            if not count[l]:
                continue
            current = room[l] / count[l]
            if current > share:
                heapq.heappush(heap, (current, l))
                continue
            for i in self.on_link[l]:
                if i in rate:
                    continue
                rate[i] = current
                for l2 in paths[i].links:  # type: ignore[union-attr]
                    room[l2] = max(0.0, room[l2] - current)
                    count[l2] -= 1
                    if count[l2] and l2 != l:
                        heapq.heappush(heap, (room[l2] / count[l2], l2))
        return rate
