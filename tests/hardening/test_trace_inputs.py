"""Traces and logs read by `collc bubbles` and `collc profile`: padding, gzip bombs,
FIFOs and devices, byte-order marks, fields of the wrong type and absurd figures end
within seconds with exit 0 (bad records skipped and counted in notes) or 1."""

from __future__ import annotations

import gzip
import json
import os
import re
import time
from pathlib import Path

import pytest

from collc.cli import main

LOG = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "nccl-logs" / \
    "nccl-tests__Timez-zx_all_reduce_perf_2xA100_nccl-2.27.7.log"


def kernel(ts, dur=10, args=None, name="gemm"):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
            "args": {"device": 0} if args is None else args}


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_trace_padded_with_whitespace_after_its_end_reads_in_seconds(tmp_path, capsys):
    body = json.dumps({"traceEvents": [kernel(0), kernel(500)]}).encode()
    path = tmp_path / "padded.json.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(body)
        for _ in range(96):
            f.write(b" " * (1 << 20))
    start = time.perf_counter()
    rc, out, err = _run(["bubbles", str(path), "--threshold-us", "1"], capsys)
    assert rc == 0, err
    assert time.perf_counter() - start < 20


def test_gzip_of_whitespace_inside_the_events_ends_in_seconds(tmp_path, capsys):
    path = tmp_path / "bomb.json.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(b'{"traceEvents": [')
        for _ in range(160):
            f.write(b" " * (1 << 20))
    start = time.perf_counter()
    rc, out, err = _run(["bubbles", str(path)], capsys)
    assert rc == 1 and "Traceback" not in err
    assert time.perf_counter() - start < 30


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
@pytest.mark.parametrize("command", [["profile"], ["bubbles"], ["harvest", "status", "--log"]])
def test_fifo_is_refused_without_opening_it(tmp_path, capsys, command):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    rc, out, err = _run(command + [str(fifo)], capsys)
    assert rc == 1 and "FIFO" in err


@pytest.mark.parametrize("command", [["profile"], ["bubbles"], ["harvest", "status", "--log"]])
def test_device_is_refused(capsys, command):
    rc, out, err = _run(command + ["/dev/zero"], capsys)
    assert rc == 1 and "character device" in err


def test_directory_given_to_bubbles_says_so(tmp_path, capsys):
    rc, out, err = _run(["bubbles", str(tmp_path)], capsys)
    assert rc == 1 and "a directory" in err and "no such file" not in err


def test_kineto_fields_of_the_wrong_type(tmp_path, capsys):
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"traceEvents": [kernel(0), kernel(100, 5, [1, 2]), kernel(50, 3, [1], "nccl")],
                                "deviceProperties": "x", "distributedInfo": [1]}))
    rc, out, err = _run(["bubbles", str(path), "--threshold-us", "1"], capsys)
    assert rc == 0, err


@pytest.mark.parametrize("bad, reason", [(dict(ts=1e40), "timestamp out of range"),
                                         (dict(dur=-5), "negative duration"),
                                         (dict(dur=1e30), "duration out of range")])
def test_absurd_kineto_figures_are_skipped_and_counted(tmp_path, capsys, bad, reason):
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"traceEvents": [kernel(0), {**kernel(100), **bad}, kernel(300)]}))
    rc, out, err = _run(["bubbles", str(path), "--threshold-us", "1", "--json"], capsys)
    assert rc == 0, err
    report = json.loads(out)
    assert any(reason in note and "1 kernel" in note for note in report["notes"])
    assert report["step_us"] == 310


def test_byte_order_mark_in_json_traces(tmp_path, capsys):
    path = tmp_path / "k.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"traceEvents": [kernel(0), kernel(300)]}).encode())
    rc, out, err = _run(["bubbles", str(path), "--threshold-us", "1"], capsys)
    assert rc == 0, err


def test_blank_lines_are_not_a_malformed_chakra_node(tmp_path, capsys):
    path = tmp_path / "blank.et"
    path.write_text("\n" * 1000)
    rc, out, err = _run(["profile", str(path)], capsys)
    assert rc == 1 and "blank" in err and "Chakra" not in err


@pytest.mark.skipif(not LOG.exists(), reason="shared/data is not beside the checkout")
@pytest.mark.parametrize("old, new", [(b"[nranks=2]", b"[nranks=1000000000000]"),
                                      (b"count 2097152", b"count " + b"9" * 30),
                                      (b"count 2097152", b"count " + b"9" * 5000),
                                      (b"rank 0 nranks 2", b"rank 0 nranks 100000000000000000000")])
def test_nccl_figures_past_the_limits_are_skipped(tmp_path, capsys, old, new):
    path = tmp_path / "n.log"
    path.write_bytes(LOG.read_bytes().replace(old, new))
    out = tmp_path / "out.json"
    start = time.perf_counter()
    rc, _, err = _run(["profile", str(path), "--topology", "dgx1", "-q", "--json", str(out)], capsys)
    assert time.perf_counter() - start < 60
    if rc == 1:  # every call line was past the limits: nothing left to profile
        assert "no collective calls" in err and not out.exists()
        return
    assert rc == 0, err
    result = out.read_text()
    skipped = {k: v for s in json.loads(result)["sources"] for k, v in s.get("skipped", {}).items()}
    assert any("limit" in reason for reason in skipped), skipped
    assert json.loads(result)["world_size"] <= 8192
    assert not re.search(r"(?<![\d.])\d{17,}(?![\d.])", result), "a figure of 17 digits or more was reported"


@pytest.mark.skipif(not LOG.exists(), reason="shared/data is not beside the checkout")
def test_nccl_opcount_that_is_not_a_number_is_skipped(tmp_path, capsys):
    """Found by the long property run: `opCount x` matched the line's pattern and
    crashed the hex conversion."""
    path = tmp_path / "n.log"
    path.write_bytes(LOG.read_bytes().replace(b"opCount 0 ", b"opCount x ", 3))
    out = tmp_path / "out.json"
    rc, _, err = _run(["profile", str(path), "-q", "--json", str(out)], capsys)
    assert rc == 0, err
    skipped = {k for s in json.loads(out.read_text())["sources"] for k in s.get("skipped", {})}
    assert "COLL line whose opCount is not a number" in skipped


@pytest.mark.parametrize("bad", [dict(ts=None), dict(args=1.5), dict(dur=-3), dict(ts=1e40), dict(pid=[1]),
                                 dict(args={"correlation": 1e400})])
def test_profile_of_kineto_nccl_kernels_with_odd_fields(tmp_path, capsys, bad):
    """Found by the property run on Chrome/Kineto traces: `collc profile` read the NCCL
    kernels' ts, dur and args without checking their types."""
    nccl = {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ts": 10, "dur": 5,
            "pid": 0, "tid": 1, "args": {"correlation": 7}}
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"traceEvents": [kernel(0), {**nccl, **bad}]}))
    rc, _, err = _run(["profile", str(path), "-q"], capsys)
    assert rc in (0, 1) and "Traceback" not in err
    if rc == 1:
        assert "error" in err
