"""`collc compile` with several requests: compiled in parallel, the one-process answer."""

import json

from collc.cli import main


def _compile(tmp_path, name, *extra):
    out = tmp_path / name
    argv = ["compile", "--topology", "ring(4)", "--collective", "allgather", "--size", "4KiB,1MiB", "--no-baselines",
            "--algorithm", "ring", "-o", f"{out}/", "--report", str(tmp_path / f"{name}.json"), "-q", *extra]
    assert main(argv) == 0
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    reports = json.loads((tmp_path / f"{name}.json").read_text())
    for r in reports:
        r["outputs"] = [o.replace(str(out), "OUT") for o in r["outputs"]]
    return files, _without_timings(reports)


def _without_timings(value):
    """The report less the seconds it took (which differ from run to run)."""
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def test_several_sizes_in_worker_processes_give_the_one_process_files(tmp_path, capsys):
    one = _compile(tmp_path, "one", "--workers", "1")
    pool = _compile(tmp_path, "pool", "--workers", "2")
    capsys.readouterr()
    assert len(one[0]) == 2 and one == pool
    assert [r["size_bytes"] for r in pool[1]] == [4096, 1 << 20]
