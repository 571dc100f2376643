"""`collc harvest` arguments checked before a manager is built or asked: devices that
exist, sizes that are real, a runtime directory that can be one, a task class that
imports; a log whose fields have the wrong types is a located error."""

from __future__ import annotations

import json

import pytest

from collc.harvest import cli as harvest_cli
from hardening_inputs import run_collc as _run
from harvest_samples import harvest_log




@pytest.mark.parametrize("device, words", [("cpu:99", "no core 99"), ("cpu:1=-5GiB", "size"),
                                           ("cpu:1=0", "at least one byte"), ("cpu:1=1e400", "finite"),
                                           ("tpu:0", "cpu:N or cuda:N")])
def test_serve_devices_are_checked(tmp_path, capsys, device, words):
    rc, err = _run(["harvest", "serve", "--dir", str(tmp_path / "h"), "--device", device], capsys)
    assert rc == 2 and words in err
    assert not (tmp_path / "h").exists()


def test_serve_gpu_that_is_not_there(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    rc, err = _run(["harvest", "serve", "--dir", str(tmp_path / "h"), "--device", "cuda:99"], capsys)
    assert rc == 2 and "no GPU 99" in err


@pytest.mark.parametrize("where", ["file", "under_file", "proc"])
def test_serve_dir_that_cannot_be_a_directory(tmp_path, capsys, where):
    (tmp_path / "f").write_text("x")
    path = {"file": tmp_path / "f", "under_file": tmp_path / "f" / "d", "proc": "/proc/collc-harvest"}[where]
    rc, err = _run(["harvest", "serve", "--dir", str(path), "--device", "cpu:0"], capsys)
    assert rc == 1 and "runtime directory" in err


def test_submit_memory_must_be_finite(tmp_path, capsys):
    rc, err = _run(["harvest", "submit", "--dir", str(tmp_path), "x:Y", "--memory", "1e400"], capsys)
    assert rc == 2 and "finite" in err


@pytest.mark.parametrize("source, target, words", [
    (None, "collc_no_such_module:Task", "ModuleNotFoundError"),
    ("def broken(:\n", "broken_mod:Task", "SyntaxError"),
    ("class Task:\n    pass\n", "plain_mod:Task", "is not an IterativeTask"),
    ("x = 1\n", "plain2_mod:Missing", "has no Missing")])
def test_submit_imports_the_target_first(tmp_path, capsys, source, target, words):
    if source is not None:
        (tmp_path / (target.split(":")[0] + ".py")).write_text(source)
    rc, err = _run(["harvest", "submit", "--dir", str(tmp_path / "nomanager"), target, "--path", str(tmp_path)],
                   capsys)
    assert rc == 1 and words in err


def test_the_import_check_runs_in_another_process(tmp_path, capsys):
    (tmp_path / "loud_mod.py").write_text("import os\nopen(os.path.join(os.path.dirname(__file__), 'ran'), 'w')\n")
    rc, err = _run(["harvest", "submit", "--dir", str(tmp_path / "m"), "loud_mod:Task", "--path", str(tmp_path)],
                   capsys)
    assert rc == 1 and (tmp_path / "ran").exists()
    assert "loud_mod" not in __import__("sys").modules


def _log(**changes) -> dict:
    log = harvest_log(incidents=False)
    log.update(changes)
    return log


@pytest.mark.parametrize("changes", [dict(runs=[{"task": "x"}]), dict(tasks="no"), dict(devices=[1]),
                                     dict(bubbles=[{"start": "a", "end": 1, "device": "cpu:0", "source": "r",
                                                    "harvested_s": 0}]),
                                     dict(runs=[{"task": 1, "device": "gpu:7", "start": 0, "end": 1,
                                                 "overrun_s": 0, "steps": 1}])])
@pytest.mark.parametrize("command", ["status", "trace"])
def test_log_fields_of_the_wrong_type(tmp_path, capsys, changes, command):
    path = tmp_path / "harvest-log.json"
    path.write_text(json.dumps(_log(**changes)))
    argv = ["harvest", "status", "--log", str(path)] if command == "status" else \
        ["harvest", "trace", str(path), "-o", str(tmp_path / "t.json")]
    rc, err = _run(argv, capsys)
    assert rc == 1 and "not a harvest log" in err
    assert not (tmp_path / "t.json").exists()


def test_good_log_still_reads(tmp_path, capsys):
    path = tmp_path / "harvest-log.json"
    path.write_text(json.dumps(_log()))
    rc, err = _run(["harvest", "trace", str(path), "-o", str(tmp_path / "t.json")], capsys)
    assert rc == 0, err


def test_memory_sizes():
    assert harvest_cli.memory_bytes("512M", "--memory") == 512 << 20
    assert harvest_cli.memory_bytes("2GiB", "--memory") == 2 << 30
    assert harvest_cli.memory_bytes("1e9", "--memory") == 10 ** 9
