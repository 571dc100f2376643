"""Traces named by URL, read through fsspec: the same records as the local files, in
one process or in worker processes; a missing URL is a located error."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from collc.cli import main
from collc.diagnostics import CollcError
from collc.traces.sources import read_traces
from collc.traces.urls import is_url
from trace_samples import per_rank_logs, sample

fsspec = pytest.importorskip("fsspec")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Three small per-rank logs (one gzip) and a Chakra archive."""
    folder = per_rank_logs(tmp_path_factory.mktemp("url-ranks"), [600 + 50 * r for r in range(3)], gzipped=1)
    shutil.copy(sample("chakra__json_trace.tar.gz"), folder / "chakra.tar.gz")
    (folder / "MANIFEST.tsv").write_text("left out, as in a local directory\n")
    return folder


def _records(traces):
    """Every field but the file name, and each file's counts."""
    return ([dataclasses.astuple(c)[1:] for c in traces.calls],
            [(s.format, s.records, dict(s.skipped)) for s in traces.sources],
            traces.world_size, traces.communicators)


def _to_memory(folder: Path, prefix: str) -> str:
    fs = fsspec.filesystem("memory")
    for p in folder.iterdir():
        fs.pipe(f"/{prefix}/{p.name}", p.read_bytes())
    return f"memory://{prefix}"


def test_is_url():
    assert is_url("s3://bucket/job/") and is_url("memory://x") and is_url("file:///tmp/a.log")
    assert not is_url("/tmp/a.log") and not is_url("C:\\logs\\a.log") and not is_url(Path("a://b"))


def test_memory_store_prefix_reads_as_the_local_directory(ranks):
    url = _to_memory(ranks, "job-a")
    remote = read_traces([url], workers=1)
    local = read_traces([ranks], workers=1)
    assert _records(remote) == _records(local)
    assert [s.path.split("/")[-1] for s in remote.sources] == [s.path.split("/")[-1] for s in local.sources]
    assert all(s.path.startswith("memory://") and "/job-a/" in s.path for s in remote.sources)


def test_file_urls_read_by_worker_processes(ranks):
    remote = read_traces([ranks.as_uri()], workers=2)
    assert _records(remote) == _records(read_traces([ranks], workers=1))


def test_profile_command_takes_a_url(ranks, tmp_path, capsys):
    outs = []
    for target in (ranks.as_uri() + "/rank0.log", str(ranks / "rank0.log")):
        out = tmp_path / f"{len(outs)}.json"
        assert main(["profile", target, "--json", str(out), "-q"]) == 0
        data = json.loads(out.read_text())
        data["sources"] = [{**s, "path": Path(s["path"]).name} for s in data["sources"]]
        outs.append(data)
    capsys.readouterr()
    assert outs[0] == outs[1]


def test_a_missing_url_is_a_located_error():
    with pytest.raises(CollcError) as e:
        read_traces(["memory://no-such-job/rank0.log"], workers=1)
    assert e.value.span.file == "memory://no-such-job/rank0.log" and "no such file" in e.value.message
