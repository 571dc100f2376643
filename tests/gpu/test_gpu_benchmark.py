"""tests/gpu/run.sh and benchmark.py, as far as they run without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_benchmark as benchmark  # noqa: E402

RUN_SH = HERE / "run.sh"
ENV = {**os.environ, "PYTHON": sys.executable}  # the interpreter that runs these tests has collc


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device
        return False


@pytest.mark.skipif(_gpu_available(), reason="there is a GPU: run.sh would benchmark")
def test_run_sh_skips_cleanly_without_a_gpu(tmp_path: Path):
    out = tmp_path / "gpu.md"
    done = subprocess.run(["bash", str(RUN_SH), str(out)], capture_output=True, text=True, timeout=60, env=ENV)
    assert done.returncode == 0
    assert "skipped" in done.stdout and ("CuPy" in done.stdout or "device" in done.stdout)
    assert not out.exists()


def test_run_sh_on_numpy_writes_the_report(tmp_path: Path):
    out = tmp_path / "results" / "cpu.md"
    done = subprocess.run(
        ["bash", str(RUN_SH), str(out), "--device", "cpu", "--ranks", "4", "--collectives", "allreduce,broadcast",
         "--sizes", "-b 4K -e 64K -f 16", "--iters", "2", "--warmup", "1", "--copy-bytes", "1000000",
         "--schedules", "ir"],
        capture_output=True, text=True, timeout=120, env=ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    text = out.read_text()
    assert "copy reference" in text and "## Summary" in text
    summary = [line for line in text.splitlines() if line.startswith(("| allreduce", "| broadcast"))]
    assert len(summary) == 2
    for line in summary:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[3] == "65536" and cells[8] == "0" and cells[9] == "ok"
        assert cells[6] == "4"  # every rank on the one CPU
        assert float(cells[7]) == pytest.approx(float(cells[5]) * 4 / copy_gbps(text), rel=0.05, abs=0.002)
    assert text.count("```text") == 2  # each executor's own table


def copy_gbps(report: str) -> float:
    line = next(line for line in report.splitlines() if "copy reference" in line)
    return float(line.split("**")[1].split()[0])


def test_parse_table_reads_executor_rows():
    stdout = "\n".join([
        "# collc executor: ...",
        "#       size         count      type   redop    root       time    algbw    busbw  #wrong",
        "        1024           256   float32     sum      -1      17.00     0.06     0.05       0",
        "        4096          1024   float32     sum      -1      15.33     0.27     0.20     N/A",
        "# Avg bus bandwidth    : 0.1",
    ])
    rows = benchmark.parse_table(stdout)
    assert rows == [benchmark.Row(1024, 256, "float32", 17.0, 0.06, 0.05, 0),
                    benchmark.Row(4096, 1024, "float32", 15.33, 0.27, 0.20, None)]


def test_a_failed_run_is_reported_as_failed():
    run = benchmark.Run("allgather", "ring", "single process", 1, "", "boom", [])
    text = benchmark.report({"device": "cpu"}, 10.0, None, [run], {})
    assert "FAILED (exit 1)" in text and "boom" in text
    assert not run.ok


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_available(), reason="needs CuPy and a GPU")
def test_executors_on_the_gpu(tmp_path: Path):
    out = tmp_path / "gpu.md"
    done = subprocess.run(
        ["bash", str(RUN_SH), str(out), "--ranks", "4", "--sizes", "-b 64K -e 4M -f 64", "--iters", "2",
         "--warmup", "1", "--copy-bytes", str(1 << 26), "--schedules", "ir", "--multi", "never"],
        capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    assert out.read_text().count("| ok |") == 5
