"""`-o` policy: a file, or a directory with a file per schedule; a library for one
request at several sizes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from collc.commands.output_paths import names_directory, one_request_many_sizes, output_path, safe_filename


@dataclass
class _Named:
    name: str


@dataclass
class _Job:
    collective: object
    topology: _Named
    size_bytes: int
    algorithm: str | None = None
    pipeline: str = "synthesize"
    span: object = None


@dataclass
class _Backend:
    suffix: str


def test_a_trailing_slash_or_an_existing_directory_names_a_directory(tmp_path):
    assert names_directory("out/") and names_directory(str(tmp_path))
    assert not names_directory(str(tmp_path / "out.json"))


def test_files_in_a_directory_are_named_by_the_job_and_never_collide(tmp_path):
    coll = _Named("allgather")
    job = _Job(coll, _Named("ndv2(chassis=2)"), 1024, "file.coll:ring")
    taken: set[Path] = set()
    first = output_path(tmp_path, job, _Backend(".xml"), True, taken)
    second = output_path(tmp_path, job, _Backend(".xml"), True, taken)
    assert first.name == "allgather-ndv2_chassis=2_-1024B-ring.xml"
    assert second.name == "allgather-ndv2_chassis=2_-1024B-ring-2.xml"
    assert output_path(tmp_path / "x.json", job, _Backend(".json"), False, taken) == tmp_path / "x.json"
    assert safe_filename("a b/c") == "a_b_c"


def test_one_request_at_several_sizes_is_a_library():
    coll, topo = _Named("allgather"), _Named("dgx1")
    jobs = [_Job(coll, topo, s) for s in (1024, 4096)]
    assert one_request_many_sizes(jobs)
    assert not one_request_many_sizes(jobs[:1])
    assert not one_request_many_sizes([jobs[0], _Job(coll, topo, 1024)])  # one size twice
    assert not one_request_many_sizes([jobs[0], _Job(_Named("allgather"), topo, 4096)])  # another request
