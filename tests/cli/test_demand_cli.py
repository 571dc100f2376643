"""`collc compile --demand M.csv`: a demand matrix (AllToAllv) as a user compiles it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def collc(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "collc", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


SKEWED = "0, 0.5, 0.25, 0.05\n0.1, 0, 0, 0.3\n0, 0, 0, 0\n0.6, 0.2, 0.2, 0\n"


def test_compile_shares_of_size_writes_schedule_and_report(tmp_path):
    (tmp_path / "m.csv").write_text(SKEWED)
    r = collc("compile", "--topology", "switch(4)", "--demand", "m.csv", "--size", "16MiB", "-o", "out.json",
              "--report", "r.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["collective"] == "alltoallv" and rep["demand"]["entries"] == 8
    assert rep["demand"]["bytes"] == pytest.approx(2.2 * (16 << 20))
    assert rep["ratio_to_lower_bound"] <= 1.05
    assert rep["baselines"]["direct"]["time_us"] >= rep["time_us"] * (1 - 1e-9)  # on a switch direct is at the bound
    doc = json.loads((tmp_path / "out.json").read_text())
    assert len(doc["schedule"]["collective"]["demand"]) == 8


def test_bad_matrix_is_a_located_error_and_writes_nothing(tmp_path):
    (tmp_path / "m.csv").write_text("0,1,2,3\n1,0,-2,3\n0,0,0,0\n1,1,1,0\n")
    r = collc("compile", "--topology", "switch(4)", "--demand", "m.csv", "-o", "out.json", cwd=tmp_path)
    assert r.returncode == 1
    assert "m.csv:2:5: error: demand matrix entry -2 is negative" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out.json").exists()
    (tmp_path / "m.csv").write_text("0,1\n1,0\n")
    r = collc("compile", "--topology", "switch(4)", "--demand", "m.csv", "-o", "out.json", cwd=tmp_path)
    assert r.returncode == 1 and "2 x 2, but the topology has 4 GPUs" in r.stderr


def test_demand_with_a_collective_is_a_usage_error(tmp_path):
    (tmp_path / "m.csv").write_text(SKEWED)
    r = collc("compile", "--topology", "switch(4)", "--demand", "m.csv", "--collective", "alltoall",
              "--size", "1MiB", "-o", "out.json", cwd=tmp_path)
    assert r.returncode == 2 and "--demand" in r.stderr


def test_msccl_xml_pads_to_an_alltoall_that_collc_verify_accepts(tmp_path):
    (tmp_path / "m.csv").write_text(SKEWED)
    r = collc("compile", "--topology", "switch(4)", "--demand", "m.csv", "--size", "4MiB", "--backend",
              "msccl-xml", "-o", "a2av.xml", "--report", "r.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "a2av.xml").read_text()
    assert 'coll="alltoall"' in text and 'i_chunks="4"' in text
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["demand"]["padded"] and rep["demand"]["extra_share"] > 0
    v = collc("verify", "a2av.xml", cwd=tmp_path)
    assert v.returncode == 0, v.stdout + v.stderr


def test_coll_spelling(tmp_path):
    (tmp_path / "m.csv").write_text(SKEWED)
    (tmp_path / "moe.coll").write_text('import topologies.switch;\n'
                                       'compile alltoallv(demand = "m.csv") on switch(4) size 8 MiB;\n')
    r = collc("compile", "moe.coll", "-o", "out/", "--report", "r.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["demand"]["bytes"] == pytest.approx(2.2 * (8 << 20))
    (tmp_path / "moe.coll").write_text('import topologies.switch;\n'
                                       'compile alltoallv(demand = "nope.csv") on switch(4) size 8 MiB;\n')
    r = collc("compile", "moe.coll", "-o", "out/", cwd=tmp_path)
    assert r.returncode == 1 and "cannot read demand matrix" in r.stderr and "moe.coll:2:" in r.stderr
