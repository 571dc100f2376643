"""The `collc` command as a user runs it: a subprocess, exit codes, messages, files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SHARED_XML = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "msccl-xml"


def collc(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # Run from a scratch directory so the installed package, not the checkout, is used.
    return subprocess.run([sys.executable, "-m", "collc", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_version_and_usage_errors(tmp_path):
    assert collc("--version", cwd=tmp_path).returncode == 0
    assert collc(cwd=tmp_path).returncode == 2
    r = collc("compile", "--topology", "ring(4)", "--collective", "allgather", "--size", "1MiB", cwd=tmp_path)
    assert r.returncode == 2 and "-o" in r.stderr
    r = collc("compile", "--topology", "ring(4)", "--collective", "allgather", "-o", "x.json", cwd=tmp_path)
    assert r.returncode == 2 and "compile needs --size" in r.stderr
    r = collc("compile", "--topology", "ring(4)", "--collective", "allgather", "--size", "1MiB",
              "--algorithm", "ring", "--synthesize", "lp", "-o", "x.json", cwd=tmp_path)
    assert r.returncode == 2 and "give one" in r.stderr


def test_compile_hand_written_ring_writes_schedule_and_report(tmp_path):
    r = collc("compile", "--topology", "ring(4)", "--collective", "allgather", "--size", "1MiB",
              "--algorithm", "ring", "-o", "out.json", "--report", "r.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["schedule"]["collective"]["name"] == "allgather"
    rep = json.loads((tmp_path / "r.json").read_text())
    for key in ("collective", "topology", "ranks", "size_bytes", "time_us", "lower_bound_us", "algbw_GBps",
                "busbw_GBps", "solver", "baselines"):
        assert key in rep, key
    assert rep["ranks"] == 4 and rep["size_bytes"] == 1 << 20
    assert rep["time_us"] >= rep["lower_bound_us"] > 0
    assert rep["busbw_GBps"] == pytest.approx(rep["algbw_GBps"] * 3 / 4)
    assert "ring" in rep["baselines"] and rep["baselines"]["ring"]["time_us"] == pytest.approx(rep["time_us"])


def test_compile_synthesizes_by_default(tmp_path):
    r = collc("compile", "--topology", "dgx1", "--collective", "allgather", "--size", "1MiB", "-q",
              "-o", "out.json", "--report", "r.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["ranks"] == 8 and rep["solver"]["method"] != "algorithm:ring"
    assert rep["verified"] is True
    assert rep["time_us"] <= rep["baselines"]["ring"]["time_us"] * 1.0001


def test_bad_source_gets_located_error_and_no_output(tmp_path):
    src = tmp_path / "bad.coll"
    src.write_text("topology t() {\n    gpu g[2];\n    link g[0] <-> g[5] bw 10 GB/s lat 1 us;\n}\n"
                   "compile allgather on t() size 1 MiB using ring;\n")
    r = collc("compile", str(src), "-o", "out.json", cwd=tmp_path)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith(f"{src}:3:")
    assert "^" in r.stderr
    assert not (tmp_path / "out.json").exists()


def test_check_reports_each_file(tmp_path):
    good = tmp_path / "good.coll"
    good.write_text("topology pair() {\n  gpu g[2];\n  link g[0] <-> g[1] bw 10 GB/s lat 1 us;\n}\n")
    bad = tmp_path / "bad.coll"
    bad.write_text("topology pair() {\n  gpu g[2]\n}\n")
    r = collc("check", str(good), str(bad), cwd=tmp_path)
    assert r.returncode == 1
    assert str(good) in r.stdout and "ok" in r.stdout
    assert f"{bad}:" in r.stderr and "error" in r.stderr and "Traceback" not in r.stderr


def test_show_and_list_json(tmp_path):
    r = collc("show", "--topology", "ndv2(chassis=2)", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    topo = json.loads(r.stdout)["topology"]
    assert sum(1 for n in topo["nodes"] if n["kind"] == "gpu") == 16
    r = collc("list", "--json", cwd=tmp_path)
    catalog = json.loads(r.stdout)
    names = {t["name"] for t in catalog["topologies"]}
    assert {"ring", "switch", "torus2d", "hypercube", "dgx1", "ndv2", "dgx2", "dgx_h100", "mi250"} <= names
    assert {c["name"] for c in catalog["collectives"]} >= {"allgather", "reducescatter", "allreduce", "alltoall",
                                                          "broadcast", "reduce", "gather", "scatter"}


def test_unknown_stdlib_name_on_the_command_line(tmp_path):
    r = collc("show", "--topology", "dgx9", cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "<--topology>:1:1" in r.stderr


def test_passes_lists_builtin_and_backend_passes(tmp_path):
    r = collc("passes", cwd=tmp_path)
    assert r.returncode == 0
    assert "verify" in r.stdout and "synthesize" in r.stdout


@pytest.mark.skipif(not SHARED_XML.is_dir(), reason="shared/data is not beside this checkout")
def test_verify_a_real_msccl_file(tmp_path):
    r = collc("verify", str(SHARED_XML / "gen-mscclang__ag_ring_8.xml"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


def test_schedule_library_one_xml_per_size_band(tmp_path):
    r = collc("compile", "--topology", "ring(4)", "--collective", "allgather", "--size", "4KiB,1MiB,64MiB",
              "--algorithm", "ring", "--backend", "msccl-xml", "-o", "algos/", "-q", "--report", "r.json",
              cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    import xml.etree.ElementTree as ET

    files = sorted((tmp_path / "algos").glob("*.xml"))
    assert len(files) == 3
    bands = sorted((int(ET.parse(f).getroot().get("minBytes")), int(ET.parse(f).getroot().get("maxBytes")))
                   for f in files)
    assert bands[0][0] == 0 and bands[-1][1] == 0  # from zero, and open-ended
    for (lo, hi), (next_lo, _) in zip(bands, bands[1:]):
        assert lo <= hi < next_lo, bands  # non-overlapping, in order
    v = collc("verify", *[str(f) for f in files], cwd=tmp_path)
    assert v.returncode == 0, v.stderr
    reports = json.loads((tmp_path / "r.json").read_text())
    assert [rep["size_bytes"] for rep in reports] == [4096, 1 << 20, 64 << 20]


def test_quiet_compile_prints_nothing_not_even_the_solver_banner(tmp_path):
    # The solver library writes a banner from C++ to file descriptor 1 when its first
    # instance is made; a subprocess sees what a user's terminal (or a pipe) would.
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "collc", "compile", "--topology", "ring(n=4)", "--collective",
                          "allgather", "--size", "1MiB", "-o", "out.json", "-q"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "" and "HiGHS" not in run.stderr


def test_the_command_ends_without_tearing_its_heap_down_and_loses_no_output(tmp_path):
    """`collc` leaves with os._exit once main() returns (the interpreter's teardown of a
    large compile's objects cost a second): everything printed to a pipe and every file
    must be complete, and the exit status main() chose must be the process's."""
    code = ("import sys, collc.cli as c\n"
            "c.main = lambda: (print('x' * 100_000, end=''), sys.stderr.write('tail'), 3)[2]\n"
            "c.run()\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and r.stdout == "x" * 100_000 and r.stderr == "tail"
    # A thread still running keeps the normal exit, which waits for it.
    code = ("import threading, time, collc.cli as c\n"
            "t = threading.Thread(target=lambda: (time.sleep(0.3), print('thread done')))\n"
            "c.main = lambda: (t.start(), 0)[1]\n"
            "c.run()\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "thread done\n"


def test_a_profiled_run_keeps_the_normal_exit(tmp_path):
    # python -m cProfile writes its statistics after the program returns: the fast exit
    # must not take that away from someone measuring collc.
    r = subprocess.run([sys.executable, "-m", "cProfile", "-o", "prof.out", "-m", "collc", "list"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "prof.out").stat().st_size > 0


def test_allreduce_over_nodes_to_msccl_xml_and_its_errors(tmp_path):
    r = collc("compile", "--topology", "dgx_h100(nodes=2)", "--collective", "allreduce", "--size", "1GiB",
              "--pipeline", "synthesize{nodes=on}", "--backend", "msccl-xml", "-o", "ar.xml", "--no-baselines",
              cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "steady+ring over 2 nodes" in r.stdout
    r = collc("verify", "--sms", "132", "ar.xml", cwd=tmp_path)
    assert r.returncode == 0 and "ok (allreduce, 16 GPUs" in r.stdout, r.stdout + r.stderr
    # A cluster without nodes: a clear error, no traceback, no file.
    r = collc("compile", "--topology", "dgx1", "--collective", "allreduce", "--size", "1GiB",
              "--pipeline", "synthesize{nodes=on}", "-o", "dgx1.json", cwd=tmp_path)
    assert r.returncode == 1 and "do not form two or more nodes" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "dgx1.json").exists()
    r = collc("compile", "--topology", "dgx1", "--collective", "allreduce", "--size", "1GiB",
              "--pipeline", "synthesize{nodes=maybe}", "-o", "dgx1.json", cwd=tmp_path)
    assert r.returncode == 1 and "nodes must be one of auto, on, off" in r.stderr


# Modules `collc --help` must not load: each costs start-up time every command pays.
NOT_FOR_HELP = ("multiprocessing", "socket", "collc.harvest.manager", "collc.harvest.client", "highspy",
                "networkx", "matplotlib", "collc.driver", "collc.frontend")


def test_help_loads_neither_the_solver_nor_the_harvest_manager(tmp_path):
    import subprocess
    import sys

    probe = ("import sys\nfrom collc.cli import build_parser\nbuild_parser()\n"
             f"print(sorted(m for m in {NOT_FOR_HELP!r} if m in sys.modules))\n")
    # Not from the checkout: `python -c` puts the current directory first on sys.path.
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_harvest_packages_names_are_there_on_first_use():
    import collc.harvest as harvest
    from collc.harvest.client import HarvestClient
    from collc.harvest.tasks import TaskSpec

    assert harvest.HarvestClient is HarvestClient and harvest.TaskSpec is TaskSpec
    assert set(harvest.__all__) <= set(dir(harvest))


# Modules `collc check` of a pipeline file must not load: numpy comes with schedules
# (stdlib builders, the array verifier, demand matrices), not with reading a file.
NOT_FOR_CHECK = ("numpy", "highspy", "networkx", "collc.driver", "collc.synthesis", "collc.frontend.stdlib_builders",
                 "collc.frontend.demand", "collc.verify.arrays")


def test_check_of_a_pipeline_file_loads_no_numpy(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "pipeline_dgx1.coll"
    probe = ("import sys\nfrom collc.cli import main\n"
             f"code = main(['check', {str(example)!r}])\n"
             f"print(code, sorted(m for m in {NOT_FOR_CHECK!r} if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "0 []"


def _command_names(parser) -> list[str]:
    import argparse

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def test_each_command_is_registered_by_the_module_the_table_names():
    from collc.cli import COMMANDS, build_parser

    assert _command_names(build_parser()) == list(COMMANDS)  # `--help`'s order
    for name, module in COMMANDS.items():
        alone = _command_names(build_parser([name, "--help"]))
        assert alone == [other for other, owner in COMMANDS.items() if owner == module]
    assert _command_names(build_parser(["--version"])) == list(COMMANDS)
    assert _command_names(build_parser(["nonesuch"])) == list(COMMANDS)
