"""Call records matched into job calls on columns (`collc.traces.columns.CallColumns`).

The rules are the mix's (`collc.profile.mix`, module docstring); here they are whole-array
steps (sorts, `np.unique`, `np.bincount`), so a log of millions of records makes no
Python object per record: only the job calls' and rows' integer ids are computed, and
`JobCall` objects are made on demand (`Matched.job_calls`, for the model).

Every key below is an integer column: a record's communicator, collective, rank key
(its rank, or its file where the trace names no rank), size, sequence number. A tuple
of such columns is packed into one int64 (`dense_key`) with the same equalities, and
ids are numbered in order of first occurrence (`first_ids`), which is the order the
mix's dictionaries kept: so rows, communicators and iterations come out in the same
order, and float sums are made in the same order (np.bincount adds its weights in
input order), as the per-record loops gave.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Sequence

import numpy as np

from collc.traces.columns import CallColumns, from_columns
from collc.traces.records import CollectiveCall

P2P = ("send", "recv")


def rank_key(call: CollectiveCall) -> int | str:
    """The recording rank, or its file where the trace does not say."""
    return call.rank if call.rank is not None else f"file {call.source}"


@dataclass(slots=True)
class JobCall:
    """One call of the job: the records of it that the traced ranks made."""

    collective: str
    communicator: str
    records: list[CollectiveCall]
    order: tuple  # where it falls in its first rank's stream (for iteration detection)

    @property
    def first(self) -> CollectiveCall:
        return self.records[0]

    @property
    def ranks(self) -> set:
        return {rank_key(c) for c in self.records}

    @property
    def durations(self) -> list[float]:
        return [c.duration_us for c in self.records if c.duration_us is not None]

    @property
    def latency_us(self) -> float | None:
        d = self.durations
        return min(d) if d else None

    @property
    def straggler_us(self) -> float | None:
        d = self.durations
        return (max(d) - min(d)) if d else None

# The kinds of job-call key: a record alone, a collective matched across ranks, a Send/Recv pair.
_ALONE, _COLLECTIVE, _P2P = 0, 1, 2


def dense_key(columns: Iterable[np.ndarray], n: int) -> np.ndarray:
    """One int64 per record, equal for two records exactly where all `columns` are
    (taken one at a time: they may come from a generator)."""
    key = np.zeros(n, dtype=np.int64)
    span = 1
    for column in columns:
        column = np.asarray(column, dtype=np.int64)
        if n == 0:
            continue
        low = int(column.min())
        width = int(column.max()) - low + 1
        if span * width >= 1 << 62:          # would overflow: renumber what is packed so far
            key = np.unique(key, return_inverse=True)[1].astype(np.int64).reshape(n)
            span = int(key.max()) + 1
            if span * width >= 1 << 62:
                column = np.unique(column, return_inverse=True)[1].astype(np.int64).reshape(n)
                low, width = 0, int(column.max()) + 1
        key = key * width + (column - low)
        span *= width
    return key


# Keys spanning at most this many values per key (plus DENSE_SLACK) are numbered by
# counting (a table as long as their range) instead of by sorting.
DENSE_RANGE_PER_KEY = 4
DENSE_SLACK = 1 << 16


def unique_first(key: np.ndarray, counts: bool = False) -> tuple[np.ndarray, ...]:
    """`np.unique(key, return_index=True, return_inverse=True[, return_counts=True])`:
    (distinct values increasing, the first index of each, each entry's value's index[,
    how many of each]). Int64 keys within a range of a few per key (dense_key's and
    first_ids' are) are numbered by counting in O(n + range); others by np.unique's sort."""
    n = len(key)
    if n and key.dtype == np.int64:
        low = int(key.min())
        width = int(key.max()) - low + 1
        if width <= DENSE_RANGE_PER_KEY * n + DENSE_SLACK:
            # Each table as long as the range is dropped once used: the range may be 4n.
            shifted = key - low
            first_at = np.full(width, n, dtype=np.int64)
            np.minimum.at(first_at, shifted, np.arange(n, dtype=np.int64))
            present = first_at < n
            values = np.flatnonzero(present)
            firsts = first_at[values]
            del first_at
            number = np.cumsum(present) - 1
            del present
            inverse = number[shifted]
            del number, shifted
            out = (values + low, firsts, inverse)
            return out + (np.bincount(inverse, minlength=len(values)),) if counts else out
    return np.unique(key, return_index=True, return_inverse=True, return_counts=counts)


def first_ids(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids, firsts): each record's id, numbered in order of first occurrence, and each
    id's first record (increasing)."""
    if len(key) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    _, first, inverse = unique_first(key)
    by_first = np.argsort(first, kind="stable")
    renumber = np.empty(len(first), dtype=np.int64)
    renumber[by_first] = np.arange(len(first))
    return renumber[inverse.reshape(-1)], first[by_first]


def nth_in_stream(stream: np.ndarray, start: np.ndarray, start_none: np.ndarray) -> np.ndarray:
    """Each record's index in its stream's issue order: by start time where every record
    of the stream has one (ties keep read order), else as read."""
    return _stream_order(stream, start, start_none)[0]


def _stream_order(stream: np.ndarray, start: np.ndarray, start_none: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(nth, order, ordered): `nth_in_stream`'s answer, the records by stream and issue
    order within it, and their streams in that order."""
    n = len(stream)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=stream.dtype)
    streams = int(stream.max()) + 1
    all_started = np.bincount(stream[start_none], minlength=streams) == 0
    if all_started.any():
        position = np.arange(n)
        sort_key = np.where(all_started[stream], start, position.astype(np.float64))
        order = np.lexsort((position, sort_key, stream))
        del position, sort_key
    else:       # no stream timed throughout (an NCCL log's calls): read order, one stable sort
        order = np.argsort(stream, kind="stable")
    ordered = stream[order]
    begins = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    lengths = np.diff(np.r_[begins, n])
    ranks = np.arange(n, dtype=np.int64)
    ranks -= np.repeat(begins, lengths)
    nth = np.empty(n, dtype=np.int64)
    nth[order] = ranks
    return nth, order, ordered


def _repeated_seqs(stream: np.ndarray, seq: np.ndarray, order: np.ndarray, ordered: np.ndarray) -> np.ndarray:
    """The streams (as a mask over stream ids) where two records have the same seq. A
    stream whose seqs rise in its issue order has none (NCCL's opCounts count up per
    communicator): only the others are checked, by packing (stream, seq) and counting."""
    repeated = np.zeros(int(stream.max()) + 1 if len(stream) else 0, dtype=bool)
    if len(stream) < 2:
        return repeated
    in_order = seq[order]
    falls = (ordered[1:] == ordered[:-1]) & (in_order[1:] <= in_order[:-1])
    del in_order
    if not falls.any():
        return repeated
    suspect = np.zeros(len(repeated), dtype=bool)
    suspect[ordered[1:][falls]] = True
    del falls
    check = np.flatnonzero(suspect[stream])
    pairs = dense_key([stream[check], seq[check]], len(check))
    uniq, _, _, counts = unique_first(pairs, counts=True)
    repeated[stream[check][np.isin(pairs, uniq[counts > 1])]] = True
    return repeated


def _codes(cols: CallColumns, name: str, none_as: object = None) -> tuple[list, np.ndarray]:
    """(distinct values, int64 codes) of a coded field, None read as `none_as`."""
    table = [none_as if v is None else v for v in cols.tables[name]]
    index = {v: i for i, v in enumerate(dict.fromkeys(table))}
    remap = np.array([index[v] for v in table] or [0], dtype=np.int64)
    return list(index), remap[cols.codes[name].astype(np.int64)] if cols.n else np.zeros(0, dtype=np.int64)


def _int_codes(values: np.ndarray, dense: bool = False) -> np.ndarray:
    """Int64 codes with the equalities of `values` (int64, or Python ints past 63 bits);
    `dense`: numbered 0..k-1 in the order of the values, so that keys packing them stay
    narrow."""
    if values.dtype != object and not dense:
        return values.astype(np.int64, copy=False)
    if values.dtype != object:
        codes = _searched_codes(values)
        if codes is not None:
            return codes
    return np.unique(values, return_inverse=True)[1].astype(np.int64).reshape(-1)


# Values sampled for the table `_searched_codes` searches; past this many distinct
# values, or this share of values the sample missed, a sort of them all is as cheap.
SEARCH_SAMPLE = 4096
SEARCH_TABLE_MOST = 1 << 16
SEARCH_MISSED_SHARE = 8


def _searched_codes(values: np.ndarray) -> np.ndarray | None:
    """np.unique's inverse of int values that take few distinct values (call sizes: a few
    hundred among millions of records), found by a binary search of each value in the
    table of the distinct ones (a sample's, with the values it missed added) instead of
    a sort of them all: 3.2 -> 1.1 s on 19 M records. None where the values are many."""
    n = len(values)
    table = _sorted_distinct(values[::max(1, n // SEARCH_SAMPLE)])
    at = np.searchsorted(table, values)
    missed = table[np.minimum(at, max(len(table) - 1, 0))] != values if len(table) else np.ones(n, dtype=bool)
    if missed.any():
        extra = values[missed]
        if len(extra) * SEARCH_MISSED_SHARE > n:
            return None
        table = _sorted_distinct(np.concatenate((table, extra)))     # now every value is in it
        at = np.searchsorted(table, values)
    return at if len(table) <= SEARCH_TABLE_MOST else None


def _sorted_distinct(values: np.ndarray) -> np.ndarray:
    """np.unique(values) of a plain array, without the masked-array check that makes
    np.unique import numpy.ma (10 ms of a small log's command)."""
    ordered = np.sort(values)
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]] if len(ordered) else ordered


@dataclass
class Records:
    """The per-record columns the mix uses, as int64 codes and float64 values."""

    n: int
    comms: list[str]                 # communicator names ("?" for none)
    comm: np.ndarray
    collectives: list[str]
    collective: np.ndarray
    rank_keys: list                  # rank (int) or "file <source>"
    rank_key: np.ndarray
    bytes_none: np.ndarray
    bytes: np.ndarray                # sizes as codes 0..k-1 (equal where the sizes are; values in the columns)
    peer_none: np.ndarray
    peer: np.ndarray
    nranks: np.ndarray               # 0 where None (a size of 0 counts as unknown everywhere)
    dtypes: list
    dtype: np.ndarray
    named: list[str]
    named_by: np.ndarray
    start_none: np.ndarray
    start: np.ndarray
    duration_none: np.ndarray
    duration: np.ndarray
    seq_none: np.ndarray
    seq: np.ndarray
    group_ranks: dict[int, tuple[int, ...]]

    @classmethod
    def of(cls, cols: CallColumns) -> "Records":
        comms, comm = _codes(cols, "communicator", "?")
        collectives, collective = _codes(cols, "collective")
        dtypes, dtype = _codes(cols, "dtype")
        named, named_by = _codes(cols, "named_by")
        sources = cols.tables["source"]
        rank_none = cols.int_none["rank"]
        rank = cols.ints["rank"].astype(np.int64, copy=False)
        # A rank key is (0, rank) or (1, source): packed, then numbered (the rank alone
        # where every record has one: numbered the same).
        source = cols.codes["source"]
        pair = dense_key([rank_none, np.where(rank_none, source, rank)], cols.n) if rank_none.any() else rank
        ids, firsts = first_ids(pair)
        rank_keys = [f"file {sources[source[i]]}" if rank_none[i] else int(rank[i]) for i in firsts.tolist()]
        nranks = np.where(cols.int_none["nranks"], 0, cols.ints["nranks"]).astype(np.int64)
        return cls(cols.n, comms, comm, collectives, collective, rank_keys, ids,
                   cols.int_none["bytes"], _int_codes(cols.ints["bytes"], dense=True),
                   cols.int_none["peer"], cols.ints["peer"].astype(np.int64, copy=False), nranks,
                   dtypes, dtype, named, named_by,
                   cols.float_none["start_us"], cols.floats["start_us"],
                   cols.float_none["duration_us"], cols.floats["duration_us"],
                   cols.int_none["seq"], _int_codes(cols.ints["seq"]), cols.group_ranks)

    def code_of(self, table: list, value: object) -> int:
        """The code of `value` in a table of this record set, -1 if it does not occur."""
        return table.index(value) if value in table else -1


@dataclass
class Matched:
    """Job calls as ids: `job` is each record's job call, numbered in issue order (by
    its first record); `first` each job call's first record; `collective` its name's
    code (`records.collectives`: a matched Send/Recv pair is a send)."""

    records: Records
    columns: CallColumns
    job: np.ndarray
    first: np.ndarray
    collective: np.ndarray
    order: np.ndarray          # records by (job call, position)

    @property
    def count(self) -> int:
        return len(self.first)

    @cached_property
    def comm(self) -> np.ndarray:
        """Each job call's communicator code."""
        return self.records.comm[self.first]

    def sizes(self) -> np.ndarray:
        """Records per job call."""
        return np.bincount(self.job, minlength=self.count)

    def job_calls(self, calls: Sequence[CollectiveCall] | None = None) -> list[JobCall]:
        """The job calls as `JobCall` objects (their records made from the columns
        unless given)."""
        calls = from_columns(self.columns) if calls is None else calls
        r = self.records
        members: list[list[CollectiveCall]] = [[] for _ in range(self.count)]
        for i in self.order.tolist():
            members[self.job[i]].append(calls[i])
        names = [r.collectives[c] for c in self.collective.tolist()]
        comms = [r.comms[c] for c in self.comm.tolist()]
        return [JobCall(names[j], comms[j], members[j], (first,))
                for j, first in enumerate(self.first.tolist())]


def match(cols: CallColumns) -> Matched:
    """The job calls of a set of records (the mix's rules, module docstring of `mix`).

    Each rule's working arrays live in a function of its own and are freed when it
    returns: matching 19 M records (64 per-rank logs) needs a dozen int64 columns of
    them at most at once, not every rule's at the same time."""
    r = Records.of(cols)
    n = r.n
    send = r.code_of(r.collectives, "send")
    recv = r.code_of(r.collectives, "recv")
    is_send = r.collective == send
    is_p2p = is_send | (r.collective == recv)
    kind = np.full(n, _ALONE, dtype=np.int8)
    a = np.arange(n, dtype=np.int64)          # the key's columns after the kind and the communicator
    b = np.zeros(n, dtype=np.int64)
    c = np.zeros(n, dtype=np.int64)
    _match_collectives(r, ~is_p2p, kind, a, b)
    _match_point_to_point(r, is_p2p & ~r.peer_none, is_send, kind, a, b, c)
    if not (kind != _ALONE).any():
        # Nothing matched across ranks (one rank's log): each record is a job call of its
        # own, in read order, as the keys below would number them.
        del kind, a, b, c
        return Matched(r, cols, np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64),
                       r.collective.copy(), np.arange(n, dtype=np.int64))
    job, first = first_ids(_job_keys(kind, r, a, b, c))
    del a, b, c
    count = len(first)
    any_send = np.bincount(job[is_send], minlength=count) > 0 if send >= 0 else np.zeros(count, dtype=bool)
    collective = r.collective[first]
    if send >= 0:
        collective = np.where((kind[first] == _P2P) & any_send, send, collective)
    del kind
    order = np.lexsort((np.arange(n, dtype=np.int64), job))
    return Matched(r, cols, job, first, collective, order)


