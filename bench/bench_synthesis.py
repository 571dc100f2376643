"""Synthesis quality and cost on the standard topologies.

For each case: the synthesize pass (method auto, the case's time limit) on the stdlib
topology; the schedule's time in the alpha-beta simulator (sharing "fifo") against the
best lower bound (collc.analysis.bounds) and against the stdlib ring algorithm simulated
the same way; the pass's wall time; and the peak resident memory of the process that ran
it (each case runs in its own process, so peaks do not mix).

    python3 bench/bench_synthesis.py [--cases NAME,...] [--out bench/results/synthesis]

Writes synthesis.json and synthesis.md under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from collc.io import atomic_write

GIB, MIB, KIB = 1 << 30, 1 << 20, 1 << 10


@dataclass(frozen=True)
class Case:
    name: str
    topology: str
    collective: str
    size_bytes: int
    time_limit: float  # seconds: the goal for solver time, given to the pass as its limit
    goal_ratio: float | None  # schedule time / lower bound at most this (None: ring is the goal)


CASES = (
    Case("allgather-256MiB-dgx1", "dgx1", "allgather", 256 * MIB, 5, 1.02),
    Case("allgather-1GiB-ndv2x2", "ndv2(chassis=2)", "allgather", GIB, 60, 1.05),
    Case("allgather-1GiB-dgx2x2", "dgx2(chassis=2)", "allgather", GIB, 60, 1.01),
    Case("alltoall-1GiB-ndv2x2", "ndv2(chassis=2)", "alltoall", GIB, 120, 1.05),
    Case("allgather-1GiB-dgx_h100x8", "dgx_h100(nodes=8)", "allgather", GIB, 300, 1.10),
    Case("allgather-64KiB-dgx1", "dgx1", "allgather", 64 * KIB, 5, None),
)


def run_case(case: Case) -> dict:
    """Run one case in this process and return its measurements."""
    from collc.analysis.bounds import lower_bounds
    from collc.analysis.simulate import simulate
    from collc.diagnostics import CollcError
    from collc.frontend import instantiate_algorithm, resolve_topology
    from collc.ir.collective import standard
    from collc.passes import CompileUnit, PassManager
    from collc.verify import verify

    topo = resolve_topology(case.topology)
    coll = standard(case.collective, topo.num_ranks)
    bound = lower_bounds(topo, coll, case.size_bytes)
    # The pass alone: the pass manager's own re-verification is not synthesis time.
    pipeline = PassManager.from_text(f"synthesize{{time_limit={case.time_limit} progress=false}}",
                                     verify_between=False)
    t0 = time.perf_counter()
    unit = pipeline.run(CompileUnit(topo, coll, case.size_bytes))
    solver_s = time.perf_counter() - t0
    verify(unit.schedule, topo)
    sched = unit.schedule
    sim = simulate(sched, topo, case.size_bytes)
    try:
        ring = instantiate_algorithm("ring", topo, coll)
        ring_s = simulate(ring, topo, case.size_bytes).time_s
    except CollcError:
        ring_s = None  # the stdlib ring has no such collective (AllToAll)
    note = unit.notes["synthesize"]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return {
        "case": case.name, "topology": case.topology, "collective": case.collective, "size_bytes": case.size_bytes,
        "time_limit_s": case.time_limit, "goal_ratio": case.goal_ratio,
        "schedule_us": sim.time_s * 1e6, "lower_bound_us": bound.best_s * 1e6, "bound_kind": bound.dominant,
        "ratio_to_bound": sim.time_s / bound.best_s if bound.best_s > 0 else None,
        "ring_us": ring_s * 1e6 if ring_s is not None else None,
        "ratio_to_ring": sim.time_s / ring_s if ring_s else None,
        "solver_s": solver_s, "peak_rss_bytes": peak, "ops": len(sched.ops),
        "method": note["method"], "status": note["status"], "chunks": note["chunks"],
        "variables": note["variables"], "constraints": note["constraints"],
        "estimate_matches_simulator": abs(note["estimate_s"] - sim.time_s) <= 1e-9 * sim.time_s,
    }


def verdict(row: dict) -> str:
    ok = row["solver_s"] < row["time_limit_s"] and row["peak_rss_bytes"] < 8 * GIB
    if row["ratio_to_ring"] is not None:
        ok &= row["ratio_to_ring"] <= 1.0
    if row["goal_ratio"] is not None:
        ok &= row["ratio_to_bound"] <= row["goal_ratio"]
    return "met" if ok else "MISSED"


def markdown(rows: list[dict], machine: str) -> str:
    lines = [
        "# Synthesis benchmark",
        "",
        f"`python3 bench/bench_synthesis.py` on {machine}. Method auto; each case's solver-time goal is",
        "also its time limit. Times are the alpha-beta simulator's (sharing fifo); the bound is",
        "the best of collc.analysis.bounds; the ring is the stdlib ring algorithm, simulated alike.",
        "",
        "| case | schedule | bound | time / bound (goal) | time / ring | solver s (goal) | peak MiB | method, chunks, ops | goals |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        goal = f"{r['goal_ratio']:.2f}" if r["goal_ratio"] is not None else "ring"
        ring = f"{r['ratio_to_ring']:.3f}" if r["ratio_to_ring"] is not None else "n/a"
        lines.append(
            f"| {r['case']} | {r['schedule_us']:.1f} us | {r['lower_bound_us']:.1f} us ({r['bound_kind']}) | "
            f"{r['ratio_to_bound']:.4f} ({goal}) | {ring} | {r['solver_s']:.1f} ({r['time_limit_s']:g}) | "
            f"{r['peak_rss_bytes'] / MIB:.0f} | {r['method']}, {r['chunks']}, {r['ops']} | {verdict(r)} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "synthesis"),
                    help="output path without suffix")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)  # run one case, print JSON
    args = ap.parse_args(argv)
    by_name = {c.name: c for c in CASES}
    if args.one:
        print(json.dumps(run_case(by_name[args.one])))
        return 0
    names = [n for n in args.cases.split(",") if n] or list(by_name)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    rows = []
    for name in names:
        proc = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return proc.returncode
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{name}: {row['schedule_us']:.1f} us, x{row['ratio_to_bound']:.4f} of the bound, "
              f"{row['solver_s']:.1f} s, {row['peak_rss_bytes'] / MIB:.0f} MiB, {verdict(row)}", flush=True)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    out = Path(args.out)
    atomic_write(out.with_suffix(".json"), json.dumps({"machine": machine, "cases": rows}, indent=2) + "\n")
    atomic_write(out.with_suffix(".md"), markdown(rows, machine))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
