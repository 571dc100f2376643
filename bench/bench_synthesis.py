"""Synthesis quality, cost and determinism: what a user gets from the default command.

Every case runs `collc compile --topology T --collective C --size S -o OUT --report R`
(no time limit, no tolerance: the defaults) in a fresh process, twice: once as it
comes, once with another process keeping a core busy (`python3 -c "while 1: pass"`).
Recorded per run: the schedule's time against the best lower bound (from the report:
the alpha-beta simulator and collc.analysis.bounds), the synthesize pass's seconds
("solver seconds", from the report), the command's wall time, its peak resident
memory, the work the search did (solver runs, candidates timed, whether the time limit
fired), a SHA-256 of the output file (the same input must give the same bytes under
load), and the machine's load average around the run (the machine may be shared:
times are inflated by whatever else runs; ratios are not).

    python3 bench/bench_synthesis.py [--cases NAME,...] [--scale] [--allreduce] [--out bench/results/synthesis]

--scale adds AllGather 1 GiB on dgx_h100(nodes=N) for N = 2 ... 128 (16 to 1,024 GPUs),
lowered to MSCCL XML (what a user of that cluster compiles); --allreduce adds AllReduce
1 GiB on the other benchmark topologies. Writes synthesis.json and
synthesis.md (merging with rows already there, so cases can be run in batches).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from case_runs import WORK_KEYS, check_names, earlier_rows, run_fresh, save_rows

GIB, MIB = 1 << 30, 1 << 20


@dataclass(frozen=True)
class Case:
    name: str
    topology: str
    collective: str
    size: str
    goal_ratio: float  # schedule time / lower bound, at most
    goal_seconds: float  # solver seconds, at most
    backend: str = "json"


CASES = (
    Case("allgather-256MiB-dgx1", "dgx1", "allgather", "256MiB", 1.02, 1),
    Case("allgather-1GiB-ndv2x2", "ndv2(chassis=2)", "allgather", "1GiB", 1.02, 2),
    Case("allgather-1GiB-dgx2x2", "dgx2(chassis=2)", "allgather", "1GiB", 1.01, 5),
    Case("allgather-1GiB-dgx_h100x8", "dgx_h100(nodes=8)", "allgather", "1GiB", 1.03, 20),
    Case("allgather-1GiB-dgx_h100x32", "dgx_h100(nodes=32)", "allgather", "1GiB", 1.05, 120),
    Case("allgather-1GiB-dgx_h100x128", "dgx_h100(nodes=128)", "allgather", "1GiB", 1.10, 600, "msccl-xml"),
    Case("allreduce-1GiB-dgx_h100x8", "dgx_h100(nodes=8)", "allreduce", "1GiB", 1.05, 40),
    Case("alltoall-1GiB-ndv2x2", "ndv2(chassis=2)", "alltoall", "1GiB", 1.02, 2),
)
# AllReduce on the other benchmark topologies, with the dgx_h100(nodes=8) case's goals
# as a yardstick (not goals of their own): is the composition near the bound elsewhere?
ALLREDUCE = tuple(Case(f"allreduce-1GiB-{name}", topo, "allreduce", "1GiB", 1.05, 40)
                  for name, topo in (("dgx1", "dgx1"), ("ndv2x2", "ndv2(chassis=2)"), ("dgx2x2", "dgx2(chassis=2)"),
                                     ("dgx_h100x2", "dgx_h100(nodes=2)")))
SCALE = tuple(Case(f"scale-allgather-1GiB-dgx_h100x{n}", f"dgx_h100(nodes={n})", "allgather", "1GiB",
                   1.10, 600, "msccl-xml") for n in (2, 4, 8, 16, 32, 64, 128))


def run_once(case: Case) -> dict:
    """The user's command in this process; its report, the output's digest, peak memory."""
    from collc.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / ("out.xml" if case.backend == "msccl-xml" else "out.json")
        report = Path(tmp) / "report.json"
        argv = ["compile", "--topology", case.topology, "--collective", case.collective, "--size", case.size,
                "--backend", case.backend, "-o", str(out), "--report", str(report), "-q"]
        t0 = time.perf_counter()
        code = main(argv)
        wall = time.perf_counter() - t0
        if code != 0:
            raise SystemExit(f"collc {' '.join(argv)} exited {code}")
        rep = json.loads(report.read_text())
        digest = hashlib.sha256()
        for path in sorted(Path(p) for p in rep["outputs"]):
            digest.update(path.read_bytes())
    solver = rep["solver"]
    return {
        "ratio_to_bound": rep["ratio_to_lower_bound"], "schedule_us": rep["time_us"],
        "lower_bound_us": rep["lower_bound_us"], "bound_kind": rep["lower_bounds"]["dominant"],
        "ratio_to_ring": rep.get("ratio_to_ring"), "solver_s": solver["seconds"], "wall_s": wall,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "method": solver["method"], "chunks": solver.get("chunks"), "ops": rep["schedule"]["ops"],
        "first_ratio": (solver["first_estimate_s"] / solver["lower_bound_s"]
                        if solver.get("first_estimate_s") and solver.get("lower_bound_s") else None),
        "work": {k: solver.get(k) for k in WORK_KEYS},
        "tried": solver.get("steady_tried"), "output_sha256": digest.hexdigest(),
    }


def run_case(case: Case) -> dict:
    rows = []
    for busy in (False, True):
        hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"]) if busy else None
        try:
            row, load_before, load_after = run_fresh(__file__, case.name)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
        row.update(busy_core=busy, load_before=load_before, load_after=load_after)
        rows.append(row)
    first = rows[0]
    return {"case": case.name, "topology": case.topology, "collective": case.collective, "size": case.size,
            "backend": case.backend, "goal_ratio": case.goal_ratio, "goal_seconds": case.goal_seconds,
            "runs": rows, "same_output": len({r["output_sha256"] for r in rows}) == 1,
            **{k: first[k] for k in ("ratio_to_bound", "bound_kind", "method", "chunks", "ops", "first_ratio")}}


def verdict(case: dict) -> str:
    misses = []
    if case["ratio_to_bound"] > case["goal_ratio"]:
        misses.append("ratio")
    if max(r["solver_s"] for r in case["runs"]) > case["goal_seconds"]:
        misses.append("seconds")
    if max(r["peak_rss_bytes"] for r in case["runs"]) >= 8 * GIB:
        misses.append("memory")
    if not case["same_output"]:
        misses.append("determinism")
    return "met" if not misses else "MISSED: " + ", ".join(misses)


def markdown(cases: list[dict], machine: str) -> str:
    lines = [
        "# Synthesis benchmark",
        "",
        f"`python3 bench/bench_synthesis.py` on {machine}. The default command (no time limit,",
        "default tolerance 1%), each case twice: calm, then with another core kept busy. The",
        "machine is shared: load averages (1 min) before/after each run are given; seconds are",
        "inflated by whatever else ran, ratios are not. Solver s = the synthesize pass.",
        "",
        "| case | time / bound (goal) | first schedule / bound | solver s calm / busy (goal) | wall s | "
        "peak MiB | load | chunks, ops | work (LP runs, candidates) | same output | goals |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        a, b = c["runs"]
        first = f"{c['first_ratio']:.4f}" if c["first_ratio"] else "n/a"
        lines.append(
            f"| {c['case']} | {c['ratio_to_bound']:.4f} ({c['goal_ratio']:.2f}) | {first} | "
            f"{a['solver_s']:.1f} / {b['solver_s']:.1f} ({c['goal_seconds']:g}) | {a['wall_s']:.0f} / {b['wall_s']:.0f} | "
            f"{max(a['peak_rss_bytes'], b['peak_rss_bytes']) / MIB:.0f} | "
            f"{a['load_before']:.1f}-{a['load_after']:.1f} / {b['load_before']:.1f}-{b['load_after']:.1f} | "
            f"{c['chunks']}, {c['ops']} | {a['work']['solver_runs']}, {a['work']['candidates_timed']} | "
            f"{'yes' if c['same_output'] else 'NO'} | {verdict(c)} |")
    scale = [c for c in cases if c["case"].startswith("scale-")]
    if scale:
        lines += ["", "## Cost against cluster size (AllGather 1 GiB on dgx_h100(nodes=N), MSCCL XML)", "",
                  "| N | GPUs | time / bound | solver s (calm) | wall s (calm) | peak MiB | chunks, ops | load |",
                  "|---|---|---|---|---|---|---|---|"]
        for c in scale:
            a = c["runs"][0]
            n = int(c["topology"].split("=")[1].rstrip(")"))
            lines.append(f"| {n} | {8 * n} | {c['ratio_to_bound']:.4f} | {a['solver_s']:.1f} | {a['wall_s']:.0f} | "
                         f"{max(r['peak_rss_bytes'] for r in c['runs']) / MIB:.0f} | {c['chunks']}, {c['ops']} | "
                         f"{a['load_before']:.1f}-{a['load_after']:.1f} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="", help="comma-separated case names (default: the goal cases)")
    ap.add_argument("--scale", action="store_true", help="also the dgx_h100 series, 2 to 128 nodes")
    ap.add_argument("--allreduce", action="store_true", help="also AllReduce on dgx1, ndv2, dgx2, dgx_h100(nodes=2)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "synthesis"),
                    help="output path without suffix")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)  # run one case here, print JSON
    args = ap.parse_args(argv)
    by_name = {c.name: c for c in CASES + ALLREDUCE + SCALE}
    if args.one:
        print(json.dumps(run_once(by_name[args.one])))
        return 0
    names = [n for n in args.cases.split(",") if n] or [c.name for c in CASES]
    if args.allreduce and not args.cases:
        names += [c.name for c in ALLREDUCE]
    if args.scale and not args.cases:
        names += [c.name for c in SCALE]
    check_names(ap, names, list(by_name))
    out = Path(args.out)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    done = earlier_rows(out, keep=lambda row: "runs" in row)
    for name in names:
        case = run_case(by_name[name])
        done[name] = case
        a, b = case["runs"]
        print(f"{name}: x{case['ratio_to_bound']:.4f} of the bound, {a['solver_s']:.1f} / {b['solver_s']:.1f} s, "
              f"{max(a['peak_rss_bytes'], b['peak_rss_bytes']) / MIB:.0f} MiB, {verdict(case)}", flush=True)
        save_rows(out, machine, done, [c.name for c in CASES + ALLREDUCE + SCALE], markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
