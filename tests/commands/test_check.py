"""`collc check`: the front end's start-up runs with the cycle collector paused."""

import gc
from pathlib import Path

from collc import frontend
from collc.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline_dgx1.coll"


def test_check_runs_the_front_end_without_cycle_collections_and_turns_the_collector_back_on(monkeypatch, capsys):
    seen = []
    real = frontend.check_file

    def check_file(path):
        seen.append(gc.isenabled())
        return real(path)

    monkeypatch.setattr(frontend, "check_file", check_file)
    assert gc.isenabled()
    assert main(["check", str(EXAMPLE), str(EXAMPLE)]) == 0
    assert seen == [False, False]
    assert gc.isenabled()
    assert capsys.readouterr().out.count(": ok: ") == 2


def test_a_file_that_fails_its_check_still_turns_the_collector_back_on(tmp_path, capsys):
    bad = tmp_path / "bad.coll"
    bad.write_text("topology t {\n")
    assert main(["check", str(bad)]) == 1
    assert gc.isenabled()
    assert "error" in capsys.readouterr().err
