"""Demand matrices: what each GPU sends each other GPU, as collectives (AllToAllv).

A demand matrix M is N x N: M[i][j] is what rank i sends rank j (row i is i's send
buffer, column j is j's receive buffer), as a mixture-of-experts layer's token routing
makes it: skewed, sparse, rows of different sums. Each entry is a unicast demand;
multicast stays a `deliver` statement of a `.coll` collective.

The file format (`collc compile --demand M.csv`, or `compile alltoallv(demand =
"M.csv") on T ...;` in a `.coll` file): one row per line, entries separated by commas
(or by blanks), `#` starts a comment. Entries are bytes, or, where a size is given
(`--size`, `size` in the request), shares of that size: rank i sends M[i][j] x size
bytes to rank j, and each share is then at most 1.

The collective cuts every entry into slots of one size (the IR's slots are all alike),
each entry rounded up to whole slots: the schedule moves at least every byte asked for.
The slot is small enough that the rounding adds at most ROUNDING of the bytes (half of it on average) (and at
least total / MAX_SLOTS, so that a huge sparse matrix stays a few hundred thousand
slots). The lower bounds count the matrix's own bytes (`Collective.demand`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from collc.diagnostics import CollcError, Span
from collc.ir.collective import DEMAND_NAME, ChunkId, Collective, CollectiveKind, standard
from collc.ir.schedule import Buffer, Loc, Op, OpKind, Schedule
from collc.ir.topology import Topology

# Slots are small enough that rounding every entry up adds at most this share of the bytes ...
ROUNDING = 0.01
# ... but never more slots than this in all.
MAX_SLOTS = 200_000
# Files larger than this are refused before they are read (1,024 ranks of 20-digit
# entries are about 21 MB).
MAX_FILE_BYTES = 256 << 20

_SEPARATOR = re.compile(r"\s*,\s*|\s+")


@dataclass(frozen=True)
class DemandCollective:
    """A demand matrix as a collective, and the size to compile it at (each rank's
    largest buffer, in whole slots)."""

    collective: Collective
    size_bytes: int
    matrix: np.ndarray  # bytes, N x N
    slot_bytes: float

    @property
    def rounding(self) -> float:
        """Bytes the slots move beyond the matrix's, as a share of its bytes."""
        exact = float(self.matrix.sum())
        moved = sum(math.ceil(b / self.slot_bytes - 1e-9) for b in self.matrix[self.matrix > 0].tolist())
        return moved * self.slot_bytes / exact - 1 if exact > 0 else 0.0