def _match_collectives(r: Records, coll: np.ndarray, kind: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """Collectives on a communicator that more than one rank recorded: matched (their
    kind, and a, b of their keys, set in place)."""
    n = r.n
    comm_rank = dense_key([r.comm, r.rank_key], n)
    one_each = unique_first(comm_rank[coll])[1]      # a record of each (comm, rank)
    ranks_on = np.bincount(r.comm[coll][one_each], minlength=len(r.comms))
    matched = coll & (ranks_on[r.comm] > 1)
    if not matched.any():
        return
    idx = np.flatnonzero(matched)
    stream, _ = first_ids(comm_rank[idx])
    del comm_rank, matched
    nth, order, ordered = _stream_order(stream, r.start[idx], r.start_none[idx])
    # By seq on a communicator only where every stream has a seq on every record, all distinct.
    repeated = _repeated_seqs(stream, r.seq[idx], order, ordered)
    del order, ordered
    repeated[stream[r.seq_none[idx]]] = True
    comm_of = r.comm[idx]
    bad_comm = np.zeros(len(r.comms), dtype=bool)
    bad_comm[comm_of[repeated[stream]]] = True
    by_seq = ~bad_comm[comm_of]
    kind[idx] = _COLLECTIVE
    a[idx] = np.where(by_seq, r.seq[idx], nth)
    b[idx] = r.collective[idx]


def _match_point_to_point(r: Records, paired: np.ndarray, is_send: np.ndarray, kind: np.ndarray,
                          a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    """Send/Recv with a known peer: the n-th send a->b meets the n-th recv on b from a
    (their kind and a, b, c of their keys, set in place)."""
    if not paired.any():
        return
    idx = np.flatnonzero(paired)
    # The peer as a rank key: a rank the records name, or a new id past them.
    peer_key = _peer_keys(r, r.peer[idx])
    me = r.rank_key[idx]
    src = np.where(is_send[idx], me, peer_key)
    dst = np.where(is_send[idx], peer_key, me)
    stream, _ = first_ids(dense_key([r.comm[idx], r.collective[idx], src, dst], len(idx)))
    kind[idx] = _P2P
    a[idx] = src
    b[idx] = dst
    c[idx] = nth_in_stream(stream, r.start[idx], r.start_none[idx])


def _job_keys(kind: np.ndarray, r: Records, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """One int64 per record, equal for two records exactly where they are one job call:
    (kind, communicator, a, b, c, bytes) for matched records; a record alone is a job
    call of its own. Keys of matched records are numbered first (0..G-1) and a record
    alone gets G + its position, so that the keys span at most 2n values (numbered by
    counting, `unique_first`) however wide their columns are."""
    n = r.n
    grouped = np.flatnonzero(kind != _ALONE)
    key = np.arange(n, dtype=np.int64)
    if len(grouped):
        # A generator: each column is gathered as dense_key packs it, not all seven first.
        packed = dense_key((column[grouped] for column in (kind, r.comm, a, b, c, r.bytes_none, r.bytes)),
                           len(grouped))
        codes = unique_first(packed)[2].astype(np.int64)
        key += int(codes.max()) + 1
        key[grouped] = codes
    return key


def _peer_keys(r: Records, peers: np.ndarray) -> np.ndarray:
    """Rank-key ids of peer ranks: the id of that rank where a record names it, else an
    id of its own (past every record's)."""
    known = {key: i for i, key in enumerate(r.rank_keys) if isinstance(key, int)}
    distinct, inverse = np.unique(peers, return_inverse=True)
    ids = []
    extra = len(r.rank_keys)
    for p in distinct.tolist():
        if p in known:
            ids.append(known[p])
        else:
            ids.append(extra)
            extra += 1
    return np.array(ids, dtype=np.int64)[inverse.reshape(-1)]


def first_per_group(groups: np.ndarray, values: np.ndarray, eligible: np.ndarray, size: int) -> np.ndarray:
    """For each group id (0..size-1), `values` of its first eligible entry (in the order
    given), 0 where none."""
    out = np.zeros(size, dtype=values.dtype)
    idx = np.flatnonzero(eligible)
    if len(idx):
        g = groups[idx]
        firsts = unique_first(g)[1]
        out[g[firsts]] = values[idx[firsts]]
    return out
