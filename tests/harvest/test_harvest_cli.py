"""`collc harvest` on the command line."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from collc.cli import main

from test_report import GOOD


def test_bubbles_table(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(GOOD)
    assert main(["harvest", "bubbles", str(path), "--stage", "1"]) == 0
    out = capsys.readouterr().out
    assert "cooldown" in out and "0.300" in out
    assert "stage 1: 2 bubbles, 40.0% of the step harvestable" in out


def test_bad_report_is_a_located_error(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(GOOD.replace('"cause": "warmup"', '"cause": "lunch"'))
    assert main(["harvest", "bubbles", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:8:8: error: stages[0].bubbles[1]: cause \"lunch\"" in err
    assert "Traceback" not in err


def test_usage_errors_exit_2(tmp_path, capsys, monkeypatch):
    # No --dir: the private default directory, here one with no manager in it.
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert main(["harvest", "status"]) == 1
    assert f"no manager at {tmp_path / 'collc-harvest'}" in capsys.readouterr().err
    assert main(["harvest", "submit", "--dir", str(tmp_path), "no_colon"]) == 2
    assert main(["harvest", "status", "--dir", str(tmp_path)]) == 1   # no manager there
    assert "no manager" in capsys.readouterr().err


def test_serve_submit_status_shutdown(tmp_path):
    rt = tmp_path / "rt"
    # cwd outside the checkout: `-m collc` must find the installed package, not the
    # source folder (whose backends/ and stdlib/ sit beside collc/, not inside it).
    server = subprocess.Popen([sys.executable, "-m", "collc", "harvest", "serve", "--dir",
                               str(rt), "--device", "cpu:0=1G"], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 20
        while not (rt / "ready").exists():
            assert time.monotonic() < deadline and server.poll() is None
            time.sleep(0.05)
        run = lambda *a: subprocess.run([sys.executable, "-m", "collc", "harvest", *a],
                                        capture_output=True, text=True, timeout=60, cwd=tmp_path)
        sub = run("submit", "--dir", str(rt), "collc.harvest.workloads:PageRank",
                  "--arg", "nodes=1000", "--memory", "128M", "--priority", "2")
        assert sub.returncode == 0 and sub.stdout.strip() == "1"
        too_big = run("submit", "--dir", str(rt), "collc.harvest.workloads:PageRank",
                      "--memory", "4G")
        assert too_big.returncode == 1 and "no device has that much free" in too_big.stderr
        status = run("status", "--dir", str(rt), "--json")
        task = json.loads(status.stdout)["tasks"][0]
        assert (task["name"], task["priority"], task["memory_bytes"]) == ("PageRank", 2,
                                                                          128 << 20)
        assert run("stop", "--dir", str(rt), "1").returncode == 0
        down = run("shutdown", "--dir", str(rt))
        assert down.returncode == 0 and "PageRank" in down.stdout
        assert server.wait(timeout=20) == 0
        log = json.loads((rt / "harvest-log.json").read_text())
        assert log["tasks"][0]["state"] == "stopped"
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
