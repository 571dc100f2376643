"""Backends: turn a compiled, verified `CompileUnit` into files.

Each backend module defines `BACKEND`, a `Backend` with a name, the lowering pipeline it
needs (pass names registered through the `collc.passes` entry points) and an `emit`
function; a backend whose runtime loads programs by message size also has
`emit_library`, which writes a size-band library (a `LibraryRequest`). Backends read
only the IR; nothing under `collc/` but the commands and the driver imports them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from collc.diagnostics import CollcError


@dataclass(frozen=True)
class BackendOptions:
    inplace: bool = False  # MSCCL: the output buffer aliases the input
    proto: str = "Simple"  # MSCCL protocol: Simple | LL | LL128
    instances: int = 1  # copies of the schedule on separate channels
    size_range: tuple[int, int] | None = None  # bytes [min, max] the file claims; max 0 = no limit
    max_steps_per_tb: int = 64  # the current MSCCL executor's limit
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LibraryBand:
    """One size band of a library: the sizes it serves and the compiled unit serving them.

    A band without a unit stays with the runtime's own algorithms: it gets no file, but
    its sizes still bound its neighbours' ranges. `collective` measures a message as the
    runtime does (the unit's schedule's collective where there is one: its chunks shape
    the measure); bands of one collective name and rank count make one library."""

    collective: Any  # collc.ir.collective.Collective
    sizes: tuple[int, ...]  # bytes of each rank's output buffer, as CompileUnit.size_bytes
    unit: Any = None  # collc.passes.base.CompileUnit, or None


@dataclass(frozen=True)
class LibraryRequest:
    bands: tuple[LibraryBand, ...]
    directory: Path
    # True: the outermost bands reach 0 bytes and no upper limit (the library serves every
    # size). False: they end at their outermost sizes, and other sizes stay with the
    # runtime's own algorithms.
    open_ended: bool = False
    # Run the backend's verifier on every file before any is installed.
    verify: bool = True


@dataclass(frozen=True)
class LibraryFile:
    band: int  # the band's index in the request
    path: Path
    min_bytes: int
    max_bytes: int  # 0: no upper limit
    verified: str | None  # the verifier's summary, where it ran


@dataclass(frozen=True)
class Library:
    files: tuple[LibraryFile, ...]  # in the order they were planned: by collective, then by size
    # band index -> why the runtime cannot run its schedule (the band stays with the
    # runtime's own algorithms); only where the request is not open-ended.
    refused: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Backend:
    name: str
    summary: str
    # Lowering passes run before emit, as pipeline text ("" for none); a function so
    # that options can shape it.
    lowering: Callable[[BackendOptions], str]
    # (unit, output path, options) -> the files written, each written atomically.
    emit: Callable[[Any, Path, BackendOptions], list[Path]]
    # The suffix `-o` gets by default when the user names a directory.
    suffix: str = ""
    # ranks -> the most ops a synthesized schedule should have for this backend (its
    # runtime's limits), or None for no limit beyond synthesis's own.
    op_budget: Callable[[int], int] | None = None
    # The error its lowering raises when a schedule exceeds the runtime's limits.
    limit_error: type[Exception] | None = None
    # The error its lowering raises when a GPU has more peers than the runtime allows,
    # and the most distinct peers per GPU a synthesized schedule is then asked to keep
    # to (None: no such retry).
    peer_limit_error: type[Exception] | None = None
    peer_budget: int | None = None
    # (topology, options) -> the most peers a GPU can have at all on this runtime, or
    # None where unknown: synthesis keeps to peer_budget only where it would exceed this.
    peer_limit: Callable[[Any, BackendOptions], int | None] | None = None
    # (collective, options) -> None, or a CollcError when this backend cannot express
    # the collective at all; run before any schedule is produced.
    check_collective: Callable[[Any, BackendOptions], None] | None = None
    # (request, options) -> the size-band library written, all files or none; None where
    # the backend writes no libraries (then `collc compile` writes a file per size).
    emit_library: Callable[[LibraryRequest, BackendOptions], Library] | None = None
    # Whether `emit` may start on a schedule not yet verified: its files are the
    # schedule's ops written as they are, checked by nothing but the verification, so
    # `collc compile` has them written while it verifies (collc.driver); a failed
    # verification still leaves no file. A backend that checks the schedule as it
    # writes (cupy) says no: its errors must not come before the verification's.
    emits_unverified: bool = False


_MODULES = {
    "json": "collc.backends.json_backend",
    "msccl-xml": "collc.backends.msccl_xml.backend",
    "cupy": "collc.backends.cupy.backend",
}


def backend_names() -> list[str]:
    return list(_MODULES)


def get_backend(name: str) -> Backend:
    if name not in _MODULES:
        raise CollcError(f"unknown backend '{name}' (known backends: {', '.join(_MODULES)})")
    module = importlib.import_module(_MODULES[name])
    return module.BACKEND
