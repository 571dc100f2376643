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

`dumps` gives the same text as one string, made by the standard library's C encoder
where json.dumps would use its pure-Python one: with an indent, json.dumps encodes in
Python generators (its C encoder only writes without one), and a bubble report of a
million bubbles took seconds there. `dumps` builds the text from a list of pieces, with
one branch per value instead of a generator per container, and hands each dict of plain
values (a bubble, say), and each list of such dicts, to the C encoder whole: its
separators are set to the newline and indent that `indent=1` would put between the
items, so only the braces' newlines are added here. It knows the values reports hold
(dicts with string keys, lists, tuples, str, int, float, bool, None); for anything else
it leaves the whole document to json.dumps. Batches of `indented_json` that orjson
cannot write as json.dumps would (floats, nulls) go through `dumps` too.

A list whose owner can write its items' text faster still than orjson and the
rewriting (a schedule's ops: one format per op, no dicts) comes as a `WrittenList`.
"""

from __future__ import annotations

import json
import json.encoder
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from json.encoder import encode_basestring_ascii
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
    return dumps(value).replace("\n", "\n" + " " * level).encode()


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
    return _reindented_items(raw, level)


def _reindented_items(raw: bytes, level: int, depth: int | None = None) -> bytes:
    """orjson's text of a non-empty list (OPT_INDENT_2) rewritten as `list_items_text`
    returns it: non-ASCII and DEL escaped as json.dumps escapes them, indented by one
    per level from `level`. `depth`: how deep its lines are indented, where the caller
    knows (else looked for)."""
    if not raw.isascii():
        raw = _NON_ASCII.sub(_ascii_escape, raw.decode()).encode()
    body = b"\n" + raw[2:-2]  # within "[\n" ... "\n]"
    if b"\x7f" in body:
        body = body.replace(b"\x7f", b"\\u007f")
    if depth is None:
        depth = 1
        while b"\n" + b"  " * (depth + 1) in body:
            depth += 1
    for d in range(depth, 0, -1):
        body = body.replace(b"\n" + b"  " * d, b"\n" + b"\t" * (level + d - 1))
    return body[1:].translate(_TAB_TO_SPACE)


def flat_dicts_text(items: list[Any] | tuple[Any, ...], level: int) -> bytes | None:
    """`list_items_text` of a non-empty list of non-empty dicts of plain values (str,
    int, float, bool, None), floats included: a bubble report's million bubbles. None
    for any other list, or where orjson's text could differ from json.dumps's.

    orjson writes a finite float with the digits of `repr` (both the shortest that
    read back as the same float) and, between 1e-4 and 1e16, in the same positional
    form; outside that range it may not (1e-05 as 0.00001), so each number written with
    an exponent or with four zeros after its point is written again by `repr` (it reads
    back as the same float). In orjson's indented text of flat dicts each line holds one
    key and its value, and a string value ends in a quote, so a number value is the
    only token that ends a line after a key's ': '. NaN and the infinities orjson
    writes as null, so a list holding one is refused first."""
    if not items or set(map(type, items)) != {dict} or not all(items):
        return None
    values = list(chain.from_iterable(map(dict.values, items)))
    types = set(map(type, values))
    if not types <= _PLAIN_TYPES:
        return None
    try:
        raw = orjson.dumps(items, option=_ORJSON_OPTIONS)
    except TypeError:  # keys not str, integers past 64 bits
        return None
    # Each None is one null; any other null is a NaN or an infinity (or a string holding
    # "null": refused too, by the same count).
    if float in types and raw.count(b"null") != values.count(None):
        return None
    # orjson's exponents are signed (1e-7, 1e+16): plain searches, not a pattern's scan.
    if float in types and (b"e-" in raw or b"e+" in raw or b"0.0000" in raw):
        raw = _OTHER_FLOAT_VALUE.sub(_repr_float_value, raw)
    return _reindented_items(raw, level, depth=2)


def _repr_float_value(match: re.Match[bytes]) -> bytes:
    return b": " + float.__repr__(float(match.group(1))).encode()


_PLAIN_TYPES = frozenset((str, int, float, bool, type(None)))
# A number orjson may write otherwise than repr, as a flat dict's value in its indented text.
_OTHER_FLOAT_VALUE = re.compile(rb": (-?(?:[0-9.]+[eE][-+]?[0-9]+|0\.0000[0-9]*))(?=,?$)", re.MULTILINE)


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


# --- json.dumps(indent=1) as one string, by the C encoder ----------------------

INDENT = 1
CONTAINERS = (dict, list, tuple)
# Per nesting level: the writer of a dict of plain values at that level.
_flat_dict_encoders: dict[int, Callable[[dict], str]] = {}


def _flat_dict_encoder(level: int) -> Callable[[dict], str]:
    """The C encoder (made once: `JSONEncoder.encode` makes one per call) with the item
    separator of `indent=1` at `level`; the pure one where there is no C encoder."""
    item_separator = ",\n" + " " * (INDENT * (level + 1))
    make = json.encoder.c_make_encoder
    if make is not None:
        try:
            encode = make(None, json.JSONEncoder().default, encode_basestring_ascii, None, ": ", item_separator,
                          False, False, True)
        except TypeError:  # another signature in another Python
            pass
        else:
            return lambda value: "".join(encode(value, 0))
    return json.JSONEncoder(separators=(item_separator, ": ")).encode


class _Unusual(Exception):
    """A value this writer does not know: `json.dumps` writes the whole document."""


def _float(value: float) -> str:
    if value != value:
        return "NaN"
    if value == float("inf"):
        return "Infinity"
    if value == -float("inf"):
        return "-Infinity"
    return float.__repr__(value)


def _scalar(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return encode_basestring_ascii(value)
    if kind is float:
        return _float(value)
    if kind is int:
        return int.__repr__(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    raise _Unusual


def _flat_dict(value: dict, level: int) -> str | None:
    """The text of a non-empty dict of string keys and plain values; None for any other."""
    for key, item in value.items():
        if type(key) is not str or type(item) in CONTAINERS:
            return None
    encode = _flat_dict_encoders.get(level)
    if encode is None:
        encode = _flat_dict_encoders[level] = _flat_dict_encoder(level)
    text = encode(value)  # '{"a": 1,\n  "b": 2}': the braces still need their newlines
    return "{\n" + " " * (INDENT * (level + 1)) + text[1:-1] + "\n" + " " * (INDENT * level) + "}"


def _is_flat_dict(value: Any) -> bool:
    if type(value) is not dict or not value:
        return False
    for key, item in value.items():
        if type(key) is not str or type(item) in CONTAINERS:
            return False
    return True


def _flat_dict_list(value: list | tuple, level: int) -> str | None:
    """The text of a non-empty list of flat dicts (a rank's bubbles), by orjson where its
    text is json.dumps's (`flat_dicts_text`), else in one call of the C encoder; None
    for any other list.

    The C encoder writes every item separator as the one inside the dicts (level + 2);
    between two dicts it writes '},' + separator + '{', which occurs nowhere else (inside
    a flat dict a separator is followed by a key's quote, and a string holds no raw
    newline), so replacing it gives the list's own separator and the braces' newlines."""
    if not value:
        return None
    fast = flat_dicts_text(value, level + 1)
    if fast is not None:
        return "[\n" + fast.decode() + "\n" + " " * (INDENT * level) + "]"
    for item in value:
        if not _is_flat_dict(item):
            return None
    inner, outer = " " * (INDENT * (level + 2)), " " * (INDENT * (level + 1))
    encode = _flat_dict_encoders.get(level + 1)
    if encode is None:
        encode = _flat_dict_encoders[level + 1] = _flat_dict_encoder(level + 1)
    text = encode(value)  # '[{"a": 1,\n  "b": 2},\n  {"a": ...}]'
    body = text[2:-2].replace("},\n" + inner + "{", "\n" + outer + "},\n" + outer + "{\n" + inner)
    return "[\n" + outer + "{\n" + inner + body + "\n" + outer + "}\n" + " " * (INDENT * level) + "]"


def _write(value: Any, level: int, out: list[str]) -> None:
    kind = type(value)
    if kind is dict:
        if not value:
            out.append("{}")
            return
        flat = _flat_dict(value, level)
        if flat is not None:
            out.append(flat)
            return
        inner = "\n" + " " * (INDENT * (level + 1))
        out.append("{")
        first = True
        for key, item in value.items():
            if type(key) is not str:
                raise _Unusual
            out.append(inner if first else "," + inner)
            first = False
            out.append(encode_basestring_ascii(key))
            out.append(": ")
            if type(item) is dict or type(item) is list or type(item) is tuple:
                _write(item, level + 1, out)
            else:
                out.append(_scalar(item))
        out.append("\n" + " " * (INDENT * level) + "}")
    elif kind is list or kind is tuple:
        if not value:
            out.append("[]")
            return
        flat = _flat_dict_list(value, level)
        if flat is not None:
            out.append(flat)
            return
        inner = "\n" + " " * (INDENT * (level + 1))
        out.append("[")
        first = True
        for item in value:
            out.append(inner if first else "," + inner)
            first = False
            if type(item) is dict or type(item) is list or type(item) is tuple:
                _write(item, level + 1, out)
            else:
                out.append(_scalar(item))
        out.append("\n" + " " * (INDENT * level) + "]")
    else:
        out.append(_scalar(value))


def dumps(value: Any) -> str:
    """`json.dumps(value, indent=1)`, the same text, by orjson and the C encoder (see
    the module's docstring)."""
    return "".join(text_pieces(value))


def text_pieces(value: Any) -> list[str]:
    """`dumps(value)` in pieces, to be written one after the other: a million-bubble
    report is 200 MB of text, and joining the pieces would hold it twice."""
    out: list[str] = []
    try:
        _write(value, 0, out)
    except _Unusual:
        return [json.dumps(value, indent=INDENT)]
    return out
