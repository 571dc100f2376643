"""Channels and threadblocks for the halves of a schedule.

A connection is (sender rank, receiver rank, channel); the executor gives each one FIFO,
so all messages of a connection leave from one threadblock of the sender and arrive in
one threadblock of the receiver, and a threadblock has one send peer and one receive
peer. The plan:

1. *Chains*: a receive and the send that forwards exactly what it received are a fusion
   candidate (one `rcs`/`rrs`/`rrcs` step); candidates link transfers into chains (the
   path of a chunk through a ring, say). A chain stays on one channel so that its
   receives and forwards can share threadblocks.
2. *Channels*: chains are placed one by one on the channel where the busiest connection
   they use is least loaded, keeping at most 32 send and 32 receive peers per rank and
   channel. `msccl-threadblocks` tries channel counts from the fewest that could fit
   `max_steps` upwards.
3. *Threadblocks*: on each rank and channel, receive connections are paired with send
   connections by a maximum-weight matching, the weight being the fusion candidates
   between them; unmatched connections get a threadblock of their own. Local ops join
   the threadblock of the half they wait for last (no cross-threadblock wait), or a
   threadblock without peers.

Where that spread gives a GPU more threadblocks than can be resident at once (every
connection of a GPU with dozens of peers, on every channel), `plan_compact` packs
instead: a heavy connection is cut, in time order, into slices that each fill a
threadblock beside a light connection of the other direction, the slices of one
connection on distinct channels, and on each rank and channel send and receive
connections are paired by size. A GPU then has about as many threadblocks as it has
peers, plus one per extra slice of its heaviest connections (AllToAll on 512 H100
GPUs: 79 rather than 256).
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from itertools import chain, repeat
from collections.abc import Sequence
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from collc.backends.msccl_xml import slots
from collc.backends.msccl_xml.program import Half, HalfKind, IntPairs, LStep, LThreadblock, key_places
from collc.diagnostics import CollcError

MAX_CHANNELS = 32  # NCCL's MAXCHANNELS
MAX_TBS_PER_CHANNEL = 32  # MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL
# Made once: np.iinfo builds an object per call (5 us), and `_ChannelTable.best` runs
# once per chain, millions of times at 1,024 ranks.
_INT64_MAX = int(np.iinfo(np.int64).max)


def fusion_candidates(halves: tuple[Half, ...], preds: tuple[tuple[int, ...], ...]) -> list[tuple[int, int]]:
    """(receive half, send half) pairs where the send forwards exactly what the receive stored."""
    out = []
    for b in halves:
        if b.kind is not HalfKind.SEND:
            continue
        for p in preds[b.id]:
            a = halves[p]
            if a.kind.receives and a.dst == b.src and a.count == b.count:
                out.append((a.id, b.id))
    return out


@dataclass
class _Tb:
    send: int
    recv: int
    chan: int
    halves: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class TbPlan:
    channels_per_instance: int
    tbs: tuple[tuple[LThreadblock, ...], ...]  # per rank
    # The longest threadblock if every fusion candidate inside one is fused and no nop
    # step is needed: a lower bound on its final length.
    least_steps: int
    longest: str


def check_counts(instances: int, channels: int) -> None:
    if instances < 1 or instances > MAX_CHANNELS:
        raise CollcError(f"msccl-threadblocks: instances={instances}; MSCCL has 1 to {MAX_CHANNELS} channels, "
                         "and every instance needs its own")
    if channels < 0 or channels * instances > MAX_CHANNELS:
        raise CollcError(f"msccl-threadblocks: channels={channels} x instances={instances} needs "
                         f"{channels * instances} channels; MSCCL has at most {MAX_CHANNELS}")


def channel_counts(arrays: HalfArrays, instances: int, channels: int, max_steps: int) -> list[int]:
    """Channel counts (per instance) worth trying, fewest first: the given one, or from
    the least that could hold the busiest connection up to all there are."""
    limit = MAX_CHANNELS // instances
    if channels:
        return [channels]
    sends = (arrays.kind == slots.SEND) & (arrays.instance == 0)
    _, per_connection = np.unique(arrays.rank[sends] * (1 + int(arrays.peer.max(initial=0))) + arrays.peer[sends],
                                  return_counts=True)
    busiest = int(per_connection.max(initial=0))
    return list(range(max(1, min(limit, -(-busiest // max(1, max_steps)))), limit + 1))


@dataclass(frozen=True)
class HalfArrays:
    """The fields of the halves the planning reads, one integer array each (kinds as
    `slots.SEND` ... codes)."""

    kind: np.ndarray
    rank: np.ndarray
    peer: np.ndarray
    position: np.ndarray
    piece: np.ndarray
    instance: np.ndarray


_KIND_CODE = {HalfKind.SEND: slots.SEND, HalfKind.RECV: slots.RECV, HalfKind.RECV_REDUCE: slots.RECV_REDUCE,
              HalfKind.COPY: slots.COPY, HalfKind.REDUCE: slots.REDUCE}


def half_arrays(halves: Sequence[Half]) -> HalfArrays:
    """HalfArrays of Half objects (split_schedule gives them directly)."""
    rows = [(_KIND_CODE[h.kind], h.rank, h.peer, h.key.position, h.key.piece, h.instance) for h in halves]
    table = np.array(rows, dtype=np.int64).reshape(len(rows), 6)
    return HalfArrays(*(table[:, k].copy() for k in range(6)))


class PlanCache:
    """What does not depend on the channel count, found once for all the counts tried:
    the chains, and the matchings of `_pair` (see `_matching`)."""

    def __init__(self, halves: tuple[Half, ...], candidates: Sequence[tuple[int, int]],
                 places: Sequence[int] | None = None, arrays: HalfArrays | None = None,
                 matchings: dict[tuple, list[tuple[int, int]]] | None = None):
        self.places = key_places(halves) if places is None else places
        self.place_array = np.asarray(self.places, dtype=np.int64)
        if isinstance(self.places, np.ndarray):
            self.places = self.place_array  # read one at a time only for local halves
        cols = half_arrays(halves) if arrays is None else arrays
        kinds = cols.kind.tolist()
        # The one-half step of each half, as `_finish` puts it in a threadblock (every
        # channel count tried gives each half this same step).
        step_of = [_STEP_TYPE[k] for k in (HalfKind.SEND, HalfKind.RECV, HalfKind.RECV_REDUCE, HalfKind.COPY,
                                           HalfKind.REDUCE)]
        # Built at C level (four million at 1,024 GPUs): (type, (h,), no wait, no hasdep).
        rows = zip(map(step_of.__getitem__, kinds), zip(range(len(kinds))), repeat(None), repeat(False))
        self.single_steps = list(map(tuple.__new__, repeat(LStep), rows))
        self.matchings: dict[tuple, list[tuple[int, int]]] = {} if matchings is None else matchings
        # Every half of a transfer, in order: its instance.
        moving = np.flatnonzero(cols.peer >= 0)
        self.instance = cols.instance[moving]
        self.halves = len(cols.kind)
        local = np.flatnonzero(cols.peer < 0)
        local = local[np.argsort(self.place_array[local], kind="stable")]
        self.local = local.tolist()
        # The rank and instance of each local half, in that order, and (once asked for)
        # its predecessors: `_place_locals` reads them for every channel count tried, and
        # building each local half as a `Half` for three fields took 12% of the compile of
        # a ReduceScatter on dgx_h100(nodes=16) to MSCCL XML.
        self.local_rank = cols.rank[local].tolist()
        self.local_instance = cols.instance[local].tolist()
        self._local_preds: tuple[object, list[tuple[int, ...]]] | None = None
        self.moving_arrays = (moving, cols.rank[moving], cols.peer[moving], cols.kind[moving] == slots.SEND)
        # Fusion candidates (receive, send), and (rank, receive peer, send peer) of each.
        if isinstance(candidates, IntPairs):
            ca, cb = candidates.first, candidates.second
        else:
            cand = np.array(candidates, dtype=np.int64).reshape(len(candidates), 2)
            ca, cb = cand[:, 0], cand[:, 1]
        self.candidate_arrays = (ca, cb, cols.rank[ca], cols.peer[ca], cols.peer[cb])
        # Transfers: the sends of instance 0, numbered in half order, (position, piece)
        # each; and connections, (sender, receiver), numbered in order of first use.
        sends0 = np.flatnonzero((cols.kind == slots.SEND) & (cols.instance == 0))
        senders, receivers = cols.rank[sends0], cols.peer[sends0]
        self.transfer_count = len(sends0)
        width = 1 + int(max(senders.max(initial=0), receivers.max(initial=0)))
        _, first, conn = np.unique(senders * width + receivers, return_index=True, return_inverse=True)
        renumber = np.empty(len(first), dtype=np.int64)
        renumber[np.argsort(first, kind="stable")] = np.arange(len(first))
        self.conn = renumber[conn.reshape(-1)]  # connection number of each transfer
        order = np.argsort(first, kind="stable")
        self.conn_number = dict(zip(zip(senders[first[order]].tolist(), receivers[first[order]].tolist()),
                                    range(len(first))))
        self.ranks = 1 + max((max(c) for c in self.conn_number), default=0)
        # The transfer of each moving half (by its (position, piece)).
        self.transfer_of_moving = _transfer_numbers(cols, sends0, moving)
        # Chains, as lists of transfer numbers.
        self.chains, chain_of = _chains(cols, sends0, ca, cb, self.place_array)
        self.chain_uses = _chain_uses(self.chains, chain_of, self.conn, senders.tolist(), receivers.tolist())

    def local_preds(self, preds: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
        """The predecessors of each local half (in `local`'s order) in `preds`."""
        if self._local_preds is None or self._local_preds[0] is not preds:
            self._local_preds = (preds, [tuple(preds[h]) for h in self.local])
        return self._local_preds[1]


def _transfer_numbers(cols: HalfArrays, sends0: np.ndarray, halves: np.ndarray) -> np.ndarray:
    """The number of the transfer (a send of instance 0, as `sends0` lists them) with
    the (position, piece) of each of `halves`."""
    width = 1 + int(cols.piece.max(initial=0))
    keys = cols.position[sends0] * width + cols.piece[sends0]
    by_key = np.argsort(keys, kind="stable")
    return by_key[np.searchsorted(keys[by_key], cols.position[halves] * width + cols.piece[halves])]


def _chains(cols: HalfArrays, sends0: np.ndarray, ca: np.ndarray, cb: np.ndarray, places: np.ndarray
            ) -> tuple[list[list[int]], np.ndarray]:
    """Transfers of instance 0 (numbered as `sends0` lists their sends) grouped into
    chains in time order, and the chain of each transfer in the flattened order.

    The chains are the connected components of the candidate links, found by hooking
    roots and halving paths over arrays (a few rounds: each halves the longest path)."""
    count = len(sends0)
    if count == 0:
        return [], np.zeros(0, dtype=np.int64)
    linked = cols.instance[ca] == 0
    u = _transfer_numbers(cols, sends0, ca[linked])
    v = _transfer_numbers(cols, sends0, cb[linked])
    parent = np.arange(count, dtype=np.int64)
    while True:
        pu, pv = parent[u], parent[v]
        differ = pu != pv
        if not differ.any():
            break
        np.minimum.at(parent, np.maximum(pu, pv)[differ], np.minimum(pu, pv)[differ])
        while True:  # point every transfer at its root
            up = parent[parent]
            if (up == parent).all():
                break
            parent = up
    # The place of each transfer's send half: sends differ from each other only in the
    # part of the key both ends share (`HalfKey.message`), so this orders the messages.
    message = places[sends0]
    first = np.full(count, _INT64_MAX, dtype=np.int64)
    np.minimum.at(first, parent, message)
    order = np.lexsort((message, first[parent]))  # chains by their first message, each in time order
    roots = parent[order]
    bounds = np.flatnonzero(np.r_[True, roots[1:] != roots[:-1], True])
    flat = order.tolist()
    chains = [flat[lo:hi] for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist())]
    chain_of = np.repeat(np.arange(len(chains), dtype=np.int64), np.diff(bounds))
    return chains, chain_of


