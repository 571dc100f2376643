"""Writing MSCCL XML: one program to one file, or a library of size bands.

The document is built with ElementTree. The executors read it with a small hand-written
parser (msccl_parser.cc), so the text keeps to what that parser and every file known to
load have: attributes in double quotes separated by single spaces, no XML declaration
(the parser expects `<` and an element name first), indentation by spaces, and empty
elements closed as `/>`.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from collc.backends.msccl_xml.model import XmlAlgo, XmlStep
from collc.diagnostics import CollcError
from collc.io import atomic_write


def algo_element(algo: XmlAlgo) -> ET.Element:
    """The `<algo>` element with every attribute the current executor requires."""
    root = ET.Element("algo", {
        "name": algo.name,
        "proto": algo.proto.value,
        "nchannels": str(algo.nchannels),
        "nchunksperloop": str(algo.nchunksperloop),
        "ngpus": str(algo.ngpus),
        "coll": algo.coll,
        "inplace": _flag(algo.inplace),
        "outofplace": _flag(algo.outofplace if algo.outofplace is not None else not algo.inplace),
        "minBytes": str(algo.min_bytes or 0),
        "maxBytes": str(algo.max_bytes or 0),
        **algo.extra_attrs,
    })
    for gpu in algo.gpus:
        g = ET.SubElement(root, "gpu", {"id": str(gpu.id), "i_chunks": str(gpu.i_chunks),
                                        "o_chunks": str(gpu.o_chunks), "s_chunks": str(gpu.s_chunks)})
        for tb in gpu.tbs:
            t = ET.SubElement(g, "tb", {"id": str(tb.id), "send": str(tb.send), "recv": str(tb.recv),
                                        "chan": str(tb.chan)})
            for step in tb.steps:
                ET.SubElement(t, "step", _step_attrs(step))
    return root


def _step_attrs(step: XmlStep) -> dict[str, str]:
    return {
        "s": str(step.s), "type": step.type.value,
        "srcbuf": step.srcbuf.value if step.srcbuf is not None else "i", "srcoff": str(step.srcoff),
        "dstbuf": step.dstbuf.value if step.dstbuf is not None else "o", "dstoff": str(step.dstoff),
        "cnt": str(step.cnt), "depid": str(step.depid), "deps": str(step.deps), "hasdep": _flag(step.hasdep),
    }


def _flag(value: bool) -> str:
    return "1" if value else "0"


def algo_to_xml(algo: XmlAlgo) -> str:
    root = algo_element(algo)
    ET.indent(root, space="  ")
    text = ET.tostring(root, encoding="unicode")
    # ElementTree closes empty elements as ` />`; the runtimes' own files all use `/>`.
    # Attribute values are numbers and tokens, so the only ` />` is that terminator.
    return text.replace(" />", "/>") + "\n"


def write_algo(algo: XmlAlgo, path: str | Path) -> Path:
    """Write one program atomically; returns the path."""
    return atomic_write(path, algo_to_xml(algo))


# --- a library of size bands ---------------------------------------------------------------

def size_bands(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Inclusive [minBytes, maxBytes] bands, one per size (sorted ascending), split at
    the geometric midpoints; the first starts at 0 and the last has maxBytes 0, which
    the executor reads as "no upper limit"."""
    bands = []
    for i, size in enumerate(sizes):
        lo = 0 if i == 0 else bands[-1][1] + 1
        hi = 0 if i == len(sizes) - 1 else math.isqrt(size * sizes[i + 1])
        bands.append((lo, hi))
    return bands


def band_file_name(coll: str, ngpus: int, inplace: bool, index: int, band: tuple[int, int]) -> str:
    lo, hi = band
    mode = "inplace" if inplace else "outofplace"
    return f"{coll}-n{ngpus}-{mode}-band{index}-{lo}B-to-{hi if hi else 'max'}{'B' if hi else ''}.xml"


def library_prefix(coll: str, ngpus: int, inplace: bool) -> str:
    return f"{coll}-n{ngpus}-{'inplace' if inplace else 'outofplace'}-band"


def check_library_directory(directory: Path, prefix: str, names: set[str]) -> None:
    """The executor parses every regular file of its algorithm directory as a program and
    takes the first whose range matches, so the directory must hold nothing else that
    is not XML, and no older band of the same library."""
    if not directory.exists():
        return
    if not directory.is_dir():
        raise CollcError(f"{directory} is not a directory")
    for entry in sorted(directory.iterdir()):
        if not entry.is_file() or entry.name.startswith("."):
            continue
        if entry.suffix != ".xml":
            raise CollcError(f"{directory} holds {entry.name}; the MSCCL executor parses every file of its "
                             "algorithm directory as XML and fails on anything else (write the library to a "
                             "directory of its own)")
        if entry.name.startswith(prefix) and entry.name not in names:
            raise CollcError(f"{directory} already holds {entry.name}, a band of another library for the same "
                             "collective; its size range may overlap the new bands and the executor would pick "
                             "either (remove it first)")
