"""The text `json.dumps(value, indent=1)` gives, made mostly by orjson, in pieces.

The standard encoder with an indent is pure Python: 1.85 million calls, half the wall
time of the README's compile, for the 9.9 MB schedule of AllGather on dgx1. orjson
writes the same documents in C, but not the same text: it indents by 2, writes UTF-8
and DEL raw where json.dumps escapes them as \\uXXXX, writes some floats otherwise
(1e-6 for 1e-06, 0.00001 for 1e-05) and NaN as null. So the long lists, nearly all of
a schedule, go through orjson a batch at a time with their text rewritten to
json.dumps's, and any batch whose text could still differ (a float, a null, a key
that is not a string, an integer past 64 bits) goes through json.dumps itself; the
short parts of a document are written by json.dumps. The bytes are json.dumps's in
every case; only the time differs.

A list whose owner can write its items' text faster still than orjson and the
rewriting (a schedule's ops: one format per op, no dicts) comes as a `WrittenList`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

# A list with at least this many elements is written by orjson, in batches of
# ITEMS_PER_PIECE: the text is written as it is made, never held whole (AllToAll on
# 512 GPUs makes 172 MiB).
LONG_LIST = 64
ITEMS_PER_PIECE = 1 << 13

_ORJSON_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
# A float-like token (a string that only looks like one sends its batch to json.dumps too).
_FLOAT_LIKE = re.compile(rb"[0-9][.eE]")
_NON_ASCII = re.compile("[^\x00-\x7f]")
_TAB_TO_SPACE = bytes.maketrans(b"\t", b" ")


@dataclass(frozen=True)
class WrittenList:
    """A list in a document given to `indented_json`, written as json.dumps writes
    `[to_json(item) for item in items]`: `write(batch, level)` gives a batch of items'
    text as `list_items_text` would for their `to_json` values (None where it cannot
    promise that text: those batches are written from the values)."""

    items: Sequence[Any]
    write: Callable[[Sequence[Any], int], bytes | None]
    to_json: Callable[[Any], Any]


def indented_json(value: Any) -> Iterator[bytes]:
    """json.dumps(value, indent=1) encoded as UTF-8 (all ASCII), in pieces."""
    yield from _pieces(value, 0)


def _pieces(value: Any, level: int) -> Iterator[bytes]:
    """`value` as json.dumps(indent=1) writes it nested `level` deep (its first line
    not indented: the caller wrote what precedes it)."""
    if isinstance(value, WrittenList):
        yield from _written_list(value, level)
    elif type(value) is list and len(value) >= LONG_LIST:
        yield b"[\n"
        for start in range(0, len(value), ITEMS_PER_PIECE):
            batch = value[start:start + ITEMS_PER_PIECE]
            text = list_items_text(batch, level + 1)
            yield (b",\n" if start else b"") + (text if text is not None else _standard_items(batch, level + 1))
        yield b"\n" + b" " * level + b"]"
    elif type(value) is list and value:
        yield b"[\n"
        for i, item in enumerate(value):
            yield (b",\n" if i else b"") + b" " * (level + 1)
            yield from _pieces(item, level + 1)
        yield b"\n" + b" " * level + b"]"
    elif type(value) is dict and value and all(type(key) is str for key in value):
        yield b"{\n"
        for i, (key, item) in enumerate(value.items()):
            yield (b",\n" if i else b"") + b" " * (level + 1) + json.dumps(key).encode() + b": "
            yield from _pieces(item, level + 1)
        yield b"\n" + b" " * level + b"}"
    else:
        yield _standard(value, level)


def _written_list(value: WrittenList, level: int) -> Iterator[bytes]:
    """A `WrittenList` a batch at a time (its text is never held whole)."""
    items = value.items
    if not items:
        yield b"[]"
        return
    yield b"[\n"
    for start in range(0, len(items), ITEMS_PER_PIECE):
        batch = items[start:start + ITEMS_PER_PIECE]
        text = value.write(batch, level + 1)
        if text is None:
            values = list(map(value.to_json, batch))
            text = list_items_text(values, level + 1)
            if text is None:
                text = _standard_items(values, level + 1)
        yield (b",\n" if start else b"") + text
    yield b"\n" + b" " * level + b"]"


def _standard(value: Any, level: int) -> bytes:
    """json.dumps(value, indent=1), its lines after the first indented by `level` more
    (raw newlines occur in its text only between tokens)."""
    return json.dumps(value, indent=1).replace("\n", "\n" + " " * level).encode()


def _standard_items(items: list[Any], level: int) -> bytes:
    """`list_items_text` made by json.dumps."""
    return _standard(items, level - 1)[2:-(level + 1)]  # within "[\n" ... "\n" + indent + "]"


def list_items_text(items: list[Any], level: int) -> bytes | None:
    """The elements of a non-empty list as json.dumps(indent=1) writes them at nesting
    `level` between the list's brackets (`,\\n` between elements, each element's first
    line indented, no newline at either end), made by orjson; None where orjson's text
    could differ from json.dumps's.

    Raw newlines and tabs occur in neither encoder's text but between tokens (strings
    escape them), so the indentation is rewritten by plain replacement, deepest first,
    through tabs: a line already rewritten no longer starts with spaces."""
    try:
        raw = orjson.dumps(items, option=_ORJSON_OPTIONS)
    except TypeError:  # what orjson does not write as json.dumps would (keys not str, big ints)
        return None
    if b"null" in raw or _may_hold_a_float(raw):
        return None
    if not raw.isascii():
        raw = _NON_ASCII.sub(_ascii_escape, raw.decode()).encode()
    body = b"\n" + raw[2:-2].replace(b"\x7f", b"\\u007f")  # within "[\n" ... "\n]"
    depth = 1
    while b"\n" + b"  " * (depth + 1) in body:
        depth += 1
    for d in range(depth, 0, -1):
        body = body.replace(b"\n" + b"  " * d, b"\n" + b"\t" * (level + d - 1))
    return body[1:].translate(_TAB_TO_SPACE)


def _may_hold_a_float(raw: bytes) -> bool:
    """Whether orjson's text may hold a float: every float it writes has a point or a
    signed exponent (the cheap searches first: the pattern's scan costs 0.2 s on 8 MB)."""
    if b"." not in raw and b"e+" not in raw and b"e-" not in raw and b"E" not in raw:
        return False
    return _FLOAT_LIKE.search(raw) is not None


def _ascii_escape(match: re.Match[str]) -> str:
    """json.dumps's escape of one character past ASCII (a surrogate pair past U+FFFF)."""
    n = ord(match.group())
    if n < 0x10000:
        return f"\\u{n:04x}"
    n -= 0x10000
    return f"\\u{0xD800 | (n >> 10) & 0x3FF:04x}\\u{0xDC00 | n & 0x3FF:04x}"