def _chain_uses(chains: list[list[int]], chain_of: np.ndarray, conn: np.ndarray, senders: list[int],
                receivers: list[int]) -> list[_Uses]:
    """The connections each chain uses, in order of first use, with its message count."""
    if not chains:
        return []
    flat = np.fromiter((t for c in chains for t in c), np.int64, len(chain_of))
    k = conn[flat]
    width = 1 + int(k.max(initial=0))
    _, first, counts = np.unique(chain_of * width + k, return_index=True, return_counts=True)
    order = np.argsort(first, kind="stable")
    first, counts = first[order], counts[order]
    owner = chain_of[first]
    bounds = np.searchsorted(owner, np.arange(len(chains) + 1)).tolist()
    ts = flat[first].tolist()
    ks = k[first].tolist()
    ns = counts.tolist()
    items = [((senders[t], receivers[t]), i, n) for t, i, n in zip(ts, ks, ns)]
    return [_Uses(items[lo:hi]) for lo, hi in zip(bounds, bounds[1:])]


@dataclass(frozen=True)
class Crowded:
    """A placement that gives GPU `rank` more threadblocks (`threadblocks`) than the
    caller allows, found as soon as its threadblocks are laid out."""

    rank: int
    threadblocks: int


def plan_threadblocks(halves: tuple[Half, ...], preds: tuple[tuple[int, ...], ...], ranks: int, instances: int,
                      c: int, max_steps: int, candidates: Sequence[tuple[int, int]] | None = None,
                      cache: PlanCache | None = None, most_threadblocks: int = 0) -> TbPlan | Crowded | None:
    """Threadblocks for every rank with `c` channels per instance, or None when the
    per-channel limits cannot hold. `candidates`: the halves' fusion candidates, where
    the caller has them (they do not depend on the channel count); `cache`: a PlanCache
    of these halves and candidates, where the caller tries several counts. Where a GPU
    gets more than `most_threadblocks` (0: any number), the first such GPU is returned
    as `Crowded` before the threadblocks are ordered and measured (of a spread placement
    on a GPU with dozens of peers that is dropped for a packed one, a fifth of its cost)."""
    if candidates is None:
        candidates = fusion_candidates(halves, preds)
    if cache is None:
        cache = PlanCache(halves, candidates)
    base = _assign_channels(cache, c)
    if base is None:
        return None
    chans = base[cache.transfer_of_moving]
    if instances > 1:
        chans = chans + cache.instance * c
    per_rank = _build(preds, chans, ranks, c, max_steps, cache)
    if per_rank is None:
        return None
    if most_threadblocks:
        most, first = max((len(tbs), -r) for r, tbs in enumerate(per_rank))
        if most > most_threadblocks:
            return Crowded(-first, most)
    rank, steps, tb = _largest(per_rank, cache)
    return TbPlan(c, tuple(_finish(tbs, cache.place_array, cache.single_steps) for tbs in per_rank), steps,
                  f"GPU {rank}'s threadblock (send {tb.send}, recv {tb.recv}, channel {tb.chan})")


