"""The XML text, golden files, `emit` and size-band libraries.

Golden files change only on purpose: run with COLLC_UPDATE_GOLDEN=1 to rewrite them,
then review the diff."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

import pytest

import msccl_xml_schedules as ms
from xml_checks import check_structure, check_text

from collc.backends import BackendOptions
from collc.backends.msccl_xml.backend import BACKEND, write_library
from collc.backends.msccl_xml.lowering import lowered_algo
from collc.backends.msccl_xml.program import executor_bytes
from collc.backends.msccl_xml.reader import read_xml, read_xml_bytes
from collc.backends.msccl_xml.verify import verify_file
from collc.backends.msccl_xml.writer import algo_to_xml, size_bands
from collc.diagnostics import CollcError

GOLDEN = Path(__file__).resolve().parent / "golden"
GOLDEN_CASES = {
    # The in-place ring AllGather MSCCLang writes (s, rcs..., r on one threadblock per GPU).
    "ring_allgather_4_inplace.xml": (lambda: ms.ring_allgather(4), BackendOptions(inplace=True)),
    # Out of place, LL, a size range: local copies in their own threadblock, waits on them,
    # rrs / rrcs / rcs / r along the ring.
    "ring_allreduce_3_outofplace_ll.xml": (lambda: ms.ring_allreduce(3),
                                           BackendOptions(proto="LL", size_range=(1024, 1 << 20))),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_files(name, tmp_path):
    build, options = GOLDEN_CASES[name]
    written = BACKEND.emit(ms.unit(build()), tmp_path / name, options)
    assert written == [tmp_path / name]
    text = written[0].read_text()
    if os.environ.get("COLLC_UPDATE_GOLDEN"):
        (GOLDEN / name).write_text(text)
        pytest.skip(f"rewrote {GOLDEN / name}")
    assert text == (GOLDEN / name).read_text()
    report = verify_file(written[0])
    assert report.ok, report.render()


def test_text_is_what_the_executor_parser_reads():
    algo = lowered_algo(ms.unit(ms.ring_allreduce(4)), BackendOptions(proto="LL128", size_range=(0, 4096)))
    text = algo_to_xml(algo)
    check_text(text)
    first = text.splitlines()[0]
    assert first == ('<algo name="ring-allreduce-4" proto="LL128" nchannels="1" nchunksperloop="4" ngpus="4" '
                     'coll="allreduce" inplace="0" outofplace="1" minBytes="0" maxBytes="4096">')
    assert text.endswith("</algo>\n")
    assert '<step s="0" type=' in text and '"/>\n' in text


def test_text_reads_back_to_the_same_program():
    algo = lowered_algo(ms.unit(ms.ring_reducescatter(4)), BackendOptions(instances=2))
    text = algo_to_xml(algo)
    again = read_xml_bytes(text).algo
    assert algo_to_xml(again) == text
    check_structure(again)


def test_emit_lowers_when_needed_and_leaves_no_temporary_file(tmp_path):
    unit = ms.unit(ms.ring_allgather(3))
    out = tmp_path / "sub" / "ag.xml"
    assert BACKEND.emit(unit, out, BackendOptions(inplace=True)) == [out]
    assert sorted(p.name for p in out.parent.iterdir()) == ["ag.xml"]
    assert read_xml(out).inplace


def test_size_bands_split_at_geometric_midpoints():
    assert size_bands([1 << 10]) == [(0, 0)]
    bands = size_bands([1 << 10, 1 << 20, 1 << 30])
    assert bands == [(0, 1 << 15), ((1 << 15) + 1, 1 << 25), ((1 << 25) + 1, 0)]
    assert bands[0][1] == math.isqrt((1 << 10) * (1 << 20))


def test_executor_measures_messages_its_own_way():
    # The executor compares count x sizeMultiplier bytes: the output for AllGather, the
    # input (ranks x output) for ReduceScatter, the buffer for AllReduce.
    assert executor_bytes(ms.ring_allgather(4).collective, 4096) == 4096
    assert executor_bytes(ms.ring_reducescatter(4).collective, 4096) == 4 * 4096
    assert executor_bytes(ms.ring_allreduce(4).collective, 4096) == 4096


def test_library_of_bands(tmp_path):
    sizes = [1 << 12, 1 << 16, 1 << 24]
    units = [ms.unit(ms.ring_allgather(4), s) for s in sizes]
    options = BackendOptions(proto="LL")
    files = write_library(units[::-1], sizes[::-1], tmp_path / "algos", options)[::-1]
    assert [f.name for f in files] == [
        "allgather-n4-outofplace-band0-0B-to-16384B.xml",
        "allgather-n4-outofplace-band1-16385B-to-1048576B.xml",
        "allgather-n4-outofplace-band2-1048577B-to-max.xml",
    ]
    ranges = [(read_xml(f).min_bytes, read_xml(f).max_bytes) for f in files]
    assert ranges == [(0, 16384), (16385, 1048576), (1048577, 0)]
    for f in files:
        report = verify_file(f)
        assert report.ok, report.render()
    # Written again (same bands), the directory is accepted and the files replaced.
    assert write_library(units, sizes, tmp_path / "algos", options) == files


def test_library_bands_use_the_executor_measure(tmp_path):
    sizes = [1 << 10, 1 << 14]
    units = [ms.unit(ms.ring_reducescatter(4), s) for s in sizes]
    files = write_library(units, sizes, tmp_path, BackendOptions())
    midpoint = math.isqrt((4 << 10) * (4 << 14))
    assert [(read_xml(f).min_bytes, read_xml(f).max_bytes) for f in files] == [(0, midpoint), (midpoint + 1, 0)]


def test_library_errors(tmp_path):
    ag = ms.unit(ms.ring_allgather(4))
    with pytest.raises(CollcError, match="two units are compiled for 1024 bytes"):
        write_library([ag, ag], [1024, 1024], tmp_path, BackendOptions())
    with pytest.raises(CollcError, match="2 units but 1 sizes"):
        write_library([ag, ag], [1024], tmp_path, BackendOptions())
    with pytest.raises(CollcError, match="a library holds one collective; got allgather on 4 GPUs and allreduce"):
        write_library([ag, ms.unit(ms.ring_allreduce(4))], [1024, 4096], tmp_path, BackendOptions())
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CollcError, match="holds notes.txt; the MSCCL executor parses every file"):
        write_library([ag], [1024], tmp_path, BackendOptions())
    (tmp_path / "notes.txt").unlink()
    write_library([ag, replace(ag, size_bytes=4096)], [1024, 4096], tmp_path, BackendOptions())
    with pytest.raises(CollcError, match="already holds allgather-n4-outofplace-band0-0B-to-2048B.xml, a band of "
                                         "another library"):
        write_library([ag], [1 << 20], tmp_path, BackendOptions())


SHARED_XML = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "msccl-xml"


@pytest.mark.skipif(not (SHARED_XML / "gen-mscclang__ag_ring_8.xml").is_file(),
                    reason="shared/data is not beside this checkout")
def test_ring_allgather_is_what_mscclang_writes():
    """The in-place ring AllGather of MSCCLang (msccl-tools), step for step."""
    reference = read_xml(SHARED_XML / "gen-mscclang__ag_ring_8.xml")
    ours = lowered_algo(ms.unit(ms.ring_allgather(8)), BackendOptions(inplace=True, proto="LL128"))
    body = lambda algo: algo_to_xml(replace(algo, name="ring")).split("\n", 1)[1]  # noqa: E731
    assert body(ours) == body(reference)
