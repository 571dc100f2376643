"""`--backend msccl-xml`: a schedule as an MSCCL XML program, and libraries of them.

The program runs on the MSCCL executor in NCCL (`Azure/msccl-executor-nccl`) and RCCL.
Lowering is a pipeline of passes (`lowering.py`); `emit` writes the `XmlAlgo` they leave
in `unit.lowered`. `write_library` writes one program per size band into a directory
the executor can load as its algorithm directory (`MSCCL_ALGO_DIR`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from collc.backends.msccl_xml.channels import MAX_TBS_PER_CHANNEL
from collc.backends.msccl_xml.limits import LimitError, PeerLimitError, resident_threadblocks
from collc.backends import Backend, BackendOptions
from collc.backends.msccl_xml.lowering import lower, lowering_pipeline
from collc.backends.msccl_xml.model import XmlAlgo
from collc.backends.msccl_xml.program import coll_token, executor_bytes
from collc.backends.msccl_xml.threadblocks import topology_sms
from collc.backends.msccl_xml.writer import (
    band_file_name, check_library_directory, library_prefix, size_bands, write_algo,
)
from collc.diagnostics import CollcError
from collc.passes.base import CompileUnit


def peer_limit(topology, options: BackendOptions) -> int | None:
    """Most peers a GPU can have: one threadblock each per instance, every threadblock of
    the GPU resident at once (SMs - 2); None where the topology declares no SM count."""
    sms = topology_sms(topology)
    return resident_threadblocks(sms) // max(1, options.instances) if sms else None


def lowered_algo(unit: CompileUnit, options: BackendOptions) -> XmlAlgo:
    """The unit's XmlAlgo, lowering it first when its lowering has not run."""
    if not isinstance(unit.lowered, XmlAlgo):
        unit = lower(unit, options)
    return unit.lowered


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
    if any(s <= 0 for s in sizes):
        raise CollcError(f"write_library: sizes must be positive, got {sorted(sizes)}")
    pairs = sorted(zip(sizes, range(len(units))))
    for (a, _), (b, _) in zip(pairs, pairs[1:]):
        if a == b:
            raise CollcError(f"write_library: two units are compiled for {a} bytes; give each size one schedule")
    algos: list[XmlAlgo] = []
    measures: list[int] = []
    for size, i in pairs:
        unit = units[i]
        if unit.schedule is None and not isinstance(unit.lowered, XmlAlgo):
            raise CollcError(f"write_library: the unit for {size} bytes has no schedule")
        algos.append(lowered_algo(unit, options))
        measures.append(executor_bytes(unit.collective if unit.schedule is None else unit.schedule.collective,
                                       size))
    first = algos[0]
    for algo in algos[1:]:
        if (algo.coll, algo.ngpus, algo.inplace) != (first.coll, first.ngpus, first.inplace):
            raise CollcError(f"write_library: a library holds one collective; got {first.coll} on {first.ngpus} "
                             f"GPUs and {algo.coll} on {algo.ngpus} GPUs"
                             + (" (in place and out of place mixed)" if algo.inplace != first.inplace else ""))
    for (a, _), (b, _), ma, mb in zip(pairs, pairs[1:], measures, measures[1:]):
        if ma >= mb:
            raise CollcError(f"write_library: sizes {a} and {b} are the same message size to the executor")
    bands = size_bands(measures)
    names = [band_file_name(first.coll, first.ngpus, first.inplace, k, band) for k, band in enumerate(bands)]
    directory = Path(directory)
    check_library_directory(directory, library_prefix(first.coll, first.ngpus, first.inplace), set(names))
    written: list[Path | None] = [None] * len(units)
    for (_, i), algo, (lo, hi), name in zip(pairs, algos, bands, names):
        written[i] = write_algo(replace(algo, min_bytes=lo, max_bytes=hi), directory / name)
    return [p for p in written if p is not None]


BACKEND = Backend(
    name="msccl-xml",
    summary="an MSCCL XML program for the MSCCL executor in NCCL and RCCL",
    lowering=lowering_pipeline,
    emit=emit,
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
