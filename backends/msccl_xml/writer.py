"""Writing MSCCL XML: one program to one file, or a library of size bands.

The executors read it with a small hand-written parser (msccl_parser.cc), so the text
keeps to what that parser and every file known to load have: attributes in double quotes
separated by single spaces, no XML declaration (the parser expects `<` and an element
name first), indentation by two spaces per level, and empty elements closed as `/>`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path

from collc.backends.msccl_xml.model import BufferName, StepType, XmlAlgo, XmlGpu, XmlStep
from collc.diagnostics import CollcError
from collc.io import atomic_write


def _attrs(pairs: dict[str, str]) -> str:
    return " ".join(f'{k}="{_escape(v)}"' for k, v in pairs.items())


# ElementTree's escaping of attribute values, so the text is what it would write.
_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "\r": "&#13;", "\n": "&#10;",
                          "\t": "&#09;"})


def _escape(value: str) -> str:
    return value.translate(_ESCAPES)


def algo_header(algo: XmlAlgo) -> dict[str, str]:
    """The `<algo>` attributes, with every one the current executor requires."""
    return {
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
    }


# The XML token of every step type and buffer, by identity (an Enum's `.value` runs
# Python code, three per step here).
_TOKEN = {id(member): member.value for member in (*StepType, *BufferName)}


def _step_line(step: XmlStep) -> str:
    # Every value but the enums' tokens is a number, so nothing here needs escaping.
    token = _TOKEN.get
    src, dst = token(id(step.srcbuf), "i"), token(id(step.dstbuf), "o")  # None: i and o
    return (f'      <step s="{step.s}" type="{token(id(step.type))}" srcbuf="{src}" srcoff="{step.srcoff}" '
            f'dstbuf="{dst}" dstoff="{step.dstoff}" cnt="{step.cnt}" depid="{step.depid}" deps="{step.deps}" '
            f'hasdep="{"1" if step.hasdep else "0"}"/>')


def _flag(value: bool) -> str:
    return "1" if value else "0"


def algo_xml_parts(algo: XmlAlgo) -> Iterator[str]:
    """The program's text in pieces, one per `<gpu>` (and the `<algo>` lines), so that a
    1,024-GPU program (about 250 MiB of text) is written without being held whole."""
    if not algo.gpus:
        yield f"<algo {_attrs(algo_header(algo))}/>\n"
        return
    yield f"<algo {_attrs(algo_header(algo))}>\n"
    for gpu in algo.gpus:
        yield _gpu_text(gpu)
    yield "</algo>\n"


def _gpu_text(gpu: XmlGpu) -> str:
    head = f'  <gpu id="{gpu.id}" i_chunks="{gpu.i_chunks}" o_chunks="{gpu.o_chunks}" s_chunks="{gpu.s_chunks}"'
    if not gpu.tbs:
        return head + "/>\n"
    lines = [head + ">"]
    for tb in gpu.tbs:
        tb_head = f'    <tb id="{tb.id}" send="{tb.send}" recv="{tb.recv}" chan="{tb.chan}"'
        if not tb.steps:
            lines.append(tb_head + "/>")
            continue
        lines.append(tb_head + ">")
        lines.extend(map(_step_line, tb.steps))
        lines.append("    </tb>")
    lines.append("  </gpu>\n")
    return "\n".join(lines)


def algo_to_xml(algo: XmlAlgo) -> str:
    """The program as text, written line by line (a 256-GPU program has over 100,000
    steps; building an element tree first took several times as long)."""
    return "".join(algo_xml_parts(algo))


def write_algo(algo: XmlAlgo, path: str | Path) -> Path:
    """Write one program atomically, a `<gpu>` at a time; returns the path."""
    return atomic_write(path, algo_xml_parts(algo))


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
