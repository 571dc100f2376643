"""The time-expanded network of TE-CCL: epochs, route lags, link capacity per epoch.

Time is cut into epochs of length `tau`. A chunk that leaves on route r in epoch k can be
forwarded by the receiver from epoch k + lag[r] (lag covers the route's latency and the
chunk's time on the wire, so it is at least 1). Every physical link l may carry, in any
`window[l]` consecutive epochs, transfers whose wire time adds up to at most that many
epochs: a link slower than one chunk per epoch takes one chunk every few epochs.

`build_flow_model` writes the TE-CCL MILP over this grid (binary flow per chunk, route
and epoch; holdings per chunk, GPU and epoch; copies allowed), for a whole horizon
(method milp) or for one window of epochs with a state carried over (method rounds).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from collc.synthesis.plan import Transfer
from collc.synthesis.problem import Problem
from collc.synthesis.solver import INF, Model

# Finer epochs make route times rounder but the model bigger; this many epochs per
# fastest transfer at most.
MAX_EPOCH_SPLIT = 4
# Accept an epoch once every route's time rounds up by at most this fraction.
ROUNDING_TOLERANCE = 0.2
UNREACHABLE = 1 << 30


@dataclass(frozen=True)
class EpochGrid:
    tau: float  # seconds per epoch
    lag: tuple[int, ...]  # per route
    hold: dict[int, float]  # per physical link some route uses: epochs it stays busy per chunk
    window: dict[int, int]  # per such link: the capacity constraint spans this many epochs
    dist: np.ndarray  # ranks x ranks: fewest epochs from one GPU to another (relaying)

    @property
    def max_lag(self) -> int:
        return max(self.lag, default=1)


def make_grid(problem: Problem, split: int | None = None) -> EpochGrid:
    net = problem.network
    slot = problem.slot_bytes
    seconds = [r.seconds(slot) for r in net.routes]
    fastest = min(seconds)
    if split is None:
        split = MAX_EPOCH_SPLIT
        for m in range(1, MAX_EPOCH_SPLIT + 1):
            tau = fastest / m
            worst = max(math.ceil(t / tau - 1e-9) * tau / t for t in seconds) - 1
            if worst <= ROUNDING_TOLERANCE:
                split = m
                break
    return grid_of(problem, fastest / split)


def coarse_grid(problem: Problem, at_least: float = 0.0) -> EpochGrid:
    """Epochs as long as the slowest route's chunk (or `at_least` seconds, if longer):
    every route takes one epoch, and a link carries several chunks in one (its capacity
    row allows 1 / hold of them). A topology whose slow links (InfiniBand beside NVLink)
    take several fast epochs per chunk then needs as many epochs as the slow links'
    chunks, not several times more; `at_least` caps the count where those are many."""
    seconds = [r.seconds(problem.slot_bytes) for r in problem.network.routes]
    return grid_of(problem, max(max(seconds), at_least))


def grid_of(problem: Problem, tau: float) -> EpochGrid:
    """The grid of epochs `tau` seconds long."""
    net = problem.network
    slot = problem.slot_bytes
    lag = tuple(max(1, math.ceil(r.seconds(slot) / tau - 1e-9)) for r in net.routes)
    hold = {l: slot / net.links[l].capacity / tau for l in net.used_links}
    window = {l: max(1, math.ceil(h - 1e-9)) for l, h in hold.items()}
    return EpochGrid(tau, lag, hold, window, _all_pairs_epochs(problem, lag))


def _all_pairs_epochs(problem: Problem, lag: tuple[int, ...]) -> np.ndarray:
    n = problem.ranks
    d = np.full((n, n), UNREACHABLE, dtype=np.int64)
    np.fill_diagonal(d, 0)
    for r in problem.network.routes:
        d[r.src, r.dst] = min(d[r.src, r.dst], lag[r.index])
    for k in range(n):  # Floyd-Warshall; n is the number of GPUs
        d = np.minimum(d, d[:, k:k + 1] + d[k:k + 1, :])
    return d


# --- the state a window starts from --------------------------------------------------

@dataclass
class State:
    """Where chunks are (rank -> epoch from which it holds each commodity) and which
    link capacity earlier transfers already took."""

    avail: list[dict[int, int]]
    booked: dict[int, dict[int, float]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))

    @classmethod
    def initial(cls, problem: Problem) -> "State":
        return cls([{r: 0 for r in c.holders} for c in problem.commodities])

    def pending(self, problem: Problem, k: int) -> list[int]:
        """Demand ranks of commodity k that nothing has been sent to yet."""
        return [d for d in problem.commodities[k].demand if d not in self.avail[k]]

    def done(self, problem: Problem) -> bool:
        return all(not self.pending(problem, k) for k in range(len(problem.commodities)))

    def finish_epoch(self) -> int:
        return max((e for a in self.avail for e in a.values()), default=0)

    def apply(self, problem: Problem, grid: EpochGrid, transfers: list[Transfer]) -> None:
        net = problem.network
        for t in sorted(transfers, key=lambda t: t.step):
            r = net.routes[t.route]
            arrive = t.step + grid.lag[t.route]
            a = self.avail[t.commodity]
            if arrive < a.get(r.dst, UNREACHABLE):
                a[r.dst] = arrive
            for l in r.links:
                self.booked[l][t.step] += grid.hold[l]

    def fits(self, grid: EpochGrid, links: tuple[int, ...], k: int) -> bool:
        for l in links:
            w, hold = grid.window[l], grid.hold[l]
            b = self.booked.get(l)
            if b is None:
                continue
            for s in range(k - w + 1, k + 1):
                if sum(b.get(j, 0.0) for j in range(s, s + w)) + hold > w + 1e-9:
                    return False
        return True


# --- the TE-CCL flow model ----------------------------------------------------------

@dataclass
class FlowModel:
    model: Model
    x: dict[tuple[int, int, int], int]  # (commodity, route, epoch) -> column
    h: dict[tuple[int, int, int], int]  # (commodity, rank, epoch) -> column

    def transfers(self, values: np.ndarray) -> list[Transfer]:
        return [Transfer(c, r, k) for (c, r, k), j in sorted(self.x.items()) if values[j] > 0.5]

    def start_vector(self, problem: Problem, grid: EpochGrid, transfers: list[Transfer]) -> np.ndarray | None:
        """A full assignment from a plan (for warm starts); None if the plan leaves the model."""
        values = np.zeros(self.model.num_cols)
        arrival: dict[tuple[int, int], int] = {}
        for t in transfers:
            j = self.x.get((t.commodity, t.route, t.step))
            if j is None:
                return None
            values[j] = 1.0
            key = (t.commodity, problem.network.routes[t.route].dst)
            arrival[key] = min(arrival.get(key, UNREACHABLE), t.step + grid.lag[t.route])
        for (c, v, k), j in self.h.items():
            if arrival.get((c, v), UNREACHABLE) <= k:
                values[j] = 1.0
        return values


def build_flow_model(problem: Problem, grid: EpochGrid, state: State, first: int, last: int, *,
                     require_all: bool, integer: bool = True, relay_reward: float = 0.0,
                     amounts: Sequence[float] | None = None) -> FlowModel | None:
    """Departures in epochs [first, last); holdings tracked to `end` = last (require_all)
    or last + max lag. Returns None when some demand cannot arrive by `end`.

    `amounts` (a relaxation, with integer=False) lets commodity c stand for amounts[c]
    chunks with the same holders and demand: its flows and holdings range over
    [0, amounts[c]]."""
    net = problem.network
    dist = grid.dist
    end = last if require_all else last + grid.max_lag
    m = Model()
    x: dict[tuple[int, int, int], int] = {}
    h: dict[tuple[int, int, int], int] = {}
    link_terms: dict[tuple[int, int], list[tuple[int, float]]] = defaultdict(list)
    arrivals: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    n_ranks = problem.ranks
    for c, com in enumerate(problem.commodities):
        amount = 1.0 if amounts is None else float(amounts[c])
        avail = state.avail[c]
        pending = [d for d in com.demand if d not in avail]
        if not pending:
            continue
        start = {u: max(a, first) for u, a in avail.items()}
        earliest = np.full(n_ranks, UNREACHABLE, dtype=np.int64)
        for u, a in start.items():
            earliest = np.minimum(earliest, a + dist[u])
        to_target = dist[:, pending].min(axis=1)
        if require_all and any(earliest[d] > end for d in pending):
            return None
        # Epochs from the nearest current holder to each pending destination.
        closest = {t: int(min(dist[u, t] for u in avail)) for t in pending}
        for r in net.routes:
            u, w = r.src, r.dst
            if w in avail or earliest[u] >= last or to_target[w] >= UNREACHABLE:
                continue
            lag = grid.lag[r.index]
            if not require_all and w not in pending and not any(dist[w, t] < dist[u, t] for t in pending):
                continue  # rounds move chunks only toward their destinations
            k_hi = last - 1
            if require_all:
                k_hi = min(k_hi, end - lag - int(to_target[w]))
            for k in range(int(max(first, earliest[u])), k_hi + 1):
                j = m.add_var(0.0, amount, 0.0, integer)
                x[(c, r.index, k)] = j
                arrivals[(c, w, k + lag)].append(j)
                for l in r.links:
                    link_terms[(l, k)].append((j, grid.hold[l]))
        # Holdings of ranks that do not hold the chunk yet.
        for v in range(n_ranks):
            if v in avail or earliest[v] > end:
                continue
            reward_each = 1.0 if v in pending else 0.0
            for k in range(int(earliest[v]), end + 1):
                cost = reward_each
                if k == end and v not in pending and relay_reward > 0:
                    cost += relay_reward * sum(max(0, closest[t] - int(dist[v, t])) for t in pending)
                h[(c, v, k)] = m.add_var(0.0, amount, cost, False)
        for d in pending:
            if require_all:
                m.lo[h[(c, d, end)]] = amount
    # Holding: h[k] <= h[k-1] + arrivals usable at k.
    for (c, v, k), j in h.items():
        cols, vals = [j], [1.0]
        prev = h.get((c, v, k - 1))
        if prev is not None:
            cols.append(prev)
            vals.append(-1.0)
        for a in arrivals.get((c, v, k), ()):
            cols.append(a)
            vals.append(-1.0)
        m.add_row(cols, vals, -INF, 0.0)
    # Sending needs holding (every outgoing link may copy the same chunk).
    for (c, r, k), j in x.items():
        u = net.routes[r].src
        if u in state.avail[c]:
            continue
        m.add_row([j, h[(c, u, k)]], [1.0, -1.0], -INF, 0.0)
    # Capacity of every link over every window of epochs.
    by_link: dict[int, dict[int, list[tuple[int, float]]]] = defaultdict(dict)
    for (l, k), terms in link_terms.items():
        by_link[l][k] = terms
    for l, per_epoch in sorted(by_link.items()):
        w = grid.window[l]
        booked = state.booked.get(l, {})
        ks = sorted(per_epoch)
        starts = sorted({s for k in ks for s in range(k - w + 1, k + 1)})
        for s in starts:
            cols, vals = [], []
            used = 0.0
            for k in range(s, s + w):
                for j, hold in per_epoch.get(k, ()):
                    cols.append(j)
                    vals.append(hold)
                used += booked.get(k, 0.0)
            if cols and sum(vals) + used > w + 1e-9:
                m.add_row(cols, vals, -INF, w - used)
    # A small price on every transfer keeps useless copies out of the answer.
    eps = 0.5 / max(1, len(x))
    for j in x.values():
        m.cost[j] = -eps
    return FlowModel(m, x, h)


# --- a greedy schedule on the grid --------------------------------------------------

def greedy(problem: Problem, grid: EpochGrid, state: State, first: int = 0, last: int | None = None,
           max_epochs: int = 1_000_000, guide: "Guide | None" = None) -> list[Transfer]:
    """Epoch by epoch, every route takes the most useful chunks its sender holds and its
    links have room for. Updates `state`. Stops at `last` or when every demand is met.

    With a `guide` (a relaxation's flows), a route first takes the chunks the guide
    still owes it a whole transfer of by this epoch, then the usual most useful ones."""
    net = problem.network
    dist = grid.dist
    out: list[Transfer] = []
    n_com = len(problem.commodities)
    pending = [set(state.pending(problem, c)) for c in range(n_com)]
    k = first
    stop = last if last is not None else first + max_epochs
    while k < stop and any(pending):
        moved: list[Transfer] = []
        held_by: dict[int, list[int]] = defaultdict(list)
        for c in range(n_com):
            if pending[c]:
                for u, a in state.avail[c].items():
                    if a <= k:
                        held_by[u].append(c)
        for r in net.routes:
            u, w = r.src, r.dst
            cands = held_by.get(u)
            if not cands:
                continue
            lag = grid.lag[r.index]
            scored = []
            for c in cands:
                avail = state.avail[c]
                if w in avail:
                    continue
                owed = 0 if guide is None or not guide.owes(c, r.index, k) else -1
                if w in pending[c]:
                    scored.append((owed, 0, -len(pending[c]), c))
                    continue
                gain = 0
                for t in pending[c]:
                    best = min(max(a, k) - k + dist[v, t] for v, a in avail.items())
                    if lag + dist[w, t] <= best and lag + dist[w, t] < UNREACHABLE:
                        gain += 1
                if gain:
                    scored.append((owed, 1, -gain, c))
            scored.sort()
            for *_, c in scored:
                if not state.fits(grid, r.links, k):
                    break
                if guide is not None:
                    guide.take(c, r.index)
                t = Transfer(c, r.index, k)
                state.apply(problem, grid, [t])
                moved.append(t)
                pending[c].discard(w)
        out.extend(moved)
        k += 1
    if last is None and any(pending):
        raise RuntimeError("greedy schedule did not finish")
    return out


class Guide:
    """How much of each group's flow a relaxation sends on each route by each epoch, and
    how much of it whole transfers have taken: the relaxation's answer rounded as the
    greedy schedule goes (collc.synthesis.lp)."""

    def __init__(self, group_of: Sequence[int], flow: Mapping[tuple[int, int], Sequence[tuple[int, float]]]):
        self.group_of = group_of  # commodity -> group
        # (group, route) -> [(epoch, flow)], epochs ascending
        self.flow = flow
        self.taken: dict[tuple[int, int], int] = defaultdict(int)

    def owes(self, commodity: int, route: int, epoch: int) -> bool:
        key = (self.group_of[commodity], route)
        sent = sum(f for k, f in self.flow.get(key, ()) if k <= epoch)
        return sent - self.taken[key] >= 0.5

    def take(self, commodity: int, route: int) -> None:
        self.taken[(self.group_of[commodity], route)] += 1
