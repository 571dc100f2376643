"""Helpers for the hardening tests: the CLI run in-process, small .coll programs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from collc import frontend
from collc.cli import main


@dataclass
class Run:
    status: int
    out: str
    err: str


@pytest.fixture
def collc(capsys, monkeypatch, tmp_path):
    """`collc(*argv)` runs the command line in-process (in tmp_path) and returns a Run."""
    monkeypatch.chdir(tmp_path)
    frontend.clear_caches()

    def run(*argv: str) -> Run:
        try:
            status = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse's usage errors and --help
            status = exc.code if isinstance(exc.code, int) else 1
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err
        return Run(status, captured.out, captured.err)

    return run
