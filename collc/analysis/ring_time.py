"""The ring AllReduce baseline's simulated time, on arrays.

The report compares a schedule with NCCL's ring: the standard library's `ring`
AllReduce (algorithms/ring.coll), timed by `simulate` under fifo sharing. At 1,024
GPUs building that schedule (three million ops) and simulating it op by op took a
few percent of a compile. `ring_allreduce_time` gives the same number, to the bit, from
the ring order and the paths between ring neighbours, one batch of ops at a time, where
the following hold (else None, and the caller builds and simulates the schedule):

- the collective is the standard AllReduce with one chunk per rank, on two or more
  ranks;
- the paths of the ring's hops (each rank to the next) share no link, so a link only
  ever carries the transfers of one hop;
- on each hop the ops' steps (one more than their latest dependency's) strictly
  increase, so fifo sharing serves the hop's transfers in the order they are listed,
  and no rank sends or receives two transfers in one step (the schedule then is timed
  with fifo sharing only, see `collc.driver.baseline_time`).

Why the numbers are the same. ring.coll's ops, in id order: for each reduce-scatter
step s and ring position p, a local copy of the receiver's own block into its output
then a reduction of the sender's partial sum into it; then for each all-gather step
and position, a copy of the finished block to the next rank. An op depends on the last
writer of its source slot and of its destination slot and on every reader of its
destination since its last write (`frontend.stdlib_builders`): `_Slots` keeps, per
output slot, the finish time and the step of the last writer and the latest finish and
step of its readers since, so an op's readiness is the max over exactly the finish
times `simulate` takes the max over (max is exact in floating point, in any order). Ops
of one step and phase touch distinct slots (no op's source is another's destination),
so a whole batch is updated at once. A transfer starts at max(ready, the time its path's
links are free); under fifo each link of the hop is free at t + b / capacity after the
hop's previous transfer started at t, and the latest of those is t + b / bottleneck
(b / c falls as c grows and t + x rises with x, both rounded monotonically; the
bottleneck is the smallest capacity itself). The finish is computed as `simulate`
writes it, (t + latency) + b / bottleneck, in float64 as Python's floats are. Local ops
take no time (`simulate` is asked without a local bandwidth).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from collc.analysis.simulate import Path, Router
from collc.diagnostics import CollcError
from collc.ir.collective import Collective, CollectiveKind, standard
from collc.ir.topology import Topology


def ring_allreduce_time(topology: Topology, collective: Collective, size_bytes: int,
                        ring: Sequence[int]) -> float | None:
    """The fifo-simulated time of the stdlib ring AllReduce along `ring` (the ring
    `frontend.find_ring` gives the algorithm), or None where the module's conditions
    do not hold."""
    n = collective.ranks
    if (n < 2 or collective.kind is not CollectiveKind.ALLREDUCE or collective.chunks != 1
            or topology.num_ranks != n or len(ring) != n or sorted(ring) != list(range(n))
            or collective != standard(CollectiveKind.ALLREDUCE, n)):
        return None
    order = np.asarray(ring, dtype=np.int64)
    paths = _hop_paths(topology, order)
    if paths is None:
        return None
    b = collective.slot_bytes(size_bytes) * 1  # an op's bytes, as `simulate` counts them (count 1)
    latency = np.array([p.latency for p in paths], dtype=np.float64)
    hold = np.array([b / p.bottleneck for p in paths], dtype=np.float64)  # per hop p: ring[p] -> ring[p + 1]
    slots = _Slots(n)
    hops = _Hops(n)
    p = np.arange(n, dtype=np.int64)
    src, dst = order, np.roll(order, -1)
    for s in range(n - 1):  # reduce-scatter
        block = order[(p - 1 - s) % n]
        # copy in[dst][block] -> out[dst][block]: reads an input slot (never written)
        ready, step = slots.before(None, dst, block)
        slots.written(dst, block, ready + 0.0, step)
        # reduce (in or out)[src][block] -> out[dst][block]
        ready, step = slots.before(None if s == 0 else src, dst, block)
        finish = hops.transfer(ready, step, latency, hold)
        if finish is None:
            return None
        if s > 0:
            slots.read(src, block, finish, step)
        slots.written(dst, block, finish, step)
    for s in range(n - 1):  # all-gather: copy out[src][block] -> out[dst][block]
        block = order[(p - s) % n]
        ready, step = slots.before(src, dst, block)
        finish = hops.transfer(ready, step, latency, hold)
        if finish is None:
            return None
        slots.read(src, block, finish, step)
        slots.written(dst, block, finish, step)
    return float(max(slots.latest, 0.0))


def _hop_paths(topology: Topology, order: np.ndarray) -> list[Path] | None:
    """The default path of every hop, or None where one is missing or two share a link."""
    router = Router(topology)
    paths = []
    try:
        for a, c in zip(order.tolist(), np.roll(order, -1).tolist()):
            path = router.path_between(a, c)
            if path is None:
                return None
            paths.append(path)
    except CollcError:  # a link without capacity: the schedule's simulation says so
        return None
    links = [l for path in paths for l in path.links]
    return paths if len(set(links)) == len(links) else None


class _Slots:
    """Per output slot (rank, block): the finish and step of its last writer and the
    latest finish and step of its readers since that write (-1 steps: none; a finish
    of 0.0 where there is none changes no max, as `simulate` starts from 0.0)."""

    def __init__(self, n: int):
        self.written_at = np.zeros((n, n), dtype=np.float64)
        self.written_step = np.full((n, n), -1, dtype=np.int64)
        self.read_at = np.zeros((n, n), dtype=np.float64)
        self.read_step = np.full((n, n), -1, dtype=np.int64)
        self.latest = 0.0

    def before(self, src: np.ndarray | None, dst: np.ndarray, block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Ready time and step of a batch of ops reading out[src][block] (None: an input
        slot) and writing out[dst][block]."""
        ready = np.maximum(self.written_at[dst, block], self.read_at[dst, block])
        last = np.maximum(self.written_step[dst, block], self.read_step[dst, block])
        if src is not None:
            ready = np.maximum(ready, self.written_at[src, block])
            last = np.maximum(last, self.written_step[src, block])
        ready = np.maximum(ready, 0.0)
        return ready, last + 1  # no dependency (-1): step 0

    def read(self, src: np.ndarray, block: np.ndarray, finish: np.ndarray, step: np.ndarray) -> None:
        self.read_at[src, block] = np.maximum(self.read_at[src, block], finish)
        self.read_step[src, block] = np.maximum(self.read_step[src, block], step)

    def written(self, dst: np.ndarray, block: np.ndarray, finish: np.ndarray, step: np.ndarray) -> None:
        self.written_at[dst, block] = finish
        self.written_step[dst, block] = step
        self.read_at[dst, block] = 0.0
        self.read_step[dst, block] = -1
        self.latest = max(self.latest, float(finish.max()))


class _Hops:
    """Per hop: when its links are next free, and the step of its last transfer."""

    def __init__(self, n: int):
        self.free = np.zeros(n, dtype=np.float64)
        self.step = np.full(n, -1, dtype=np.int64)

    def transfer(self, ready: np.ndarray, step: np.ndarray, latency: np.ndarray,
                 hold: np.ndarray) -> np.ndarray | None:
        """Finish times of one transfer on every hop (hop p's at index p), or None where
        some hop's steps do not increase (fifo would serve it out of list order)."""
        if (step <= self.step).any():
            return None
        start = np.maximum(ready, self.free)
        self.free = start + hold
        self.step = step
        return (start + latency) + hold