def read_demand(path: str | Path, ranks: int, size_bytes: int | None = None,
                span: Span | None = None) -> np.ndarray:
    """The demand matrix in `path` as bytes (shares times `size_bytes` where given).
    Raises CollcError located in the file for what is wrong with it."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise CollcError(f"demand matrix {path} is {p.stat().st_size:,} bytes; at most {MAX_FILE_BYTES:,} are "
                             "read", span)
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CollcError(f"cannot read demand matrix {path}: {getattr(exc, 'strerror', None) or exc}", span) from None
    return parse_demand(text, str(path), ranks, size_bytes)


def parse_demand(text: str, file: str, ranks: int, size_bytes: int | None = None) -> np.ndarray:
    rows: list[list[float]] = []
    lines: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        body = line.split("#", 1)[0]
        if not body.strip():
            continue
        row = []
        for column, cell in _cells(body):
            row.append(_entry(cell, file, number, column, size_bytes))
        if rows and len(row) != len(rows[0]):
            raise CollcError(f"row {len(rows) + 1} of the demand matrix has {len(row)} entries, row 1 has "
                             f"{len(rows[0])}: every row has one entry per rank",
                             Span(file, number, 1))
        rows.append(row)
        lines.append(number)
    if not rows:
        raise CollcError("the demand matrix is empty: write one row per rank", Span(file, 1, 1))
    n = len(rows[0])
    if len(rows) != n:
        raise CollcError(f"the demand matrix is not square: {len(rows)} rows of {n} entries (row i, column j: "
                         "what rank i sends rank j)", Span(file, lines[-1], 1))
    if n != ranks:
        raise CollcError(f"the demand matrix is {n} x {n}, but the topology has {ranks} GPUs",
                         Span(file, lines[0], 1))
    matrix = np.array(rows, dtype=float)
    if size_bytes is not None:
        matrix = matrix * float(size_bytes)
    off = matrix.copy()
    np.fill_diagonal(off, 0.0)
    if not off.any():
        raise CollcError("the demand matrix moves nothing between GPUs (every entry off the diagonal is 0)",
                         Span(file, lines[0], 1))
    return matrix


def _cells(body: str) -> list[tuple[int, str]]:
    """(column, text) of each entry of a line."""
    out = []
    pos = len(body) - len(body.lstrip())
    stripped = body.strip()
    for piece in _SEPARATOR.split(stripped):
        at = body.index(piece, pos) if piece else pos
        out.append((at + 1, piece))
        pos = at + len(piece)
    return out


def _entry(cell: str, file: str, line: int, column: int, size_bytes: int | None) -> float:
    where = Span(file, line, column, line, column + max(len(cell), 1))
    try:
        value = float(cell)
    except ValueError:
        raise CollcError(f"demand matrix entry '{cell}' is not a number", where) from None
    if not math.isfinite(value):
        raise CollcError(f"demand matrix entry '{cell}' is not a finite number", where)
    if value < 0:
        raise CollcError(f"demand matrix entry {cell} is negative: an entry is what one rank sends another",
                         where)
    if size_bytes is not None and value > 1:
        raise CollcError(f"demand matrix entry {cell} is above 1: with a size given, entries are shares of it "
                         "(leave the size out for a matrix of bytes)", where)
    return value


def demand_collective(matrix: np.ndarray, name: str = DEMAND_NAME) -> DemandCollective:
    """The matrix as a collective: rank i's input holds, for each j in order, the slots
    of M[i][j]; rank j's output holds, for each i in order, the slots it receives."""
    n = matrix.shape[0]
    nonzero = matrix > 0
    total = float(matrix.sum())
    slot = max(total * ROUNDING / int(nonzero.sum()), total / MAX_SLOTS, 1.0)
    entries = matrix[nonzero]
    if np.all(entries == np.round(entries)) and entries.max() < 2.0 ** 62:
        # Whole bytes with a common divisor at least that large: slots of it round nothing.
        common = int(np.gcd.reduce(entries.astype(np.int64)))
        if common >= slot:
            slot = float(common)
    counts = np.where(nonzero, np.ceil(matrix / slot - 1e-9), 0).astype(np.int64)
    counts[nonzero & (counts == 0)] = 1
    starts = np.zeros((n, n), dtype=np.int64)
    starts[:, 1:] = np.cumsum(counts, axis=1)[:, :-1]
    inputs = tuple(tuple(frozenset((ChunkId(i, k),)) for k in range(int(counts[i].sum()))) for i in range(n))
    outputs = tuple(tuple(inputs[i][int(starts[i, j]) + k] for i in range(n) for k in range(int(counts[i, j])))
                    for j in range(n))
    widest = max(max(len(b) for b in inputs), max(len(b) for b in outputs))
    size = math.ceil(slot * widest)
    listed = tuple((int(i), int(j), float(matrix[i, j])) for i, j in zip(*np.nonzero(matrix)))
    coll = Collective(name, CollectiveKind.CUSTOM, n, 1, inputs, outputs, None, listed)
    return DemandCollective(coll, size, matrix, size / widest)


def padded_alltoall(matrix: np.ndarray) -> DemandCollective:
    """The AllToAll that carries the matrix with every block padded to the largest one:
    what the MSCCL executor can run (its alltoall lays each rank's buffer out as ngpus
    equal blocks, one count per call). Without rounding where the blocks are equal."""
    n = matrix.shape[0]
    off = matrix.copy()
    np.fill_diagonal(off, 0.0)
    block = float(off.max())
    size = math.ceil(block) * n
    return DemandCollective(standard("alltoall", n, 1), size, np.full((n, n), math.ceil(block)), float(math.ceil(block)))


def padding_overhead(matrix: np.ndarray) -> float:
    """Bytes the padded AllToAll moves between GPUs over the matrix's, as a share."""
    off = matrix.copy()
    np.fill_diagonal(off, 0.0)
    n = matrix.shape[0]
    return float(off.max()) * n * (n - 1) / float(off.sum()) - 1


def switch_paths(topology: Topology) -> dict[tuple[int, int], float]:
    """(rank i, rank j) -> the bottleneck capacity of the fewest-hop path from GPU i to
    GPU j that crosses only switches and NICs, for the pairs that have one."""
    out_links = topology.out_links
    out: dict[tuple[int, int], float] = {}
    for i, gpu in enumerate(topology.gpus):
        seen = {gpu.name: float("inf")}
        frontier = [gpu.name]
        while frontier:
            nxt = []
            for u in frontier:
                for link in out_links.get(u, ()):
                    v = link.dst
                    if v in seen:
                        continue
                    seen[v] = min(seen[u], link.capacity)
                    node = topology.node(v)
                    if node.holds_data:
                        out[(i, node.rank)] = seen[v]
                    else:
                        nxt.append(v)
            frontier = nxt
    return out


