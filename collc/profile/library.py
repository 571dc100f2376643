"""`--library DIR`: the model's winning bands written as an MSCCL XML algorithm directory.

Every band the model synthesized and found faster than the baseline over its sizes
(collc.profile.model) becomes one file. Bands split at the geometric midpoint between
neighbouring bands (in the executor's own measure of a message, as the backend's
size-band library does), so no two files of one collective and GPU count overlap; the
first band starts at its smallest traced size and the last ends at its largest, so
sizes the job never used, and bands where NCCL does as well, stay with NCCL.

Files are written to a temporary directory beside DIR, verified there with `collc
verify`'s verifier, and only then moved into DIR: a failure leaves DIR as it was.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from collc.backends import BackendOptions
from collc.backends.msccl_xml.backend import lowered_algo
from collc.backends.msccl_xml.limits import LimitError
from collc.backends.msccl_xml.program import executor_bytes
from collc.backends.msccl_xml.verify import verify_files
from collc.backends.msccl_xml.writer import band_file_name, check_library_directory, library_prefix, write_algo
from collc.diagnostics import CollcError
from collc.profile.model import Band, ModelResult, stdlib_collective


@dataclass
class LibraryFile:
    band: Band
    path: Path
    min_bytes: int
    max_bytes: int
    summary: str

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "collective": self.band.collective, "nranks": self.band.nranks,
                "min_bytes": self.min_bytes, "max_bytes": self.max_bytes, "sizes": self.band.sizes,
                "saving_per_iteration_us": self.band.saving_s * 1e6, "verify": self.summary}


def _measure(band: Band, size: int) -> int:
    coll = band.schedule.collective if band.schedule is not None else stdlib_collective(band.collective, band.nranks)
    return executor_bytes(coll, size)


def band_ranges(bands: list[Band]) -> list[tuple[int, int]]:
    """Inclusive executor-byte ranges for bands of one (collective, GPU count), sorted by size."""
    out = []
    for i, band in enumerate(bands):
        lo = _measure(band, min(band.sizes))
        hi = _measure(band, max(band.sizes))
        if i > 0:
            prev = bands[i - 1]
            lo = max(math.isqrt(_measure(prev, max(prev.sizes)) * lo) + 1, _measure(prev, max(prev.sizes)) + 1)
        if i + 1 < len(bands):
            nxt = bands[i + 1]
            hi = min(math.isqrt(hi * _measure(nxt, min(nxt.sizes))), _measure(nxt, min(nxt.sizes)) - 1)
        out.append((lo, max(lo, hi)))
    return out


def write_library(result: ModelResult, directory: Path) -> list[LibraryFile]:
    """Write, verify and install the library; returns its files (none when collc wins nowhere)."""
    directory = Path(directory)
    groups: dict[tuple[str, int], list[Band]] = {}
    for band in result.bands:
        groups.setdefault((band.collective, band.nranks), []).append(band)
    planned: list[tuple[Band, Any, tuple[int, int], str]] = []
    for (coll, nranks), bands in sorted(groups.items()):
        bands.sort(key=lambda b: min(b.sizes))
        for band, rng in zip(bands, band_ranges(bands)):
            if band.saving_s <= 0 or band.unit is None:
                continue
            try:
                algo = lowered_algo(band.unit, BackendOptions())
            except LimitError as err:  # beyond the executor's limits: NCCL keeps the band
                band.withdraw(f"MSCCL XML limits: {err}")
                continue
            index = sum(1 for p in planned if p[1].coll == algo.coll and p[1].ngpus == algo.ngpus)
            planned.append((band, algo, rng, band_file_name(algo.coll, algo.ngpus, algo.inplace, index, rng)))
    prefixes: dict[str, set[str]] = {}
    for _, algo, _, name in planned:
        prefixes.setdefault(library_prefix(algo.coll, algo.ngpus, algo.inplace), set()).add(name)
    for prefix, names in prefixes.items():  # stale bands of the same library: refuse before writing
        check_library_directory(directory, prefix, names)
    if not planned:
        return []
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        written = [write_algo(replace(algo, min_bytes=lo, max_bytes=hi), staging / name)
                   for _, algo, (lo, hi), name in planned]
        reports = verify_files(written)
        bad = [r for r in reports if not r.ok]
        if bad:
            raise CollcError(f"{len(bad)} library file(s) failed verification: "
                             + "; ".join(f"{Path(r.source).name}: {r.errors[0]}" for r in bad))
        directory.mkdir(parents=True, exist_ok=True)
        files = []
        for (band, _, (lo, hi), name), path, rep in zip(planned, written, reports):
            os.replace(path, directory / name)
            files.append(LibraryFile(band, directory / name, lo, hi, rep.summary()))
        return files
    finally:
        shutil.rmtree(staging, ignore_errors=True)
