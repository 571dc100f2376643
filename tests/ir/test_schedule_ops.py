"""Ops are slotted and `Op.make` builds the same op as the constructor."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from collc.diagnostics import Span
from collc.ir.schedule import Buffer, Loc, Op, OpKind


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
