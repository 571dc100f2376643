"""Bandwidth and latency that are not finite, or beyond any real link, are located
errors where they are written (they used to crash the simulator or hang the solver)."""

from __future__ import annotations

import pytest

from collc import frontend
from collc.diagnostics import CollcError

from hardening_inputs import write


def _program(bw: str, lat: str = "1 us", using: str = "") -> str:
    return (f"topology t() {{ gpu g[2]; switch s; link g[0] <-> s bw {bw} lat {lat}; "
            f"link g[1] <-> s bw 1 GB/s lat 1 us; }}\ncompile allgather on t() size 1 MiB{using};\n")


@pytest.mark.parametrize("bw, words", [
    ("1e300 GB/s", "not a finite number"),
    ("1e400 GB/s", "too large"),
    ("1e400 GB/s - 1e400 GB/s", "too large"),
    ("1e200 GB/s", "COLLC_LIMIT_BANDWIDTH"),
])
def test_bandwidth_that_is_not_a_real_links(tmp_path, bw, words):
    path = write(tmp_path / "p.coll", _program(bw))
    with pytest.raises(CollcError, match=words) as info:
        frontend.check_file(path)
    assert info.value.span.line == 1 and info.value.span.column >= _program(bw).index("bw ") + 4


def test_nan_bandwidth_with_hand_written_ring(collc, tmp_path):
    write(tmp_path / "p.coll", _program("1e400 GB/s - 1e400 GB/s", using=" using ring"))
    run = collc("compile", "p.coll", "-o", "o.json", "-q")
    assert run.status == 1 and "p.coll:1:" in run.err
    assert not (tmp_path / "o.json").exists()


def test_check_no_longer_calls_nan_bandwidth_ok(collc, tmp_path):
    write(tmp_path / "p.coll", _program("1e400 GB/s - 1e400 GB/s"))
    run = collc("check", "p.coll")
    assert run.status == 1 and "p.coll:1:" in run.err and "ok" not in run.out


@pytest.mark.parametrize("lat, words", [("1e400 us", "too large"), ("1e300 s * 1e300", "not a finite number"),
                                        ("100 s", "COLLC_LIMIT_LATENCY")])
def test_latency_that_is_not_a_real_links(tmp_path, lat, words):
    path = write(tmp_path / "p.coll", _program("1 GB/s", lat))
    with pytest.raises(CollcError, match=words):
        frontend.check_file(path)


def test_bandwidth_limit_can_be_raised(tmp_path, monkeypatch):
    path = write(tmp_path / "p.coll", _program("2000 TB/s"))
    with pytest.raises(CollcError, match="COLLC_LIMIT_BANDWIDTH"):
        frontend.check_file(path)
    monkeypatch.setenv("COLLC_LIMIT_BANDWIDTH", "1e16")
    frontend.clear_caches()
    assert frontend.check_file(path).requests
