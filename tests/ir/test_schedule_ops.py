"""Ops are slotted and `Op.make` builds the same op as the constructor; their JSON text
written straight from them is json.dumps's of their dicts."""

from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
import pytest

from collc.diagnostics import Span
from collc.ir.schedule import Buffer, Loc, Op, OpKind, ops_json_text
from collc.jsontext import list_items_text


def test_make_equals_the_constructor():
    src, dst = Loc(0, Buffer.INPUT, 1), Loc(2, Buffer.OUTPUT, 3)
    span = Span("a.coll", 4, 5)
    made = Op.make(7, OpKind.REDUCE, src, dst, 2, (1, 3), 4, ("g0", "g2"), span)
    built = Op(7, OpKind.REDUCE, src, dst, 2, (1, 3), 4, ("g0", "g2"), span)
    assert made == built and hash(made) == hash(built)
    assert [getattr(made, f.name) for f in dataclasses.fields(Op)] == \
        [getattr(built, f.name) for f in dataclasses.fields(Op)]
    assert Op.from_json(made.to_json()) == made


def test_ops_are_slotted_frozen_and_still_replaceable():
    op = Op(0, OpKind.COPY, Loc(0, Buffer.INPUT, 0), Loc(1, Buffer.OUTPUT, 0))
    assert not hasattr(op, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):  # an Op is frozen
        op.step = 3  # type: ignore[misc]
    later = dataclasses.replace(op, step=3, deps=(0,))
    assert (later.step, later.deps, later.src) == (3, (0,), op.src)
    assert pickle.loads(pickle.dumps(later)) == later


def _varied_ops() -> list[Op]:
    """Ops of every shape the writer meets: copies and reductions, every buffer, no
    deps or several, routes through switches, counts above one, big numbers."""
    ops = []
    for i in range(40):
        kind = OpKind.REDUCE if i % 3 == 0 else OpKind.COPY
        src = Loc(i % 5, list(Buffer)[i % 3], i * 7)
        dst = Loc((i + 1) % 5, list(Buffer)[(i + 1) % 3], 2**40 + i)
        deps = tuple(range(max(0, i - i % 4), i))
        route = ("gpu[0]", "nvswitch \"a\"", "gpu[1]") if i % 2 else ()
        ops.append(Op(i, kind, src, dst, 1 + i % 2, deps, i // 3, route))
    return ops


@pytest.mark.parametrize("level", [0, 1, 3])
def test_ops_text_is_json_dumps_of_their_dicts(level):
    ops = _varied_ops()
    expected = list_items_text([op.to_json() for op in ops], level)
    assert expected is not None and ops_json_text(ops, level) == expected
    lines = json.dumps([op.to_json() for op in ops], indent=1).splitlines()[1:-1]
    assert ops_json_text(ops, 0).decode().splitlines() == [line[1:] for line in lines]


@pytest.mark.parametrize("change", [
    {"origin": Span("a.coll", 1, 2)},  # written by Span.to_json
    {"step": True},  # json.dumps writes true
    {"id": np.int64(3)},  # not a Python int
    {"deps": [0]},  # a list, not a tuple
    {"src": (0, Buffer.INPUT, 0)},  # a tuple, not a Loc
])
def test_ops_of_other_field_types_are_left_to_their_dicts(change):
    ops = _varied_ops()
    ops[5] = dataclasses.replace(ops[5], **change)
    assert ops_json_text(ops, 2) is None
    assert ops_json_text([], 2) is None