def plan_compact(halves: tuple[Half, ...], preds: tuple[tuple[int, ...], ...], ranks: int, instances: int,
                 c: int, slice_steps: int, max_steps: int, cache: PlanCache) -> TbPlan | None:
    """Threadblocks for every rank with `c` channels per instance, packed: heavy
    connections in slices (`_assign_slices`), and on each rank and channel the send and
    receive slices paired by size (`_pair_by_size`) to fill at most `max_steps` (the
    runtime's limit, or less where fusing and nop steps made a threadblock longer than
    its halves); None when a connection needs more than `c` slices or a rank and channel
    would hold more than MAX_TBS_PER_CHANNEL threadblocks."""
    base = _assign_slices(cache, c, slice_steps, max_steps)
    if base is None:
        return None
    chans = base[cache.transfer_of_moving]
    if instances > 1:
        chans = chans + cache.instance * c
    per_rank = _build(preds, chans, ranks, c, max_steps, cache, compact=True)
    if per_rank is None:
        return None
    rank, steps, tb = _largest(per_rank, cache)
    return TbPlan(c, tuple(_finish(tbs, cache.place_array, cache.single_steps) for tbs in per_rank), steps,
                  f"GPU {rank}'s threadblock (send {tb.send}, recv {tb.recv}, channel {tb.chan})")


