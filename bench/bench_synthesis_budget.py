"""Synthesis under a backend's op budget, against cluster size: the schedule-producing passes.

For each case, in a fresh process: `collc.driver.produce_schedule(job, budget)` (synthesize,
then verify: what `collc compile` runs before any backend), with the op budget the
backend gives synthesis (`get_backend(B).op_budget(ranks)`; MSCCL XML: 1,024 ops per
rank). Recorded: CPU seconds and wall seconds of that call, the synthesize pass's own
seconds (wall), peak resident memory of the process, ops, chunks per rank, the
schedule's modelled time against the lower bound, the work done (LP solves, pricing
rounds, candidates), and the machine's load average around the run. The machine may be
shared: CPU seconds are what the run cost; wall seconds are inflated by the load.

    python3 bench/bench_synthesis_budget.py [--cases NAME,...] [--out bench/results/synthesis_budget]

Writes synthesis_budget.json and synthesis_budget.md, merging with rows already there (so
cases can be run in batches).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
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
    size_bytes: int
    backend: str  # whose op budget synthesis gets ("json": none beyond the pass's default)


CASES = tuple(
    Case(f"allgather-1GiB-dgx_h100x{n}-xml", f"dgx_h100(nodes={n})", "allgather", GIB, "msccl-xml")
    for n in (32, 64, 128)
) + tuple(
    Case(f"alltoall-1GiB-dgx_h100x{n}", f"dgx_h100(nodes={n})", "alltoall", GIB, "json") for n in (2, 4, 8, 16)
)


def run_once(case: Case) -> dict:
    """produce_schedule for the case in this process; its figures."""
    from collc import frontend
    from collc.backends import get_backend
    from collc.driver import CompileJob, produce_schedule
    from collc.ir.heap import few_collections

    topology = frontend.resolve_topology(case.topology, None)
    collective = frontend.resolve_collective(case.collective, topology.num_ranks, None)
    job = CompileJob(topology=topology, collective=collective, size_bytes=case.size_bytes)
    back = get_backend(case.backend)
    budget = back.op_budget(collective.ranks) if back.op_budget else None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with few_collections():  # as compile_job runs it
        unit, solver = produce_schedule(job, budget)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    solver = solver or {}
    bound = solver.get("lower_bound_s")
    return {
        "budget": budget, "cpu_s": cpu, "wall_s": wall, "solver_s": solver.get("seconds"),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "ops": len(unit.schedule.ops), "chunks": solver.get("chunks"), "method": solver.get("method"),
        "ratio_to_bound": solver["estimate_s"] / bound if bound else None,
        "work": {k: solver.get(k) for k in WORK_KEYS},
        "tried": solver.get("steady_tried"), "rate_model": solver.get("rate_model"),
    }


def run_case(case: Case) -> dict:
    row, load_before, load_after = run_fresh(__file__, case.name)
    return {"case": case.name, "topology": case.topology, "collective": case.collective,
            "size_bytes": case.size_bytes, "backend": case.backend, "load_before": load_before,
            "load_after": load_after, **row}


def markdown(rows: list[dict], machine: str) -> str:
    lines = [
        "# Synthesis under a backend's op budget, against cluster size",
        "",
        f"`python3 bench/bench_synthesis_budget.py` on {machine}: `collc.driver.produce_schedule`",
        "(synthesize, then verify) in a fresh process per case, with the backend's op budget.",
        "CPU s is what the run cost; wall s is inflated by whatever else ran (load: 1-minute",
        "load average before-after).",
        "",
        "| case | GPUs | op budget | CPU s | wall s | synthesize s (wall) | peak MiB | ops | chunks | "
        "time / bound | work (LP solves, pricing rounds) | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        gpus = 8 * int(r["topology"].split("=")[1].rstrip(")"))
        ratio = f"{r['ratio_to_bound']:.4f}" if r["ratio_to_bound"] else "n/a"
        budget = f"{r['budget']:,}" if r["budget"] else "none"
        lines.append(
            f"| {r['case']} | {gpus:,} | {budget} | {r['cpu_s']:.1f} | {r['wall_s']:.1f} | {r['solver_s']:.1f} | "
            f"{r['peak_rss_bytes'] / MIB:.0f} | {r['ops']:,} | {r['chunks']} | {ratio} | "
            f"{r['work']['solver_runs']}, {r['work']['pricing_rounds']} | "
            f"{r['load_before']:.1f}-{r['load_after']:.1f} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "synthesis_budget"),
                    help="output path without suffix")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)  # run one case here, print JSON
    args = ap.parse_args(argv)
    by_name = {c.name: c for c in CASES}
    if args.one:
        print(json.dumps(run_once(by_name[args.one])))
        return 0
    names = [n for n in args.cases.split(",") if n] or list(by_name)
    check_names(ap, names, list(by_name))
    out = Path(args.out)
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    done = earlier_rows(out)
    for name in names:
        row = run_case(by_name[name])
        done[name] = row
        print(f"{name}: {row['cpu_s']:.1f} CPU s, {row['wall_s']:.1f} wall s, {row['peak_rss_bytes'] / MIB:.0f} MiB, "
              f"{row['ops']:,} ops, {row['chunks']} chunks", flush=True)
        save_rows(out, machine, done, list(by_name), markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
