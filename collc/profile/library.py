"""`--library DIR`: the model's winning bands written as an MSCCL XML algorithm directory.

Every band the model synthesized and found faster than the baseline over its sizes
(collc.profile.model) becomes one file, written by the backend's size-band library
writer (`Backend.emit_library`, through the driver). Bands split at the geometric
midpoint between neighbouring bands (in the executor's own measure of a message), so no
two files of one collective and GPU count overlap; the first band starts at its
smallest traced size and the last ends at its largest, so sizes the job never used, and
bands where NCCL does as well, stay with NCCL.

Every file is verified with `collc verify`'s verifier before any is written, and they
are installed together or not at all: a failure leaves DIR as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collc.driver import LibraryBand, emit_library
from collc.profile.model import Band, ModelResult, stdlib_collective

# The runtime the library is for: the MSCCL executor in NCCL and RCCL.
LIBRARY_BACKEND = "msccl-xml"


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


def library_band(band: Band) -> LibraryBand:
    """The band as the library writer takes it: a band where NCCL does as well (or that
    has no schedule) gets no file, but still bounds its neighbours' ranges."""
    collective = (band.schedule.collective if band.schedule is not None
                  else stdlib_collective(band.collective, band.nranks))
    return LibraryBand(collective, tuple(band.sizes), band.unit if band.saving_s > 0 else None)


def write_library(result: ModelResult, directory: Path) -> list[LibraryFile]:
    """Write, verify and install the library; returns its files (none when collc wins
    nowhere). A band the executor cannot run is withdrawn: NCCL keeps it."""
    library = emit_library(LIBRARY_BACKEND, [library_band(b) for b in result.bands], Path(directory))
    for index, why in library.refused.items():
        result.bands[index].withdraw(why)
    return [LibraryFile(result.bands[f.band], f.path, f.min_bytes, f.max_bytes, f.verified or "")
            for f in library.files]
