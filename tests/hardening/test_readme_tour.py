"""The README's tour: a request the backend cannot take fails at once, at the request,
and one request of a file can be compiled alone."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hardening_inputs import listing, write

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


@pytest.fixture
def my_cluster(tmp_path) -> Path:
    example = "// my_cluster.coll\n" + README.split("```\n// my_cluster.coll\n", 1)[1].split("```", 1)[0]
    return write(tmp_path / "my_cluster.coll", example)


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(text))


def test_custom_collective_to_msccl_xml_fails_before_solving_at_its_request(collc, my_cluster, monkeypatch):
    from collc import driver

    monkeypatch.setattr(driver, "schedule_for_backend",
                        lambda *a, **k: pytest.fail("solved before checking the backend"))
    start = time.perf_counter()
    run = collc("compile", "my_cluster.coll", "--backend", "msccl-xml", "-o", "xml/", "-q")
    assert run.status == 1
    assert f"my_cluster.coll:{_line_of(my_cluster, 'compile fan_out')}:1: error:" in run.err
    assert "custom collective" in run.err
    assert time.perf_counter() - start < 5
    assert listing(my_cluster.parent) == ["my_cluster.coll"]


def test_request_by_line_compiles_only_that_request(collc, my_cluster):
    line = _line_of(my_cluster, "compile allgather on two_servers() size 64 MiB using direct")
    run = collc("compile", "my_cluster.coll", "--request", str(line), "--backend", "msccl-xml", "-o", "xml/", "-q")
    assert run.status == 0, run.err
    assert [p.name for p in (my_cluster.parent / "xml").iterdir()] == [
        "allgather-two_servers_speed=12.5_GB_s_-67108864B-direct.xml"]


def test_request_by_name_selects_the_matching_requests(collc, my_cluster):
    run = collc("compile", "my_cluster.coll", "--request", "fan_out", "-o", "out/", "-q", "--no-baselines")
    assert run.status == 0, run.err
    assert [p.name.split("-")[0] for p in (my_cluster.parent / "out").iterdir()] == ["fan_out"]


def test_request_that_matches_nothing_lists_the_requests(collc, my_cluster):
    run = collc("compile", "my_cluster.coll", "--request", "999", "-o", "out/", "-q")
    line = _line_of(my_cluster, "compile fan_out")
    assert run.status == 1 and f"line {line}: compile fan_out on two_servers" in run.err


def test_request_without_a_file_is_a_usage_error(collc):
    run = collc("compile", "--topology", "ring(4)", "--collective", "allgather", "--size", "1M",
                "--request", "3", "-o", "o.json")
    assert run.status == 2
