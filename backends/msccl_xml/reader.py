"""Read an MSCCL XML program into the data model, keeping every element's line.

ElementTree forgets where elements are, so this reader drives expat directly and records
the line and column of each start tag; every error then names `file:line:col`.

What the reader accepts follows the runtimes that execute these files (the MSCCL executor
in NCCL and RCCL, `src/misc/msccl/msccl_parser.cc`, and the older research runtime):

- `<algo>` must carry `proto`, `nchannels`, `nchunksperloop`, `ngpus`, `coll` and
  `inplace`. `outofplace`, `minBytes` and `maxBytes` are read when present: the current
  executor requires them (and silently skips a file without them), but older generators
  and the older runtime did without, so their absence is left for the verifier to report.
  Other `<algo>` attributes (`redop`, `nbuffers`, `maxcount`, ...) are kept in
  `XmlAlgo.extra_attrs`.
- `<gpu>` needs `id i_chunks o_chunks s_chunks`; `<tb>` needs `id send recv chan`;
  `<step>` needs all of `s type srcbuf srcoff dstbuf dstoff cnt depid deps hasdep`
  (the executor reads every one of them, even for `nop`).
- Elements the executor does not read (TE-CCL's `<copy>` inside `<gpu>`, say) are
  skipped, as the executor skips them, with a warning; so are attributes it would not
  see (its parser keeps 16 per element).
- Integers are decimal. The executor reads them with `strtol(s, NULL, 0)`, which takes
  `010` for octal 8, so a leading zero is an error rather than a silent difference.
"""

from __future__ import annotations

import re
import xml.parsers.expat
from dataclasses import dataclass, field
from pathlib import Path

from collc.backends.msccl_xml.model import (
    BufferName,
    Protocol,
    StepType,
    XmlAlgo,
    XmlGpu,
    XmlStep,
    XmlThreadblock,
)
from collc.diagnostics import CollcError, Span, read_input_bytes
from collc.limits import exceeded, int_limit

# Attributes the executor reads on each element; anything else on <algo> is kept in
# extra_attrs, anything else on the inner elements draws a warning.
ALGO_ATTRS = frozenset({"name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace",
                        "outofplace", "minBytes", "maxBytes"})
GPU_ATTRS = frozenset({"id", "i_chunks", "o_chunks", "s_chunks"})
TB_ATTRS = frozenset({"id", "send", "recv", "chan"})
STEP_ATTRS = frozenset({"s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep"})

_INT = re.compile(r"[+-]?[0-9]+")
# Digits of the largest integer an attribute may hold (the executor's are 64-bit).
MAX_DIGITS = 19
_LEADING_ZERO = re.compile(r"[+-]?0[0-9]+")
# Six integers joined by single spaces, each 0, -1 or a plain decimal without a leading
# zero: a value with a space in it, or an empty one, cannot make such a string.
_PLAIN_INT = r"(?:0|-1|[1-9][0-9]{0,%d})" % (MAX_DIGITS - 1)
_PLAIN_INTS = re.compile(r"(?:%s ){5}%s" % (_PLAIN_INT, _PLAIN_INT))
_STEP_TYPES = {t.value: t for t in StepType}
_BUFFERS = {b.value: b for b in BufferName}
# The executor's XML parser keeps the first 16 attributes of an element and drops the
# rest (MSCCL_MAX_ATTR_COUNT in msccl_parser.h).
MAX_ATTRS = 16


@dataclass
class _Element:
    tag: str
    attrs: dict[str, str]
    line: int
    column: int  # 1-based, the column of the '<'
    # a plain <step> inside a <tb> is read as the parser meets it (`_plain_step`): no
    # element is kept for it (millions at 1,024 GPUs)
    children: list["_Element | XmlStep"] = field(default_factory=list)


@dataclass
class XmlDocument:
    """A read file: the program, where its `<algo>` starts, and what the reader noticed."""

    path: str
    algo: XmlAlgo
    algo_line: int
    warnings: list[CollcError] = field(default_factory=list)
    # line -> column of the first element that starts on it (the model keeps lines only)
    columns: dict[int, int] = field(default_factory=dict)

    def span(self, line: int | None) -> Span:
        """Where an element on `line` starts (the `<algo>` when None)."""
        line = line if line is not None else self.algo_line
        return Span(self.path, line, self.columns.get(line, 1))


