"""A log's records as the replay completes them, kept as columns, never as objects.

The replay (`scan.replay`) appends one entry per COLL line to a few flat arrays: the
call's shape (an index into every shape seen: thread, collective, rank, communicator,
sizes), its line number, opCount and timestamp; TUNING lines set the algorithm and
protocol of the calls they complete; the order in which records are complete is kept
as a list of indices (`emitted`). `columns` turns that into the `CallColumns` every
reader's records become: a shape's fields are coded once per distinct shape, then
taken per record with one NumPy index each.
"""

from __future__ import annotations

from array import array

import numpy as np

from ..columns import CallColumns, coded, with_none

# The fields of a call shape (`scan._coll_shape`), after its thread.
_SHAPE_FIELDS = ("collective", "rank", "communicator", "nranks", "dtype", "count", "bytes",
                 "in_bytes", "out_bytes", "peer")
_SHAPE_CODED = ("collective", "communicator", "dtype")


class Collected:
    """The records of one log so far (see the module docstring)."""

    def __init__(self) -> None:
        self.shapes: list[tuple] = []          # every shape seen, never forgotten (the records point into it)
        self.shape = array("q")                # per COLL line: its shape's index in `shapes`
        self.line = array("q")
        # opCounts as 64-bit words, or Python ints once one is wider (NCCL's are 64-bit).
        self.seq: array | list[int] = array("Q")
        self.stamp: list[float | None] | None = None     # None while no line had a timestamp
        self.tuned: dict[int, int] = {}        # record -> its (algorithm, protocol)'s index in `tunings`
        self.tunings: dict[tuple[str, str], int] = {}
        self.emitted = array("q")              # records in the order they were complete
        # The shapes of the events being replayed (a scan's table) -> their indices in `shapes`.
        self._table: list | None = None
        self._index: list[int] = []

    def shape_index(self, table: list) -> list[int]:
        """The indices in `shapes` of the entries of a scan's shape table (`Events.shapes`),
        new entries added: the scan's table grows between replays, or is another's."""
        if table is not self._table or len(table) < len(self._index):
            self._table, self._index = table, []
        index = self._index
        for shape in table[len(index):]:
            index.append(len(self.shapes))
            self.shapes.append(shape)
        return index

    def forget_table(self) -> None:
        """The scan's shape table was cleared (`State.trim`): its indices start again."""
        self._table, self._index = None, []

    def add_seqs(self, seqs) -> None:
        """Append opCounts (an array("Q") from a worker, or a list)."""
        if type(self.seq) is array:
            before = len(self.seq)
            try:
                self.seq.extend(seqs)
                return
            except (OverflowError, TypeError):     # a wider opCount: what went in is taken out
                del self.seq[before:]
                self.seq = self.seq.tolist()
        self.seq.extend(seqs)

    def add_seq(self, seq: int) -> None:
        if type(self.seq) is array and 0 <= seq < 1 << 64:
            self.seq.append(seq)
        else:
            self.add_seqs((seq,))

    def tuning(self, algorithm: str, protocol: str) -> int:
        pair = (algorithm, protocol)
        index = self.tunings.get(pair)
        if index is None:
            index = self.tunings[pair] = len(self.tunings)
        return index

    def columns(self, name: str) -> CallColumns:
        """The emitted records as columns, in the order they were emitted."""
        order = np.frombuffer(self.emitted, dtype=np.int64) if len(self.emitted) else np.zeros(0, dtype=np.int64)
        n = len(order)
        shape = np.frombuffer(self.shape, dtype=np.int64)[order] if n else np.zeros(0, dtype=np.int64)
        by_field = dict(zip(_SHAPE_FIELDS, zip(*(s[1:] for s in self.shapes)))) if self.shapes else \
            {f: () for f in _SHAPE_FIELDS}
        tables, codes, ints, int_none = {}, {}, {}, {}
        for field in _SHAPE_CODED:
            tables[field], table_codes = coded(by_field[field])
            codes[field] = table_codes[shape] if n else np.zeros(0, dtype=np.int32)
        for field in ("rank", "nranks", "count", "bytes", "peer", "in_bytes", "out_bytes"):
            values, none = with_none(by_field[field], 0, np.int64)
            ints[field], int_none[field] = (values[shape], none[shape]) if n else (
                np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool))
        seqs = _opcounts(self.seq)
        ints["seq"], int_none["seq"] = seqs[order] if n else np.zeros(0, dtype=np.int64), np.zeros(n, dtype=bool)
        tables["source"], codes["source"] = [name] if n else [], np.zeros(n, dtype=np.int32)
        tables["named_by"], codes["named_by"] = ["log"] if n else [], np.zeros(n, dtype=np.int32)
        algorithms, protocols = self._tuned_codes(order)
        tables["algorithm"], codes["algorithm"] = algorithms
        tables["protocol"], codes["protocol"] = protocols
        floats = {"duration_us": np.full(n, np.nan)}
        float_none = {"duration_us": np.ones(n, dtype=bool)}
        if self.stamp is not None:
            stamps = tuple(np.array(self.stamp, dtype=object)[order].tolist()) if n else ()
            floats["start_us"], float_none["start_us"] = with_none(stamps, np.nan, np.float64)
        else:
            floats["start_us"], float_none["start_us"] = np.full(n, np.nan), np.ones(n, dtype=bool)
        lines = np.frombuffer(self.line, dtype=np.int64)[order] if n else np.zeros(0, dtype=np.int64)
        return CallColumns(n, tables, codes, ints, int_none, floats, float_none,
                           np.zeros(n, dtype=np.int32), lines, ["line "] if n else [], {}, {})

    def _tuned_codes(self, order: np.ndarray) -> tuple[tuple[list, np.ndarray], tuple[list, np.ndarray]]:
        """(table, codes) of the algorithm and of the protocol of each emitted record."""
        n = len(order)
        tuned = np.full(len(self.shape), -1, dtype=np.int64)
        if self.tuned:
            tuned[np.fromiter(self.tuned.keys(), dtype=np.int64, count=len(self.tuned))] = \
                np.fromiter(self.tuned.values(), dtype=np.int64, count=len(self.tuned))
        per_record = tuned[order] if n else np.zeros(0, dtype=np.int64)
        pairs = list(self.tunings)
        out = []
        for part in (0, 1):
            values = tuple([None] + [p[part] for p in pairs])      # index 0: not tuned
            table, table_codes = coded(values)
            out.append((table, table_codes[per_record + 1] if n else np.zeros(0, dtype=np.int32)))
        return out[0], out[1]


def _opcounts(seq: "array | list[int]") -> np.ndarray:
    """The opCounts as int64, or as Python ints (object) where one is past 63 bits."""
    if type(seq) is array:
        words = np.frombuffer(seq, dtype=np.uint64) if len(seq) else np.zeros(0, dtype=np.uint64)
        if not len(words) or int(words.max()) < 1 << 63:
            return words.astype(np.int64)
        seq = seq.tolist()
    try:
        return np.array(seq, dtype=np.int64)
    except OverflowError:
        return np.array(seq, dtype=object)
