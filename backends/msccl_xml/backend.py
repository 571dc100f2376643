"""`--backend msccl-xml`: a schedule as an MSCCL XML program, and libraries of them.

The program runs on the MSCCL executor in NCCL (`Azure/msccl-executor-nccl`) and RCCL.
Lowering is a pipeline of passes (`lowering.py`); `emit` writes the `XmlAlgo` they leave
in `unit.lowered`. `emit_library` (library.py) writes one program per size band into a
directory the executor can load as its algorithm directory (`MSCCL_ALGO_DIR`);
`write_library` is its open-ended form for units compiled at several sizes.
"""

from __future__ import annotations

from pathlib import Path

from collc.backends.msccl_xml.channels import MAX_TBS_PER_CHANNEL
from collc.backends.msccl_xml.limits import LimitError, PeerLimitError, resident_threadblocks
from collc.backends import Backend, BackendOptions, LibraryBand, LibraryRequest
from collc.backends.msccl_xml.library import emit_library
from collc.backends.msccl_xml.lowering import lowered_algo, lowering_pipeline
from collc.backends.msccl_xml.program import coll_token
from collc.backends.msccl_xml.threadblocks import topology_sms
from collc.backends.msccl_xml.writer import write_algo
from collc.diagnostics import CollcError
from collc.passes.base import CompileUnit


def peer_limit(topology, options: BackendOptions) -> int | None:
    """Most peers a GPU can have: one threadblock each per instance, every threadblock of
    the GPU resident at once (SMs - 2); None where the topology declares no SM count."""
    sms = topology_sms(topology)
    return resident_threadblocks(sms) // max(1, options.instances) if sms else None


def emit(unit: CompileUnit, output: Path, options: BackendOptions) -> list[Path]:
    return [write_algo(lowered_algo(unit, options), output)]


def write_library(units: list[CompileUnit], sizes: list[int], directory: Path,
                  options: BackendOptions) -> list[Path]:
    """One XML file per size band, for units of one collective compiled for `sizes`
    (bytes of each rank's output buffer, as `CompileUnit.size_bytes`).

    Bands do not overlap: they split at the geometric midpoints between the compiled
    sizes (in the executor's own measure of a message, see `program.executor_bytes`),
    the first starts at 0 and the last has no upper limit (maxBytes 0). Returns the
    file written for each unit, in the order of `units`."""
    if not units:
        raise CollcError("write_library: no compiled units")
    if len(units) != len(sizes):
        raise CollcError(f"write_library: {len(units)} units but {len(sizes)} sizes")
    bands = tuple(LibraryBand(unit.collective if unit.schedule is None else unit.schedule.collective, (size,), unit)
                  for unit, size in zip(units, sizes))
    library = emit_library(LibraryRequest(bands, Path(directory), open_ended=True, verify=False), options)
    return [f.path for f in sorted(library.files, key=lambda f: f.band)]


BACKEND = Backend(
    name="msccl-xml",
    summary="an MSCCL XML program for the MSCCL executor in NCCL and RCCL",
    lowering=lowering_pipeline,
    emit=emit,
    emit_library=emit_library,
    suffix=".xml",
    # A threadblock runs at most 64 steps and a GPU has at most 32 channels; the runtime
    # itself pipelines each step through its connection buffers, so a few chunks per
    # peer keep links busy. The driver halves this when a schedule still does not fit.
    op_budget=lambda ranks: 1024 * ranks,
    limit_error=LimitError,
    # Each peer of a GPU takes a threadblock of its own (per channel), at most 32 per
    # channel and SMs - 2 per GPU on all channels: a schedule whose GPUs each talk to
    # every other node (133 peers on 128 DGX H100 nodes) cannot be placed, and the
    # driver then asks synthesis for one with at most this many.
    peer_limit_error=PeerLimitError,
    peer_budget=MAX_TBS_PER_CHANNEL,
    peer_limit=peer_limit,
    check_collective=lambda collective, options: coll_token(collective) and None,
)