def read_xml(path: Path) -> XmlAlgo:
    """The program in an MSCCL XML file; raises `CollcError` (with a Span) on bad input."""
    return read_xml_document(path).algo


def read_xml_document(path: Path) -> XmlDocument:
    """Like `read_xml`, also returning the reader's warnings and the `<algo>` line."""
    path = Path(path)
    try:
        data = read_input_bytes(path)  # a regular file only: a FIFO would block forever
    except OSError as exc:
        raise CollcError(f"cannot read {path}: {exc.strerror or exc}") from None
    return read_xml_bytes(data, str(path))


def read_xml_bytes(data: bytes | str, source: str = "<xml>") -> XmlDocument:
    """Read MSCCL XML from memory; `source` names it in messages."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    root, columns = _parse_tree(data, source)
    reader = _Reader(source)
    algo = reader.algo(root)
    reader.warn_skipped()
    return XmlDocument(source, algo, root.line, reader.warnings, columns)


# --- XML to elements ------------------------------------------------------------------

def _plain_step(attrs: dict[str, str], line: int) -> XmlStep | None:
    """A `<step>` in the common case, read without the per-attribute checks (a file holds
    hundreds of thousands of them): exactly the ten attributes, a known type and buffers,
    integers plain (`_PLAIN_INTS`). None for anything else: `_Reader.step` then reads it
    attribute by attribute and says what is wrong."""
    if len(attrs) != len(STEP_ATTRS):
        return None
    try:  # ten attributes, all of them known ones: exactly STEP_ATTRS
        step_type = _STEP_TYPES.get(attrs["type"])
        srcbuf, dstbuf = _BUFFERS.get(attrs["srcbuf"]), _BUFFERS.get(attrs["dstbuf"])
        raws = (attrs["s"], attrs["srcoff"], attrs["dstoff"], attrs["cnt"], attrs["depid"], attrs["deps"])
        hasdep = attrs["hasdep"]
    except KeyError:
        return None
    if (step_type is None or srcbuf is None or dstbuf is None or hasdep not in ("0", "1")
            or not _PLAIN_INTS.fullmatch(" ".join(raws))):
        return None
    s, srcoff, dstoff, cnt, depid, deps = map(int, raws)
    return XmlStep(s, step_type, srcbuf, srcoff, dstbuf, dstoff, cnt, depid, deps, hasdep == "1", line)


def _parse_tree(data: bytes, source: str) -> tuple[_Element, dict[int, int]]:
    """The root element, and for each line the column where its first element starts."""
    parser = xml.parsers.expat.ParserCreate()
    stack: list[_Element | None] = []
    roots: list[_Element] = []
    columns: dict[int, int] = {}

    def start(tag: str, attrs: dict[str, str]) -> None:
        line = parser.CurrentLineNumber
        columns.setdefault(line, parser.CurrentColumnNumber + 1)
        parent = stack[-1] if stack else None
        if tag == "step" and parent is not None and parent.tag == "tb":
            step = _plain_step(attrs, line)
            if step is not None:
                parent.children.append(step)
                stack.append(None)  # what it contains is ignored, as the executor ignores it
                return
        element = _Element(tag, attrs, line, parser.CurrentColumnNumber + 1)
        if parent is not None:
            parent.children.append(element)
        elif not stack:
            roots.append(element)
        stack.append(element)

    def end(tag: str) -> None:
        stack.pop()

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    try:
        parser.Parse(data, True)
    except xml.parsers.expat.ExpatError as exc:
        raise CollcError(f"malformed XML: {xml.parsers.expat.ErrorString(exc.code)}",
                         Span(source, exc.lineno, exc.offset + 1)) from None
    if not roots:
        raise CollcError("the file holds no XML element", Span(source, 1, 1))
    return roots[0], columns


# --- elements to the model -------------------------------------------------------------

class _Reader:
    def __init__(self, source: str):
        self.source = source
        self.warnings: list[CollcError] = []
        self.skipped: list[tuple[str, _Element]] = []  # (parent tag, element)

    def span(self, element: _Element) -> Span:
        return Span(self.source, element.line, element.column)

    # attribute access ----------------------------------------------------------------
    def text(self, element: _Element, name: str) -> str:
        if name not in element.attrs:
            raise CollcError(f"<{element.tag}> lacks the attribute '{name}'", self.span(element))
        return element.attrs[name]

    def integer(self, element: _Element, name: str, *, minimum: int | None = None,
                limit_name: str | None = None) -> int:
        raw = self.text(element, name)
        if raw.isascii() and raw.isdigit() and len(raw) <= MAX_DIGITS and (raw[0] != "0" or len(raw) == 1):
            # The common case (a plain decimal, checked here without a regex: a file holds
            # hundreds of thousands of them); the bounds below still apply.
            value = int(raw)
            if (minimum is None or value >= minimum) and (limit_name is None or value <= int_limit(limit_name)):
                return value
        elif raw == "-1" and (minimum is None or minimum <= -1) and limit_name is None:
            return -1
        stripped = raw.strip()
        shown = raw if len(raw) <= 24 else raw[:20] + "..."  # an attribute may be megabytes long
        if not _INT.fullmatch(stripped):
            raise CollcError(f"<{element.tag}> attribute {name}=\"{shown}\" is not an integer", self.span(element))
        digits = stripped.lstrip("+-")
        if len(digits) > MAX_DIGITS:  # past the executor's 64-bit integers (and slow to convert)
            raise CollcError(f"<{element.tag}> attribute {name}=\"{shown}\" has {len(digits):,} digits; the "
                             "executor reads 64-bit integers", self.span(element))
        if _LEADING_ZERO.fullmatch(stripped):
            raise CollcError(f"<{element.tag}> attribute {name}=\"{raw}\" has a leading zero, which the executor "
                             "reads as an octal number; write it without", self.span(element))
        value = int(stripped)
        if minimum is not None and value < minimum:
            raise CollcError(f"<{element.tag}> attribute {name}={value} must be at least {minimum}",
                             self.span(element))
        if limit_name is not None and value > int_limit(limit_name):
            raise CollcError(f"<{element.tag}> attribute {name}={value:,} is too large" + exceeded(limit_name),
                             self.span(element))
        return value

    def optional_integer(self, element: _Element, name: str) -> int | None:
        return self.integer(element, name) if name in element.attrs else None

    def flag(self, element: _Element, name: str) -> bool:
        value = self.integer(element, name)
        if value not in (0, 1):
            raise CollcError(f"<{element.tag}> attribute {name}={value} must be 0 or 1", self.span(element))
        return value == 1

    def optional_flag(self, element: _Element, name: str) -> bool | None:
        return self.flag(element, name) if name in element.attrs else None

    def buffer(self, element: _Element, name: str) -> BufferName:
        raw = self.text(element, name)
        try:
            return BufferName(raw)
        except ValueError:
            raise CollcError(f"<{element.tag}> attribute {name}=\"{raw}\" is not a buffer (i, o or s)",
                             self.span(element)) from None

    def warn_dropped_attrs(self, element: _Element, read: frozenset[str]) -> None:
        """Attributes the executor reads that fall past the ones its parser keeps."""
        dropped = [name for name in list(element.attrs)[MAX_ATTRS:] if name in read]
        if dropped:
            self.warnings.append(CollcError(
                f"<{element.tag}> has {len(element.attrs)} attributes; the executor's parser keeps the first "
                f"{MAX_ATTRS} and would not see {', '.join(dropped)} (put them first)", self.span(element)))

    def warn_unknown_attrs(self, element: _Element, known: frozenset[str]) -> None:
        unknown = sorted(set(element.attrs) - known)
        if unknown:
            self.warnings.append(CollcError(
                f"<{element.tag}> attribute{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(unknown)} {'are' if len(unknown) > 1 else 'is'} not read by the executor",
                self.span(element)))

    def children(self, element: _Element, tag: str) -> list[_Element]:
        """The children named `tag`; the others are skipped, as the executor skips them."""
        wanted = []
        for child in element.children:
            if type(child) is XmlStep or child.tag == tag:  # type: ignore[union-attr]
                wanted.append(child)
            else:
                self.skipped.append((element.tag, child))  # type: ignore[arg-type]
        return wanted

    def warn_skipped(self) -> None:
        """One warning per kind of skipped element, at its first occurrence."""
        groups: dict[tuple[str, str], list[_Element]] = {}
        for parent, child in self.skipped:
            groups.setdefault((parent, child.tag), []).append(child)
        for (parent, tag), elements in groups.items():
            n = len(elements)
            what = f"{n} <{tag}> elements inside <{parent}> are" if n > 1 else f"<{tag}> inside <{parent}> is"
            self.warnings.append(CollcError(
                f"{what} ignored by the executor{' (the first is here)' if n > 1 else ''}",
                self.span(elements[0])))

    # elements ------------------------------------------------------------------------
    def algo(self, element: _Element) -> XmlAlgo:
        if element.tag != "algo":
            raise CollcError(f"the top element is <{element.tag}>; an MSCCL program is an <algo>",
                             self.span(element))
        self.warn_dropped_attrs(element, ALGO_ATTRS - {"name"})
        raw_proto = self.text(element, "proto")
        try:
            proto = Protocol(raw_proto)
        except ValueError:
            raise CollcError(f"unknown protocol proto=\"{raw_proto}\" (known: "
                             f"{', '.join(p.value for p in Protocol)})", self.span(element)) from None
        algo = XmlAlgo(
            name=element.attrs.get("name", ""),
            proto=proto,
            nchannels=self.integer(element, "nchannels", minimum=1),
            nchunksperloop=self.integer(element, "nchunksperloop", minimum=1, limit_name="chunks"),
            ngpus=self.integer(element, "ngpus", minimum=1, limit_name="ranks"),
            coll=self.text(element, "coll"),
            inplace=self.flag(element, "inplace"),
            outofplace=self.optional_flag(element, "outofplace"),
            min_bytes=self.optional_integer(element, "minBytes"),
            max_bytes=self.optional_integer(element, "maxBytes"),
            extra_attrs={k: v for k, v in element.attrs.items() if k not in ALGO_ATTRS},
        )
        algo.gpus = [self.gpu(g) for g in self.children(element, "gpu")]
        return algo

    def gpu(self, element: _Element) -> XmlGpu:
        self.warn_unknown_attrs(element, GPU_ATTRS)
        self.warn_dropped_attrs(element, GPU_ATTRS)
        gpu = XmlGpu(
            id=self.integer(element, "id", minimum=0),
            i_chunks=self.integer(element, "i_chunks", minimum=0, limit_name="chunks"),
            o_chunks=self.integer(element, "o_chunks", minimum=0, limit_name="chunks"),
            s_chunks=self.integer(element, "s_chunks", minimum=0, limit_name="chunks"),
            line=element.line,
        )
        gpu.tbs = [self.threadblock(t) for t in self.children(element, "tb")]
        return gpu

    def threadblock(self, element: _Element) -> XmlThreadblock:
        self.warn_unknown_attrs(element, TB_ATTRS)
        self.warn_dropped_attrs(element, TB_ATTRS)
        tb = XmlThreadblock(
            id=self.integer(element, "id", minimum=0),
            send=self.integer(element, "send", minimum=-1),
            recv=self.integer(element, "recv", minimum=-1),
            chan=self.integer(element, "chan", minimum=0),
            line=element.line,
        )
        tb.steps = [s if type(s) is XmlStep else self.step(s) for s in self.children(element, "step")]  # type: ignore[arg-type]
        return tb

    def step(self, element: _Element) -> XmlStep:
        self.warn_unknown_attrs(element, STEP_ATTRS)
        self.warn_dropped_attrs(element, STEP_ATTRS)
        raw_type = self.text(element, "type")
        try:
            step_type = StepType(raw_type)
        except ValueError:
            raise CollcError(f"unknown step type=\"{raw_type}\" (known: "
                             f"{', '.join(t.value for t in StepType)})", self.span(element)) from None
        return XmlStep(
            s=self.integer(element, "s"),
            type=step_type,
            srcbuf=self.buffer(element, "srcbuf"),
            srcoff=self.integer(element, "srcoff"),
            dstbuf=self.buffer(element, "dstbuf"),
            dstoff=self.integer(element, "dstoff"),
            cnt=self.integer(element, "cnt"),
            depid=self.integer(element, "depid"),
            deps=self.integer(element, "deps"),
            hasdep=self.flag(element, "hasdep"),
            line=element.line,
        )
