"""Size-band libraries through `Backend.emit_library`: ranges, bands left to the
runtime, refusals, verification and all-or-nothing installation."""

from __future__ import annotations

import pytest

import msccl_xml_schedules as ms

from collc import frontend
from collc.backends import BackendOptions, LibraryBand, LibraryRequest
from collc.backends.msccl_xml import library
from collc.backends.msccl_xml.backend import BACKEND
from collc.backends.msccl_xml.limits import LimitError
from collc.backends.msccl_xml.reader import read_xml
from collc.backends.msccl_xml.verify import VerifyReport
from collc.backends.msccl_xml.writer import size_bands
from collc.diagnostics import CollcError


def _band(sizes: list[int], unit=None) -> LibraryBand:
    collective = unit.schedule.collective if unit is not None else frontend.resolve_collective("allgather", 4)
    return LibraryBand(collective, tuple(sizes), unit)


def test_band_ranges_do_not_overlap_and_hold_their_sizes():
    coll = frontend.resolve_collective("allgather", 8)
    bands = [LibraryBand(coll, tuple(s)) for s in ([4096, 8192], [1 << 20], [1 << 24, 1 << 25])]
    ranges = library.band_ranges(bands)
    assert all(lo <= hi for lo, hi in ranges)
    assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))
    assert ranges[0][0] == 4096 and ranges[-1][1] == 1 << 25


@pytest.mark.parametrize("sizes", [[1 << 10], [1 << 10, 1 << 20], [1000, 1001, 5 << 20, 1 << 30]])
def test_open_ended_ranges_of_single_sizes_are_the_size_bands(sizes):
    coll = frontend.resolve_collective("allgather", 8)
    bands = [LibraryBand(coll, (s,)) for s in sizes]
    assert library.band_ranges(bands, open_ended=True) == size_bands(sizes)


def test_a_bounded_library_leaves_bands_without_a_schedule_to_the_runtime(tmp_path):
    small, large = ms.unit(ms.ring_allgather(4), 1 << 12), ms.unit(ms.ring_allgather(4), 1 << 24)
    bands = (_band([1 << 12], small), _band([1 << 16]), _band([1 << 24], large))
    lib = BACKEND.emit_library(LibraryRequest(bands, tmp_path / "algos"), BackendOptions())
    assert [f.band for f in lib.files] == [0, 2] and lib.refused == {}
    assert [f.path.name for f in lib.files] == ["allgather-n4-outofplace-band0-4096B-to-16384B.xml",
                                                "allgather-n4-outofplace-band1-1048577B-to-16777216B.xml"]
    for f in lib.files:
        algo = read_xml(f.path)
        assert (algo.min_bytes, algo.max_bytes) == (f.min_bytes, f.max_bytes)
        assert f.verified == "ok (allgather, 4 GPUs, " + f.verified.split(", 4 GPUs, ", 1)[1]
    assert sorted(p.name for p in (tmp_path / "algos").iterdir()) == [f.path.name for f in lib.files]


def test_a_band_beyond_the_executors_limits_is_refused_and_the_others_written(tmp_path, monkeypatch):
    small, large = ms.unit(ms.ring_allgather(4), 1 << 12), ms.unit(ms.ring_allgather(4), 1 << 24)
    lowered = library.lowered_algo

    def lower(unit, options):
        if unit is large:
            raise LimitError("too many steps")
        return lowered(unit, options)

    monkeypatch.setattr(library, "lowered_algo", lower)
    lib = BACKEND.emit_library(LibraryRequest((_band([1 << 12], small), _band([1 << 24], large)), tmp_path),
                               BackendOptions())
    assert lib.refused == {1: "MSCCL XML limits: too many steps"}
    assert [f.band for f in lib.files] == [0]


def test_a_file_that_fails_verification_installs_nothing(tmp_path, monkeypatch):
    units = [ms.unit(ms.ring_allgather(4), s) for s in (1 << 12, 1 << 24)]
    real = library.verify_text

    def verify(text, path):
        if "band1" in path.name:
            return VerifyReport(str(path), None, [CollcError("a planted error")])
        return real(text, path)

    monkeypatch.setattr(library, "verify_text", verify)
    request = LibraryRequest(tuple(_band([u.size_bytes], u) for u in units), tmp_path / "lib" / "algos")
    with pytest.raises(CollcError, match=r"1 library file\(s\) failed verification: allgather-n4-outofplace-band1-"
                                         r".*: a planted error"):
        BACKEND.emit_library(request, BackendOptions())
    assert list(tmp_path.iterdir()) == []


def test_no_band_with_a_schedule_writes_nothing(tmp_path):
    lib = BACKEND.emit_library(LibraryRequest((_band([1 << 12]),), tmp_path / "algos"), BackendOptions())
    assert lib.files == () and not (tmp_path / "algos").exists()


def test_the_driver_writes_a_library_through_the_backend_and_refuses_one_without(tmp_path):
    from collc.driver import emit_library

    unit = ms.unit(ms.ring_allgather(4), 1 << 12)
    lib = emit_library("msccl-xml", [_band([1 << 12], unit)], tmp_path / "algos")
    assert [f.path.name for f in lib.files] == ["allgather-n4-outofplace-band0-4096B-to-4096B.xml"]
    with pytest.raises(CollcError, match="the json backend writes no size-band libraries"):
        emit_library("json", [_band([1 << 12], unit)], tmp_path / "other")
