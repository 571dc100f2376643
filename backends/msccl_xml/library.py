"""Size-band libraries: one MSCCL XML program per band of message sizes, in a directory
the executor loads as its algorithm directory (`MSCCL_ALGO_DIR`).

The executor takes the first file whose [minBytes, maxBytes] holds a message, so the
bands of one collective and GPU count must not overlap: they split at the geometric
midpoints between neighbouring bands, in the executor's own measure of a message
(`program.executor_bytes`). An open-ended library (`collc compile --size A,B,...`)
starts at 0 and ends with no upper limit; a bounded one (`collc profile --library`)
starts at its smallest size and ends at its largest, so other sizes stay with NCCL.

Every file is written through `collc.io`'s all-or-nothing writer: a failure (a band
that fails verification, an unwritable directory) installs none of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from collc.backends import BackendOptions, Library, LibraryBand, LibraryFile, LibraryRequest
from collc.backends.msccl_xml.limits import LimitError
from collc.backends.msccl_xml.lowering import lowered_algo
from collc.backends.msccl_xml.model import XmlAlgo
from collc.backends.msccl_xml.program import executor_bytes
from collc.backends.msccl_xml.reader import read_xml_bytes
from collc.backends.msccl_xml.verify import VerifyReport, verify_document
from collc.backends.msccl_xml.writer import (
    algo_to_xml, band_file_name, check_library_directory, library_prefix, write_algo,
)
from collc.diagnostics import CollcError
from collc.io import all_or_nothing, atomic_write
from collc.ir.heap import few_collections


def message_bytes(band: LibraryBand, size: int) -> int:
    """The executor's measure of a message of `size` bytes of the band's collective."""
    return executor_bytes(band.collective, size)


def band_ranges(bands: Sequence[LibraryBand], open_ended: bool = False) -> list[tuple[int, int]]:
    """Inclusive executor-byte ranges for bands of one (collective, GPU count), sorted by
    size; where `open_ended`, the first starts at 0 and the last has maxBytes 0, which
    the executor reads as "no upper limit"."""
    out: list[tuple[int, int]] = []
    for i, band in enumerate(bands):
        smallest, largest = message_bytes(band, min(band.sizes)), message_bytes(band, max(band.sizes))
        lo, hi = smallest, largest
        if i > 0:
            prev = message_bytes(bands[i - 1], max(bands[i - 1].sizes))
            lo = max(math.isqrt(prev * smallest) + 1, prev + 1)
        elif open_ended:
            lo = 0
        if i + 1 < len(bands):
            nxt = message_bytes(bands[i + 1], min(bands[i + 1].sizes))
            hi = min(math.isqrt(largest * nxt), nxt - 1)
        elif open_ended:
            out.append((lo, 0))
            continue
        out.append((lo, max(lo, hi)))
    return out


def emit_library(request: LibraryRequest, options: BackendOptions) -> Library:
    """Plan, write (and where asked verify) the library; `Backend.emit_library`."""
    bands = request.bands
    # An open-ended library is one collective compiled at several sizes: its schedules
    # must all lower (a runtime limit is the user's error), a bounded one keeps a band
    # the executor cannot run with NCCL.
    algos = open_library_algos(bands, options) if request.open_ended else {}
    refused: dict[int, str] = {}
    planned: list[tuple[int, XmlAlgo, tuple[int, int], str]] = []
    for indices in grouped(bands):
        for i, rng in zip(indices, band_ranges([bands[i] for i in indices], request.open_ended)):
            if bands[i].unit is None:
                continue
            if i not in algos:
                try:
                    algos[i] = lowered_algo(bands[i].unit, options)
                except LimitError as err:  # beyond the executor's limits: NCCL keeps the band
                    refused[i] = f"MSCCL XML limits: {err}"
                    continue
            algo = algos[i]
            index = sum(1 for _, a, _, _ in planned if a.coll == algo.coll and a.ngpus == algo.ngpus)
            planned.append((i, algo, rng, band_file_name(algo.coll, algo.ngpus, algo.inplace, index, rng)))
    directory = Path(request.directory)
    prefixes: dict[str, set[str]] = {}
    for _, algo, _, name in planned:
        prefixes.setdefault(library_prefix(algo.coll, algo.ngpus, algo.inplace), set()).add(name)
    for prefix, names in prefixes.items():  # stale bands of the same library: refuse before writing
        check_library_directory(directory, prefix, names)
    if not planned:
        return Library((), refused)
    if request.verify:
        return Library(_write_verified(planned, directory), refused)
    files = []
    with all_or_nothing():
        for i, algo, (lo, hi), name in planned:
            path = write_algo(replace(algo, min_bytes=lo, max_bytes=hi), directory / name)
            files.append(LibraryFile(i, path, lo, hi, None))
    return Library(tuple(files), refused)


def _write_verified(planned: list[tuple[int, XmlAlgo, tuple[int, int], str]], directory: Path) -> tuple[LibraryFile, ...]:
    """Verify each file's text with `collc verify`'s verifier, then install them all."""
    texts = [algo_to_xml(replace(algo, min_bytes=lo, max_bytes=hi)) for _, algo, (lo, hi), _ in planned]
    reports = [verify_text(text, directory / name) for text, (_, _, _, name) in zip(texts, planned)]
    bad = [r for r in reports if not r.ok]
    if bad:
        raise CollcError(f"{len(bad)} library file(s) failed verification: "
                         + "; ".join(f"{Path(r.source).name}: {r.errors[0]}" for r in bad))
    with all_or_nothing():
        paths = [atomic_write(directory / name, text) for text, (_, _, _, name) in zip(texts, planned)]
    return tuple(LibraryFile(i, path, lo, hi, report.summary())
                 for (i, _, (lo, hi), _), path, report in zip(planned, paths, reports))


def verify_text(text: str, path: Path) -> VerifyReport:
    """What `collc verify` would report for `text` written at `path`."""
    try:
        with few_collections():  # a large program is many small objects kept to the end
            return verify_document(read_xml_bytes(text, str(path)))
    except CollcError as err:
        return VerifyReport(str(path), None, [err])


def grouped(bands: Sequence[LibraryBand]) -> list[list[int]]:
    """Band indices per (collective, ranks), in that order, each sorted by smallest size."""
    groups: dict[tuple[str, int], list[int]] = {}
    for i, band in enumerate(bands):
        groups.setdefault((band.collective.name, band.collective.ranks), []).append(i)
    return [sorted(indices, key=lambda i: min(bands[i].sizes)) for _, indices in sorted(groups.items())]


def open_library_algos(bands: Sequence[LibraryBand], options: BackendOptions) -> dict[int, XmlAlgo]:
    """Every band's lowered program, for a library of one collective compiled at several
    sizes: one size per band, all positive and distinct to the executor."""
    sizes = [min(band.sizes) for band in bands]
    if any(s <= 0 for s in sizes):
        raise CollcError(f"write_library: sizes must be positive, got {sorted(sizes)}")
    order = sorted(range(len(bands)), key=lambda i: sizes[i])
    for a, b in zip(order, order[1:]):
        if sizes[a] == sizes[b]:
            raise CollcError(f"write_library: two units are compiled for {sizes[a]} bytes; give each size one "
                             "schedule")
    algos: dict[int, XmlAlgo] = {}
    for i in order:
        unit = bands[i].unit
        if unit is None or (unit.schedule is None and not isinstance(unit.lowered, XmlAlgo)):
            raise CollcError(f"write_library: the unit for {sizes[i]} bytes has no schedule")
        algos[i] = lowered_algo(unit, options)
    first = algos[order[0]]
    for i in order[1:]:
        algo = algos[i]
        if (algo.coll, algo.ngpus, algo.inplace) != (first.coll, first.ngpus, first.inplace):
            raise CollcError(f"write_library: a library holds one collective; got {first.coll} on {first.ngpus} "
                             f"GPUs and {algo.coll} on {algo.ngpus} GPUs"
                             + (" (in place and out of place mixed)" if algo.inplace != first.inplace else ""))
    for a, b in zip(order, order[1:]):
        if message_bytes(bands[a], sizes[a]) >= message_bytes(bands[b], sizes[b]):
            raise CollcError(f"write_library: sizes {sizes[a]} and {sizes[b]} are the same message size to the "
                             "executor")
    return algos
