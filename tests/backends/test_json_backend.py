"""The JSON backend writes what json.dumps would, in pieces, without holding the text."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from collc import frontend, jsontext
from collc.backends import BackendOptions, get_backend, json_backend
from collc.driver import CompileJob, schedule_for_backend
from collc.ir.collective import standard
from collc.ir.schedule import ops_json_text


@pytest.fixture(scope="module")
def unit():
    topo = frontend.resolve_topology("ring(4)")
    job = CompileJob(topo, standard("allgather", 4), 1 << 20, algorithm="ring")
    unit, _ = schedule_for_backend(job, get_backend("json"), BackendOptions())
    return unit


@pytest.mark.parametrize("per_piece", [1, 7, 1 << 13])
def test_the_file_is_json_dumps_byte_for_byte(unit, tmp_path, monkeypatch, per_piece):
    monkeypatch.setattr(jsontext, "ITEMS_PER_PIECE", per_piece)
    out = tmp_path / "s.json"
    json_backend.emit(unit, out, BackendOptions())
    assert out.read_text() == json.dumps(json_backend.document(unit), indent=1) + "\n"


def test_a_large_document_is_written_in_several_pieces(unit, monkeypatch):
    doc = json_backend.document(unit)
    monkeypatch.setattr(jsontext, "LONG_LIST", 4)
    monkeypatch.setattr(jsontext, "ITEMS_PER_PIECE", 10)
    pieces = list(json_backend.encoded(doc))
    assert len(pieces) > 10 and b"".join(pieces).decode() == json.dumps(doc, indent=1) + "\n"


def test_ops_written_straight_from_the_ops_are_json_dumps_too(unit, tmp_path, monkeypatch):
    """Ops with routes and no origin (a synthesized schedule's) take the direct writer."""
    monkeypatch.setattr(jsontext, "ITEMS_PER_PIECE", 5)
    schedule = unit.schedule
    ops = tuple(replace(op, origin=None, route=(f"gpu{op.src.rank}", f"gpu{op.dst.rank}") if op.is_transfer else ())
                for op in schedule.ops)
    routed = replace(unit, schedule=replace(schedule, ops=ops))
    assert ops_json_text(ops[:5], 3) is not None
    out = tmp_path / "s.json"
    json_backend.emit(routed, out, BackendOptions())
    assert out.read_text() == json.dumps(json_backend.document(routed), indent=1) + "\n"