def _assign_slices(cache: PlanCache, c: int, slice_steps: int, max_steps: int) -> np.ndarray | None:
    """Channel of every transfer (of instance 0) for `plan_compact`, or None.

    Connections are light (at most slice_steps / 4 messages), middling (at most
    slice_steps) or heavy. A heavy connection of m messages is cut into
    ceil(m / (max_steps - light)) slices of consecutive messages (time order) of
    near-equal size, each to share a threadblock with a light connection; the others
    stay whole. The slices of a connection take channels of their own. Slices are placed
    busiest connection first, each on the channel where it adds the fewest threadblocks
    to its two ranks (`_threadblocks` counts a rank and channel's), then where those
    ranks have the fewest slices, then the lowest channel."""
    conn = cache.conn
    count = len(conn)
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    moving, _, _, is_send = cache.moving_arrays
    sends0 = is_send & (cache.instance == 0)
    place = np.zeros(count, dtype=np.int64)
    place[cache.transfer_of_moving[sends0]] = cache.place_array[moving[sends0]]
    order = np.lexsort((place, conn))
    messages = np.bincount(conn, minlength=len(cache.conn_number))
    light = max(1, slice_steps // 4)
    heavy_size = max(1, max_steps - light)
    kind = np.where(messages <= light, LIGHT, np.where(messages <= slice_steps, MIDDLING, HEAVY))
    slices = np.where(kind == HEAVY, -(-messages // heavy_size), 1)
    if int(slices.max(initial=0)) > c:
        return None
    start = np.r_[0, np.cumsum(messages)[:-1]]
    index = np.empty(count, dtype=np.int64)
    index[order] = np.arange(count, dtype=np.int64) - np.repeat(start, messages)
    slice_of = index * slices[conn] // np.maximum(messages[conn], 1)

    ends = np.zeros((len(cache.conn_number), 2), dtype=np.int64)
    for (a, b), k in cache.conn_number.items():
        ends[k] = (a, b)
    # Slices per rank, channel, kind and direction (0 send, 1 receive).
    table = np.zeros((cache.ranks, c, 3, 2), dtype=np.int64)
    channel_of = np.full((len(messages), int(slices.max(initial=1))), -1, dtype=np.int64)
    limit = MAX_TBS_PER_CHANNEL
    channels = np.arange(c)
    for k in sorted(range(len(messages)), key=lambda k: (-int(messages[k]), k)):
        a, b = ends[k].tolist()
        what = int(kind[k])
        free = np.ones(c, dtype=bool)
        for i in range(int(slices[k])):
            ta, tb = table[a], table[b]
            before = _threadblocks(ta) + _threadblocks(tb)
            ta[:, what, 0] += 1
            tb[:, what, 1] += 1
            after_a, after_b = _threadblocks(ta), _threadblocks(tb)
            ta[:, what, 0] -= 1
            tb[:, what, 1] -= 1
            ok = free & (after_a <= limit) & (after_b <= limit)
            if not ok.any():
                return None
            added = after_a + after_b - before
            load = ta[:, :, 0].sum(axis=1) + tb[:, :, 1].sum(axis=1)
            key = np.lexsort((channels, load, added + np.where(ok, 0, 1 << 30)))
            ch = int(key[0])
            channel_of[k, i] = ch
            free[ch] = False
            ta[ch, what, 0] += 1
            tb[ch, what, 1] += 1
    return channel_of[conn, slice_of]


LIGHT, MIDDLING, HEAVY = 0, 1, 2


def _threadblocks(counts: np.ndarray) -> np.ndarray:
    """Threadblocks a rank needs per channel, from its slices (channel x kind x
    direction, see `_assign_slices`): each heavy slice takes one, shared with a light
    slice of the other direction where there is one; the other slices pair up."""
    hs, hr = counts[:, HEAVY, 0], counts[:, HEAVY, 1]
    ls, lr = counts[:, LIGHT, 0], counts[:, LIGHT, 1]
    ms, mr = counts[:, MIDDLING, 0], counts[:, MIDDLING, 1]
    with_send = np.minimum(hs, lr)
    with_recv = np.minimum(hr, ls)
    return hs + hr + np.maximum(ms + ls - with_recv, mr + lr - with_send)


def _assign_channels(cache: PlanCache, c: int) -> np.ndarray | None:
    """Channel of every transfer (of instance 0), or None when the peer limits cannot hold.

    Each chain goes to the channel where its busiest connection would carry the fewest
    messages (the lowest channel on a tie) among those that keep every rank within
    MAX_TBS_PER_CHANNEL send and receive peers. A chain that fits no channel whole (in
    a large cluster one chunk's chain can fan out from a rank to more peers than a
    channel holds) is placed one connection at a time, by the same rule: its forwards
    across two channels then do not fuse, which costs steps, not correctness."""
    table = _ChannelTable(c, cache.ranks, len(cache.conn_number))
    channel = np.zeros(cache.transfer_count, dtype=np.int64)
    for chain, uses in zip(cache.chains, cache.chain_uses):
        best = table.best(uses)
        if best >= 0:
            table.add(uses, best)
            channel[chain] = best
            continue
        if len(uses.items) == 1:
            return None
        # The chain's transfers grouped by connection once: at 1,024 GPUs one chunk's
        # chain has about a thousand connections and as many transfers, and scanning
        # the chain per connection made this quadratic.
        members = np.asarray(chain, dtype=np.int64)
        conns = cache.conn[members]
        order = np.argsort(conns, kind="stable")
        sorted_conns = conns[order]
        for use in uses.items:
            one = _Uses([use])
            best = table.best(one)
            if best < 0:
                return None
            table.add(one, best)
            lo, hi = np.searchsorted(sorted_conns, (use[1], use[1] + 1))
            channel[members[order[lo:hi]]] = best
    return channel


class _Uses:
    """The connections a chain uses, ((sender, receiver), connection number, messages)
    each, and what `_ChannelTable` asks of them. Only the items are kept (a chain per
    transfer or chunk: a million at 1,024 GPUs, most of one connection): the arrays
    the table weighs a long chain with are made when it asks."""

    __slots__ = ("items",)

    def __init__(self, items: list[tuple[tuple[int, int], int, int]]):
        self.items = items

    def arrays(self) -> tuple[np.ndarray, ...]:
        """(connection numbers, messages, senders, receivers each sends to, receivers,
        senders each receives from): the chain's own peers count too, since it may add
        several to one rank."""
        to, came = self.to, self.came
        return (np.array([i for _, i, _ in self.items], dtype=np.int64),
                np.array([n for _, _, n in self.items], dtype=np.int64),
                np.array(list(to), dtype=np.int64), np.array([len(v) for v in to.values()], dtype=np.int64),
                np.array(list(came), dtype=np.int64), np.array([len(v) for v in came.values()], dtype=np.int64))

    # The peers themselves, by rank, are asked for only by the exact test (`_fits`) and
    # the weighing of short chains.
    @property
    def to(self) -> dict[int, list[int]]:
        """Sender -> the receivers it sends to in this chain, in order of first use."""
        out: dict[int, list[int]] = {}
        for (a, b), _, _ in self.items:
            out.setdefault(a, []).append(b)
        return out

    @property
    def came(self) -> dict[int, list[int]]:
        """Receiver -> the senders it receives from in this chain, in order of first use."""
        out: dict[int, list[int]] = {}
        for (a, b), _, _ in self.items:
            out.setdefault(b, []).append(a)
        return out


# A chain whose connections times the channels are at most this many is weighed one
# channel and connection at a time: numpy's cost per call (tens of microseconds a chain)
# is most of the work for the one-connection chains of a rail AllToAll (a million at
# 1,024 GPUs), while a chunk's chain of a thousand connections is weighed on arrays.
SCALAR_WEIGHING = 32


class _ChannelTable:
    """Per channel: messages per connection, and each rank's send and receive peers.

    The loads and peer counts are arrays (channel x connection, channel x rank), so that
    a chain is weighed against every channel at once; the peer sets themselves are kept
    for the exact test where the counts alone cannot decide."""

    def __init__(self, c: int, ranks: int, connections: int):
        self.load = np.zeros((c, connections), dtype=np.int64)
        self.send_count = np.zeros((c, ranks), dtype=np.int64)
        self.recv_count = np.zeros((c, ranks), dtype=np.int64)
        self.send_peers: list[dict[int, set[int]]] = [{} for _ in range(c)]
        self.recv_peers: list[dict[int, set[int]]] = [{} for _ in range(c)]
        # The same counts as lists of Python ints, for the scalar weighing: a NumPy
        # element read and its arithmetic cost several times a list's, and the short
        # chains (about a million at 1,024 GPUs) are weighed element by element.
        self.load_rows = [[0] * connections for _ in range(c)]
        self.send_rows = [[0] * ranks for _ in range(c)]
        self.recv_rows = [[0] * ranks for _ in range(c)]

    def best(self, uses: _Uses) -> int:
        """The channel for the connections `uses`, -1 if none has room; the lowest
        channel among the least loaded."""
        if len(uses.items) * len(self.load) <= SCALAR_WEIGHING:
            return self._best_scalar(uses)
        limit = MAX_TBS_PER_CHANNEL
        ids, messages, senders, new_receivers, receivers, new_senders = uses.arrays()
        # Counting every new peer as new to its rank decides most channels at once; the
        # exact test (which knows the old peers) runs only where that says no.
        fits = ((self.send_count[:, senders] + new_receivers <= limit).all(axis=1)
                & (self.recv_count[:, receivers] + new_senders <= limit).all(axis=1))
        if not fits.all():
            to, came = uses.to, uses.came
            for ch in np.flatnonzero(~fits).tolist():
                fits[ch] = _fits(self.send_peers[ch], to, limit) and _fits(self.recv_peers[ch], came, limit)
            if not fits.any():
                return -1
        cost = (self.load[:, ids] + messages).max(axis=1)
        cost[~fits] = _INT64_MAX
        return int(np.argmin(cost))  # the first of the cheapest

    def _best_scalar(self, uses: _Uses) -> int:
        """`best` for a short chain, channel by channel: the same counting test, exact
        test and choice."""
        limit = MAX_TBS_PER_CHANNEL
        items = uses.items
        if len(items) == 1:
            return self._best_one(items[0])
        to, came = uses.to, uses.came
        best, best_cost = -1, 0
        for ch, (send_count, recv_count, load) in enumerate(zip(self.send_rows, self.recv_rows, self.load_rows)):
            if not (all(send_count[a] + len(bs) <= limit for a, bs in to.items())
                    and all(recv_count[b] + len(as_) <= limit for b, as_ in came.items())):
                if not (_fits(self.send_peers[ch], to, limit) and _fits(self.recv_peers[ch], came, limit)):
                    continue
            cost = max(load[i] + n for _, i, n in items)
            if best < 0 or cost < best_cost:
                best, best_cost = ch, cost
        return best

    def _best_one(self, item: tuple[tuple[int, int], int, int]) -> int:
        """`_best_scalar` for a chain of one connection (most chains of a rail ring or
        AllToAll): the sender gains at most one peer, the receiver one."""
        limit = MAX_TBS_PER_CHANNEL
        (a, b), i, n = item
        best, best_cost = -1, 0
        for ch, (send_count, recv_count, load) in enumerate(zip(self.send_rows, self.recv_rows, self.load_rows)):
            if send_count[a] >= limit or recv_count[b] >= limit:
                # Full by the counts: it still fits where the peer is an old one.
                if not (_fits(self.send_peers[ch], {a: [b]}, limit) and _fits(self.recv_peers[ch], {b: [a]}, limit)):
                    continue
            cost = load[i] + n
            if best < 0 or cost < best_cost:
                best, best_cost = ch, cost
        return best

    def add(self, uses: _Uses, ch: int) -> None:
        sends, recvs, load = self.send_peers[ch], self.recv_peers[ch], self.load[ch]
        send_count, recv_count = self.send_count[ch], self.recv_count[ch]
        load_row, send_row, recv_row = self.load_rows[ch], self.send_rows[ch], self.recv_rows[ch]
        for (a, b), i, n in uses.items:
            load[i] += n
            load_row[i] += n
            peers = sends.setdefault(a, set())
            if b not in peers:
                peers.add(b)
                send_count[a] += 1
                send_row[a] += 1
            peers = recvs.setdefault(b, set())
            if a not in peers:
                peers.add(a)
                recv_count[b] += 1
                recv_row[b] += 1


def _fits(peers: dict[int, set[int]], new: dict[int, list[int]], limit: int) -> bool:
    """Whether every rank keeps within `limit` peers once it also has those of `new`."""
    for rank, more in new.items():
        have = peers.get(rank)
        if have is None:
            if len(more) > limit:
                return False
        elif len(have) + len(more) > limit and len(have) + sum(1 for p in more if p not in have) > limit:
            return False
    return True


def _build(preds: tuple[tuple[int, ...], ...], chans: list[int], ranks: int, c: int, max_steps: int,
           cache: PlanCache, compact: bool = False) -> list[list[_Tb]] | None:
    """`chans`: the channel of each of `cache.moving`. `compact`: send and receive
    connections are paired by their sizes (`_pair_by_size`), not by fusion."""
    sends, recvs = _connection_halves(cache, chans)
    weight = _fusion_weights(cache, chans)

    groups: dict[tuple[int, int], tuple[set[int], set[int]]] = defaultdict(lambda: (set(), set()))
    for rank, peer, ch in sends:
        groups[(rank, ch)][0].add(peer)
    for rank, peer, ch in recvs:
        groups[(rank, ch)][1].add(peer)

    per_rank: list[list[_Tb]] = [[] for _ in range(ranks)]
    for (rank, ch), (send_peers, recv_peers) in sorted(groups.items()):
        if compact:
            pairs = _pair_by_size({q: len(sends[(rank, q, ch)]) for q in send_peers},
                                  {p: len(recvs[(rank, p, ch)]) for p in recv_peers}, max_steps)
        else:
            pairs = _pair(send_peers, recv_peers, weight[(rank, ch)], cache.matchings)
        if pairs is None:
            return None
        for q, p in pairs:
            tb = _Tb(q, p, ch)
            if q >= 0:
                tb.halves += sends[(rank, q, ch)]
            if p >= 0:
                tb.halves += recvs[(rank, p, ch)]
            per_rank[rank].append(tb)
    _place_locals(preds, per_rank, c, max_steps, cache)
    for r in range(ranks):
        if not per_rank[r]:
            # The executor launches one CUDA block per threadblock; a GPU with nothing to
            # do still gets an (empty) one so that the launch is valid.
            per_rank[r].append(_Tb(-1, -1, 0))
        if max(Counter(tb.chan for tb in per_rank[r]).values()) > MAX_TBS_PER_CHANNEL:
            return None
    return per_rank


def _connection_halves(cache: PlanCache, chans: list[int]
                       ) -> tuple[dict[tuple[int, int, int], list[int]], dict[tuple[int, int, int], list[int]]]:
    """The sends and the receives of each (rank, peer, channel), in half order."""
    moving, rank, peer, is_send = cache.moving_arrays
    chan = np.asarray(chans, dtype=np.int64)
    order = np.lexsort((chan, peer, rank, is_send))  # stable: half order inside each group
    keys = np.stack([is_send[order], rank[order], peer[order], chan[order]])
    bounds = np.flatnonzero(np.r_[True, (keys[:, 1:] != keys[:, :-1]).any(axis=0), True]).tolist()
    halves = moving[order].tolist()
    sends: dict[tuple[int, int, int], list[int]] = {}
    recvs: dict[tuple[int, int, int], list[int]] = {}
    for lo, hi in zip(bounds, bounds[1:]):
        send, r, p, ch = keys[:, lo].tolist()
        (sends if send else recvs)[(r, p, ch)] = halves[lo:hi]
    return sends, recvs


def _fusion_weights(cache: PlanCache, chans: list[int]) -> dict[tuple[int, int], Counter]:
    """(rank, channel) -> (receive peer, send peer) -> fusion candidates between them on
    that channel, each Counter in order of first candidate (`_matching` numbers the
    graph's vertices in that order)."""
    weight: dict[tuple[int, int], Counter] = defaultdict(Counter)
    ca, cb, rank, p, q = cache.candidate_arrays
    if len(ca) == 0:
        return weight
    moving = cache.moving_arrays[0]
    chan_of = np.full(cache.halves, -1, dtype=np.int64)
    chan_of[moving] = chans
    ch = chan_of[ca]
    same = ch == chan_of[cb]  # a chain split over channels (see _assign_channels) cannot fuse there
    ch, rank, p, q = ch[same], rank[same], p[same], q[same]
    width = 1 + int(max(p.max(initial=0), q.max(initial=0), rank.max(initial=0), ch.max(initial=0)))
    code = ((rank * width + ch) * width + p) * width + q
    _, first, counts = np.unique(code, return_index=True, return_counts=True)
    by_first = np.argsort(first, kind="stable")
    first, counts = first[by_first], counts[by_first]
    for r, c, a, b, n in zip(rank[first].tolist(), ch[first].tolist(), p[first].tolist(), q[first].tolist(),
                             counts.tolist()):
        weight[(r, c)][(a, b)] = n
    return weight


def _pair(send_peers: set[int], recv_peers: set[int], weight: Counter,
          matchings: dict[tuple, list[tuple[int, int]]] | None = None) -> list[tuple[int, int]] | None:
    """(send peer, recv peer) of each threadblock of one rank and channel (-1: none)."""
    pairs = _matching(weight, {} if matchings is None else matchings)
    lone_sends = sorted(send_peers - {q for q, _ in pairs})
    lone_recvs = sorted(recv_peers - {p for _, p in pairs})
    # Unrelated connections share a threadblock only when the channel would otherwise
    # hold too many (a shared one runs their steps one after the other).
    while len(pairs) + len(lone_sends) + len(lone_recvs) > MAX_TBS_PER_CHANNEL and lone_sends and lone_recvs:
        pairs.append((lone_sends.pop(0), lone_recvs.pop(0)))
    pairs += [(q, -1) for q in lone_sends] + [(-1, p) for p in lone_recvs]
    if len(pairs) > MAX_TBS_PER_CHANNEL:
        return None
    return sorted(pairs)


def _pair_by_size(send_sizes: dict[int, int], recv_sizes: dict[int, int], max_steps: int
                  ) -> list[tuple[int, int]] | None:
    """(send peer, recv peer) of each threadblock of one rank and channel (-1: none),
    packed: the largest send connections first, each with the largest receive
    connection that still fits `max_steps` beside it (a peer's own where it fits as
    well), then the receives left over with each other send left over."""
    recvs = sorted(recv_sizes, key=lambda p: (recv_sizes[p], p))
    sizes = [recv_sizes[p] for p in recvs]
    taken = [False] * len(recvs)
    pairs: list[tuple[int, int]] = []
    lone_sends: list[int] = []
    for q in sorted(send_sizes, key=lambda q: (-send_sizes[q], q)):
        room = max_steps - send_sizes[q]
        at = bisect.bisect_right(sizes, room) - 1
        while at >= 0 and taken[at]:
            at -= 1
        if at < 0:
            lone_sends.append(q)
            continue
        own = recvs.index(q) if q in recv_sizes else -1
        if own >= 0 and not taken[own] and sizes[own] <= room and sizes[own] == sizes[at]:
            at = own
        taken[at] = True
        pairs.append((q, recvs[at]))
    lone_recvs = [p for p, t in zip(recvs, taken) if not t]
    while lone_sends and lone_recvs and len(pairs) + len(lone_sends) + len(lone_recvs) > MAX_TBS_PER_CHANNEL:
        pairs.append((lone_sends.pop(), lone_recvs.pop(0)))
    pairs += [(q, -1) for q in lone_sends] + [(-1, p) for p in lone_recvs]
    if len(pairs) > MAX_TBS_PER_CHANNEL:
        return None
    return sorted(pairs)


def _matching(weight: Counter, known: dict[tuple, list[tuple[int, int]]]) -> list[tuple[int, int]]:
    """(send peer, recv peer) pairs of a maximum-weight matching between receive peers
    and send peers, `weight` counting the fusion candidates of each (recv, send) pair.

    networkx's blossom algorithm visits vertices and edges in insertion order only, so
    its answer depends on the shape of the graph, not on the peers' numbers: the graph
    is built on vertices numbered in order of first appearance, and the matching of each
    shape is computed once (the ranks of a cluster of identical nodes repeat a few
    shapes: 20 for the 320 rank-and-channel graphs of dgx_h100(nodes=8)). The blossom
    algorithm costs milliseconds per graph, most of the threadblock planning."""
    number: dict[tuple[str, int], int] = {}
    edges = []
    for (p, q), w in weight.items():
        u = number.setdefault(("r", p), len(number))
        v = number.setdefault(("s", q), len(number))
        edges.append((u, v, w))
    shape = tuple(edges)
    matched = known.get(shape)
    if matched is None:
        g = nx.Graph()
        g.add_weighted_edges_from(edges)
        matched = [(u, v) for u, v in nx.max_weight_matching(g)] if edges else []
        known[shape] = matched
    vertex = list(number)
    pairs = []
    for u, v in matched:
        (_, p), (_, q) = (vertex[u], vertex[v]) if vertex[u][0] == "r" else (vertex[v], vertex[u])
        pairs.append((q, p))
    return pairs


def _place_locals(preds: tuple[tuple[int, ...], ...], per_rank: list[list[_Tb]], c: int, max_steps: int,
                  cache: PlanCache) -> None:
    """Every local half (`cache.local`, in key order) into the threadblock of its last
    placed predecessor, else into a threadblock of its own rank and instance."""
    if not cache.local:
        return
    # The place of a half as a Python int (an array's `item`: its `[]` builds a NumPy
    # scalar, and their comparisons are slow).
    place = cache.places.item if isinstance(cache.places, np.ndarray) else cache.places.__getitem__
    # The threadblock of every half placed so far, as a number into `flat` (an array: a
    # dict over four million halves took 300 MiB at 1,024 GPUs, for a few local halves).
    flat = [tb for tbs in per_rank for tb in tbs]
    number = {id(tb): k for k, tb in enumerate(flat)}
    lengths = np.fromiter(map(len, (tb.halves for tb in flat)), np.int64, len(flat))
    where = np.full(len(cache.places), -1, dtype=np.int64)
    where[np.fromiter(chain.from_iterable(tb.halves for tb in flat), np.int64, int(lengths.sum()))] = np.repeat(
        np.arange(len(flat), dtype=np.int64), lengths)
    own: dict[tuple[int, int], list[_Tb]] = defaultdict(list)  # (rank, instance) -> peerless tbs
    for h, rank, inst, pred in zip(cache.local, cache.local_rank, cache.local_instance, cache.local_preds(preds)):
        before = [p for p in pred if where.item(p) >= 0]
        if before:
            tb = flat[where.item(max(before, key=place))]
        else:
            mine = own[(rank, inst)]
            if not mine or len(mine[-1].halves) >= max_steps:
                # On the instance's channel with the fewest threadblocks of this rank.
                used = Counter(tb.chan for tb in per_rank[rank])
                chan = min(range(inst * c, (inst + 1) * c), key=lambda ch: (used[ch], ch))
                if used[chan] >= MAX_TBS_PER_CHANNEL:
                    # Every channel is full: the op joins the shortest threadblock of the
                    # instance (it waits for nothing, so any threadblock can run it).
                    tb = min((t for t in per_rank[rank] if inst * c <= t.chan < (inst + 1) * c),
                             key=lambda t: len(t.halves))
                    tb.halves.append(h)
                    where[h] = number[id(tb)]
                    continue
                mine.append(_Tb(-1, -1, chan))
                per_rank[rank].append(mine[-1])
                number[id(mine[-1])] = len(flat)
                flat.append(mine[-1])
            tb = mine[-1]
        tb.halves.append(h)
        where[h] = number[id(tb)]


def _largest(per_rank: list[list[_Tb]], cache: PlanCache) -> tuple[int, int, _Tb]:
    """(rank, steps, tb) of the threadblock with the most steps once fused (an estimate:
    every candidate inside a threadblock fused, no nop steps); the first such in rank
    and threadblock order."""
    tbs = [tb for t in per_rank for tb in t]
    lengths = np.fromiter(map(len, (tb.halves for tb in tbs)), np.int64, len(tbs))
    owner = np.full(cache.halves, -1, dtype=np.int64)
    owner[np.fromiter((h for tb in tbs for h in tb.halves), np.int64, int(lengths.sum()))] = np.repeat(
        np.arange(len(tbs), dtype=np.int64), lengths)
    ca, cb = cache.candidate_arrays[:2]
    inside = (owner[ca] == owner[cb]) & (owner[ca] >= 0)
    a, b = ca[inside], cb[inside]
    # A half in two candidates: the first of them (in candidate order) with both halves
    # still unused counts. Candidates that share no half with another count at once.
    shared = _repeated(a) | _repeated(b)
    fused = np.bincount(owner[a[~shared]], minlength=len(tbs))
    used: set[int] = set()
    for x, y in zip(a[shared].tolist(), b[shared].tolist()):
        if x not in used and y not in used:
            fused[owner[x]] += 1
            used.update((x, y))
    steps = lengths - fused
    k = int(np.argmax(steps)) if len(steps) else 0
    if not len(steps) or steps[k] <= 0:
        return 0, 0, per_rank[0][0]
    most = int(steps[k])
    for rank, t in enumerate(per_rank):
        if k < len(t):
            return rank, most, t[k]
        k -= len(t)
    raise AssertionError("unreachable: k indexes the threadblocks")


def _repeated(values: np.ndarray) -> np.ndarray:
    """Per element, whether its value occurs more than once."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    return counts[inverse.reshape(-1)] > 1


def _finish(tbs: list[_Tb], places: np.ndarray, single_steps: list[LStep]) -> tuple[LThreadblock, ...]:
    for tb in tbs:
        if len(tb.halves) > 1:  # in key order (places are distinct)
            halves = np.array(tb.halves, dtype=np.int64)
            tb.halves = halves[np.argsort(places[halves])].tolist()
    # (An empty threadblock sorts first among those with the same peers and channel.)
    ordered = sorted(tbs, key=lambda tb: (tb.send, tb.recv, tb.chan, places.item(tb.halves[0]) if tb.halves else -1))
    out = []
    for i, tb in enumerate(ordered):
        steps = tuple(map(single_steps.__getitem__, tb.halves))
        out.append(LThreadblock(i, tb.send, tb.recv, tb.chan, steps))
    return tuple(out)


_STEP_TYPE = {kind: kind.step_type for kind in HalfKind}
