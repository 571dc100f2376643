"""The README's example program, its quoted error and its quickstart stay true."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _example() -> str:
    return "// my_cluster.coll\n" + README.split("```\n// my_cluster.coll\n", 1)[1].split("```", 1)[0]


def _collc(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "collc", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_example_checks_and_compiles_every_request(tmp_path):
    (tmp_path / "my_cluster.coll").write_text(_example())
    assert _collc("check", "my_cluster.coll", cwd=tmp_path).returncode == 0
    r = _collc("compile", "my_cluster.coll", "-o", "out/", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(list((tmp_path / "out").glob("*.json"))) == 3


def test_quoted_error_is_what_collc_prints(tmp_path):
    broken = _example().replace("copy in[s][0] -> out[r][s];", "copy in[s][0] -> out[r][(s + 1) % ranks];")
    (tmp_path / "my_cluster.coll").write_text(broken)
    r = _collc("check", "my_cluster.coll", cwd=tmp_path)
    assert r.returncode == 1
    quoted = README.split("```\nmy_cluster.coll:", 1)[1].split("```", 1)[0]
    assert r.stderr.strip() == ("my_cluster.coll:" + quoted).strip()


def test_ci_runs_the_readme_test_command():
    test_command = README.split("Install the test dependencies and run the whole test suite:\n\n```\n", 1)[1]
    test_command = test_command.split("\n```", 1)[0].strip()
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_quoted_fan_out_report_is_what_collc_prints(tmp_path):
    (tmp_path / "my_cluster.coll").write_text(_example())
    r = _collc("compile", "my_cluster.coll", "--request", "fan_out", "-o", "out/", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    quoted = README.split("```\nfan_out on two_servers", 1)[1].split("```", 1)[0]
    for what in ("schedule time", "lower bound", "with latency", "schedule  "):
        line = next(line for line in quoted.splitlines() if line.startswith(f"│ {what}"))
        assert line in r.stdout, (line, r.stdout)
