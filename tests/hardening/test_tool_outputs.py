"""Outputs of `collc pipeline` and `collc bubbles`: every target checked before work,
all written or none, one file never named twice, an empty path a usage error; options
that are not finite numbers refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hardening_inputs import run_collc as _run


ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pipeline_dgx1.coll"


def _kineto(path: Path) -> Path:
    kernel = lambda ts: {"ph": "X", "cat": "kernel", "name": "gemm", "ts": ts, "dur": 10, "args": {"device": 0}}
    path.write_text(json.dumps({"traceEvents": [kernel(0), kernel(500)]}))
    return path




def _commands(tmp_path: Path) -> dict[str, list[str]]:
    return {"pipeline": ["pipeline", str(EXAMPLE), "--no-synthesis"],
            "bubbles": ["bubbles", str(_kineto(tmp_path / "k.json"))]}


@pytest.mark.parametrize("command", ["pipeline", "bubbles"])
def test_a_bad_second_target_leaves_the_first_unwritten(tmp_path, capsys, command):
    (tmp_path / "dir").mkdir()
    report = tmp_path / "r.json"
    rc, err = _run(_commands(tmp_path)[command] + ["--report", str(report), "--trace", str(tmp_path / "dir")], capsys)
    assert rc == 1 and "directory" in err
    assert not report.exists()


@pytest.mark.parametrize("command", ["pipeline", "bubbles"])
def test_a_symlink_target_is_refused_before_the_report_is_written(tmp_path, capsys, command):
    report = tmp_path / "r.json"
    report.write_text("keep")
    os.symlink(report, tmp_path / "link.json")
    rc, err = _run(_commands(tmp_path)[command] + ["--report", str(report), "--trace", str(tmp_path / "link.json")],
                   capsys)
    assert rc == 1 and "symbolic link" in err
    assert report.read_text() == "keep"


@pytest.mark.parametrize("command", ["pipeline", "bubbles"])
@pytest.mark.parametrize("second", ["{d}/X", "{d}/./X", "{d}/sub/../X"])
def test_one_file_named_twice_is_a_usage_error(tmp_path, capsys, command, second):
    (tmp_path / "sub").mkdir()
    rc, err = _run(_commands(tmp_path)[command] + ["--report", str(tmp_path / "X"),
                                                    "--trace", second.format(d=tmp_path)], capsys)
    assert rc == 2 and "same file" in err
    assert not (tmp_path / "X").exists()


@pytest.mark.parametrize("command", ["pipeline", "bubbles"])
def test_empty_output_path_is_a_usage_error(tmp_path, capsys, command):
    rc, err = _run(_commands(tmp_path)[command] + ["--report", ""], capsys)
    assert rc == 2 and "empty path" in err


@pytest.mark.parametrize("argv", [["pipeline", str(EXAMPLE), "--min-bubble-us", "nan"],
                                  ["pipeline", str(EXAMPLE), "--min-bubble-us", "inf"],
                                  ["bubbles", "x.json", "--threshold-us", "nan"],
                                  ["bubbles", "x.json", "--threshold-us=-inf"],
                                  ["profile", "x.log", "--time-limit", "nan"],
                                  ["profile", "x.log", "--time-limit", "inf"]])
def test_options_that_are_not_finite_are_usage_errors(capsys, argv):
    rc, err = _run(argv, capsys)
    assert rc == 2 and "finite" in err


def test_all_outputs_written_together(tmp_path, capsys):
    outs = [tmp_path / "r.json", tmp_path / "t.json", tmp_path / "s.csv"]
    rc, err = _run(_commands(tmp_path)["pipeline"] + ["--report", str(outs[0]), "--trace", str(outs[1]),
                                                       "--schedule-csv", str(outs[2])], capsys)
    assert rc == 0, err
    assert all(p.is_file() for p in outs)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".collc-")]