def direct_schedule(coll: Collective, topology: Topology) -> Schedule:
    """NCCL's AllToAllv: every rank sends each block to its owner, all at once (one op
    per block; the simulator picks the route). Where no path of switches joins the two
    GPUs, the block goes through GPUs, as few as there can be, each hop the fastest
    that keeps to that (on a rail cluster: the sender's node-mate on the receiver's
    rail, as NCCL's PXN sends it; on a GPU mesh, NVLink hops). The baseline a demand is
    measured against."""
    if coll.demand is None:
        raise ValueError("not a demand collective")
    paths = switch_paths(topology)
    hops = _hops_to(paths, coll.ranks)
    where: dict = {}
    for j, buf in enumerate(coll.outputs):
        for k, v in enumerate(buf):
            (c,) = v
            where[c] = (j, k)
    ops: list[Op] = []
    scratch = [0] * coll.ranks
    for i, buf in enumerate(coll.inputs):
        k = 0
        while k < len(buf):
            (c,) = buf[k]
            j, at = where[c]
            run = 1
            while k + run < len(buf) and where[next(iter(buf[k + run]))] == (j, at + run):
                run += 1
            src, dep, step = Loc(i, Buffer.INPUT, k), (), 0
            for relay in _relays(paths, hops, i, j, topology):
                hop = Loc(relay, Buffer.SCRATCH, scratch[relay])
                scratch[relay] += run
                ops.append(Op.make(len(ops), OpKind.COPY, src, hop, run, dep, step, (), None))
                src, dep, step = hop, (len(ops) - 1,), step + 1
            ops.append(Op.make(len(ops), OpKind.COPY, src, Loc(j, Buffer.OUTPUT, at), run, dep, step, (), None))
            k += run
    return Schedule("direct", coll, topology.name, tuple(ops), tuple(scratch) if any(scratch) else (),
                    {"source": "algorithm", "algorithm": "direct"})


def _hops_to(paths: dict[tuple[int, int], float], ranks: int) -> list[list[int]]:
    """hops[j][r]: the fewest switch paths from GPU r to GPU j (ranks if none)."""
    into: list[list[int]] = [[] for _ in range(ranks)]
    for a, b in paths:
        into[b].append(a)
    out = []
    for j in range(ranks):
        dist = [ranks] * ranks
        dist[j] = 0
        frontier = [j]
        while frontier:
            nxt = []
            for v in frontier:
                for u in into[v]:
                    if dist[u] == ranks:
                        dist[u] = dist[v] + 1
                        nxt.append(u)
            frontier = nxt
        out.append(dist)
    return out


def _relays(paths: dict[tuple[int, int], float], hops: list[list[int]], i: int, j: int,
            topology: Topology) -> list[int]:
    if i == j:
        return []
    ranks = len(hops)
    if hops[j][i] >= ranks:
        raise CollcError(f"the direct exchange cannot send from GPU {topology.gpu(i).name} to "
                         f"{topology.gpu(j).name}: no path of links joins them")
    out, at = [], i
    while hops[j][at] > 1:
        at = min((-paths[(at, r)], r) for r in range(ranks)
                 if (at, r) in paths and hops[j][r] == hops[j][at] - 1)[1]
        out.append(at)
    return out


def demand_request(path: str | Path, topology_ranks: int, size_bytes: int | None, pad: bool,
                   span: Span | None = None) -> DemandCollective:
    """The collective to compile for the demand matrix in `path`: the matrix itself, or
    where `pad` (a runtime that takes only equal blocks: MSCCL XML) the AllToAll with
    every block padded to the largest, carrying the matrix for its bounds."""
    matrix = read_demand(path, topology_ranks, size_bytes, span)
    if not pad:
        return demand_collective(matrix)
    padded = padded_alltoall(matrix)
    entries = tuple((int(i), int(j), float(matrix[i, j])) for i, j in zip(*np.nonzero(matrix)))
    coll = Collective(DEMAND_NAME, CollectiveKind.ALLTOALL, padded.collective.ranks, 1, padded.collective.inputs,
                      padded.collective.outputs, None, entries)
    return DemandCollective(coll, padded.size_bytes, matrix, padded.slot_bytes)


def demand_of_request(module, req, topology, size: int | None, args: list) -> DemandCollective:
    """A `.coll` request's demand matrix: `alltoallv(demand = "m.csv")` (or the path
    alone), the path relative to the requesting file; entries are shares of the
    request's size where it has one."""
    if len(args) != 1 or args[0][0] not in (None, "demand") or not isinstance(args[0][1], str):
        raise CollcError(f'{DEMAND_NAME} takes one argument, the demand matrix file: '
                         f'`{DEMAND_NAME}(demand = "m.csv")`', req.collective.span)
    path = Path(args[0][1])
    if not path.is_absolute():
        path = Path(module.filename).resolve().parent / path
    return demand_request(path, topology.num_ranks, size, False, args[0][2])
