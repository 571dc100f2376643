"""Per-rank files read in parallel (worker processes, or a Dask cluster) give the answer
of the one-process read: the same records in the same order, the same summaries,
communicators and notes, and the same `collc profile --json`."""

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from collc.cli import main
from collc.traces.columns import from_columns
from collc.traces.parallel_files import combine, read_dask
from collc.traces.records import TraceContext
from collc.traces.sources import read_file_columns, read_traces
from trace_samples import TRACES, per_rank_logs, sample



@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Eight per-rank logs of an HSDP-like job (made from the real 2.27.7 sample), one
    of them gzip, and a Kineto trace beside them."""
    folder = per_rank_logs(tmp_path_factory.mktemp("ranks"), [2000 + 37 * r for r in range(8)],
                           gzipped=3, name="rank{:04d}.log")
    shutil.copy(sample("hta__trace_diff__control__control.json.gz"), folder / "kineto-rank3.json.gz")
    return folder


def _same(a, b):
    assert a.calls == b.calls
    assert [s.to_json() for s in a.sources] == [s.to_json() for s in b.sources]
    assert (a.world_size, a.communicators, a.notes) == (b.world_size, b.communicators, b.notes)


def _profile_json(capsys, tmp_path, *argv):
    out = tmp_path / f"mix-{len(list(tmp_path.iterdir()))}.json"
    assert main(["profile", *map(str, argv), "--json", str(out), "-q"]) == 0
    capsys.readouterr()
    return json.loads(out.read_text())


@pytest.mark.parametrize("folder", ["ranks", "samples"])
def test_worker_processes_give_the_one_process_answer(ranks, folder, tmp_path, capsys):
    path = ranks if folder == "ranks" else TRACES
    if not path.exists():
        pytest.skip("sample data not present")
    if folder == "ranks":
        # The records themselves, field by field (the shared samples, 16 s of reading
        # for the four reads, are compared by their whole JSON below).
        _same(read_traces([path], workers=2), read_traces([path], workers=1))
    assert _profile_json(capsys, tmp_path, path, "--workers", "2") == \
        _profile_json(capsys, tmp_path, path, "--workers", "1")


def test_an_error_is_the_first_failing_files_located_error(ranks, tmp_path):
    folder = tmp_path / "bad"
    shutil.copytree(ranks, folder)
    (folder / "rank0005.log").write_text((folder / "rank0005.log").read_text()
                                         .replace("datatype 7 op 0", "datatype 7 op 0 root 0 comm", 1)
                                         .replace("opCount", "opCount zz", 3))
    (folder / "rank0006.log").write_bytes(b"\x1f\x8b" + b"not gzip at all")
    from collc.diagnostics import CollcError
    errors = []
    for workers in (1, 2):
        with pytest.raises(CollcError) as e:
            read_traces([folder], workers=workers)
        errors.append((e.value.message, e.value.span))
    assert errors[0] == errors[1] and errors[0][1] is not None


# --- Dask -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
                                  silence_logs=50) as c, distributed.Client(c) as client:
        yield client


@pytest.mark.dask
def test_dask_cluster_gives_the_local_answer(ranks, cluster, tmp_path, capsys):
    _same(read_traces([ranks], scheduler=cluster), read_traces([ranks], workers=1))
    address = cluster.scheduler.address
    assert _profile_json(capsys, tmp_path, ranks, "--scheduler", address) == \
        _profile_json(capsys, tmp_path, ranks, "--workers", "1")


@pytest.mark.dask
def test_dask_workers_read_urls(ranks, cluster):
    pytest.importorskip("fsspec")
    files = [ranks / "rank0000.log", ranks / "rank0003.log.gz"]
    remote = read_traces([f.as_uri() for f in files], scheduler=cluster)
    local = read_traces(files, workers=1)
    assert [dataclasses.astuple(c)[1:] for c in remote.calls] == [dataclasses.astuple(c)[1:] for c in local.calls]
    assert [s.path for s in remote.sources] == [Path(s.path).as_uri() for s in local.sources]


def _kill_the_worker_once(path: str):
    """Read a file, but first kill the worker process the first time rank 2's file is read."""
    marker = Path(path).parent.parent / "killed"      # beside the folder read, not in it
    if path.endswith("rank0002.log") and not marker.exists():
        marker.write_text("the worker reading this was killed\n")
        os._exit(1)
    return read_file_columns(path)


@pytest.mark.dask
def test_a_worker_killed_mid_run_has_its_file_read_again(ranks, cluster, tmp_path):
    import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])   # the workers cannot import this module
    folder = tmp_path / "ranks"
    shutil.copytree(ranks, folder)
    files = sorted(str(p) for p in folder.iterdir())
    results = list(read_dask(files, cluster, _kill_the_worker_once))
    assert (tmp_path / "killed").exists()
    context = TraceContext()
    columns, sources = combine(results, context)
    local = read_traces([folder], workers=1)
    assert from_columns(columns) == local.calls and [s.path for s in sources] == [s.path for s in local.sources]
