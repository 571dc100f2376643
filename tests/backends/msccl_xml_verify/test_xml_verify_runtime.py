"""`collc verify` judges a file against a runtime (`current` by default, or `legacy`)
and, with `--sms N`, against the GPUs' SM count: every threadblock of a GPU must be
resident at once, and N - 2 SMs are what a file may use."""

from __future__ import annotations

import subprocess
import sys

import pytest

from collc.backends.msccl_xml.limits import resident_threadblocks
from collc.backends.msccl_xml.verify import verify_file
from xml_verify_programs import SHARED_XML, ring_allgather, render, verify_program

LEGACY_FILE = "rccl__all-to-all-2d-hierarchical-simple-n2g32.xml"
BUSIEST_FILE = "rccl__alltoall-8n-7mb-43mb.xml"  # 64 threadblocks on every GPU

needs_shared = pytest.mark.skipif(not SHARED_XML.is_dir(), reason="shared/data is not beside this checkout")


def collc(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "collc", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_resident_threadblocks_leave_two_sms():
    assert resident_threadblocks(80) == 78
    assert resident_threadblocks(132) == 130
    assert resident_threadblocks(2) == 1


def test_sms_bounds_threadblocks_per_gpu():
    program = ring_allgather(4)  # one threadblock per GPU
    assert verify_program(program, sms=3).ok
    for g in program["gpus"]:  # a second, idle threadblock on every GPU
        g["tbs"].append({"attrs": {"id": 1, "send": -1, "recv": -1, "chan": 0}, "steps": []})
    report = verify_program(program, sms=3)
    assert not report.ok
    assert [e.kind for e in report.errors] == ["resident"] * 4
    first = report.errors[0]
    assert first.message.startswith("GPU 0 has 2 threadblocks, but a GPU of 3 SMs keeps at most 1 resident at once")
    assert first.message.endswith("(--sms 3)")
    assert first.span.line == render(program).splitlines().index('  <gpu id="0" i_chunks="1" o_chunks="4" '
                                                                 's_chunks="0">') + 1
    assert verify_program(program, sms=4).ok


@needs_shared
def test_real_files_fit_a_v100_and_the_busiest_exceeds_64_sms():
    assert verify_file(SHARED_XML / BUSIEST_FILE, sms=80).ok
    report = verify_file(SHARED_XML / BUSIEST_FILE, sms=64)
    assert not report.ok and {e.kind for e in report.errors} == {"resident"}
    assert "64 threadblocks, but a GPU of 64 SMs keeps at most 62" in report.errors[0].message


@needs_shared
def test_command_line_runtime_and_sms(tmp_path):
    legacy = str(SHARED_XML / LEGACY_FILE)
    r = collc("verify", legacy, cwd=tmp_path)
    assert r.returncode == 1 and "has no minBytes" in r.stderr and "Traceback" not in r.stderr
    r = collc("verify", "--runtime", "legacy", legacy, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    small = str(SHARED_XML / "rccl__allgather-8n-0-1kb.xml")  # 14 threadblocks per GPU
    assert collc("verify", "--sms", "16", small, cwd=tmp_path).returncode == 0
    r = collc("verify", "--sms", "15", small, cwd=tmp_path)
    assert r.returncode == 1 and "14 threadblocks, but a GPU of 15 SMs keeps at most 13 resident" in r.stderr
    assert collc("verify", "--runtime", "newest", small, cwd=tmp_path).returncode == 2
