"""The reports' JSON text, written faster than `json.dumps(obj, indent=1)` and equal to it
byte for byte.

With an indent, the standard library encodes in Python generators (its C encoder only
writes without one): a bubble report of a million bubbles took seconds there. This
writer builds the same text from a list of pieces, with one branch per value instead of
a generator per container, and hands each dict of plain values (a bubble, say) to the C
encoder whole: its separators are set to the newline and indent that `indent=1` would
put between the items, so only the braces' newlines are added here. It knows the values reports hold (dicts with string keys,
lists, tuples, str, int, float, bool, None); anything else is left to `json.dumps`.
"""

from __future__ import annotations

import json
import json.encoder
from json.encoder import encode_basestring_ascii
from typing import Any, Callable

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
    """The text of a non-empty list of flat dicts (a rank's bubbles), in one call of the C
    encoder; None for any other list.

    The encoder writes every item separator as the one inside the dicts (level + 2);
    between two dicts it writes '},' + separator + '{', which occurs nowhere else (inside
    a flat dict a separator is followed by a key's quote, and a string holds no raw
    newline), so replacing it gives the list's own separator and the braces' newlines."""
    if not value:
        return None
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
    """`json.dumps(value, indent=1)`, the same text."""
    out: list[str] = []
    try:
        _write(value, 0, out)
    except _Unusual:
        return json.dumps(value, indent=INDENT)
    return "".join(out)
