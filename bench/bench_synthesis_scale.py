"""How synthesis cost grows with the cluster: AllGather (or AllToAll) 1 GiB on dgx_h100(nodes=N).

Stage by stage, in one process per N, what `collc compile` does before the backend:
the front end, the lower bounds (collc.analysis.bounds), the synthesize pass with its
defaults (method auto, tolerance 1%, no time limit given; the op cap the JSON backend
uses), and the alpha-beta simulation of the schedule. Peak resident memory is the
process's. The machine may be shared: the load average before and after is recorded.

    python3 bench/bench_synthesis_scale.py [--nodes 64,128] [--out bench/results/synthesis_scale]
    python3 bench/bench_synthesis_scale.py --collective alltoall   # -> synthesis_scale_alltoall.*
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

MIB, GIB = 1 << 20, 1 << 30


def run_one(nodes: int, collective: str = "allgather") -> dict:
    from collc.analysis.bounds import lower_bounds
    from collc.analysis.simulate import simulate
    from collc.frontend import resolve_topology
    from collc.ir.collective import standard
    from collc.synthesis.core import synthesize
    from collc.synthesis.options import SynthesisOptions

    row: dict = {"nodes": nodes, "gpus": 8 * nodes, "collective": collective, "load_before": os.getloadavg()[0]}
    t = time.perf_counter()
    topo = resolve_topology(f"dgx_h100(nodes={nodes})")
    coll = standard(collective, topo.num_ranks)
    row["front_s"] = time.perf_counter() - t
    t = time.perf_counter()
    bound = lower_bounds(topo, coll, GIB)
    row["bounds_s"] = time.perf_counter() - t
    t = time.perf_counter()
    result = synthesize(topo, coll, GIB, SynthesisOptions(progress=False))
    row["synthesize_s"] = time.perf_counter() - t  # includes the pass's own verification
    t = time.perf_counter()
    sim = simulate(result.schedule, topo, GIB)
    row["simulate_s"] = time.perf_counter() - t
    row.update(ratio_to_bound=sim.time_s / bound.best_s, bound_kind=bound.dominant, chunks=result.chunks,
               ops=len(result.schedule.ops), work={k: result.facts.get(k) for k in (
                   "solver_runs", "pricing_rounds", "candidates_timed", "time_limit_fired")},
               replicated=result.facts.get("replicated"),
               peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
               load_after=os.getloadavg()[0])
    return row


NAMES = {"allgather": "AllGather", "alltoall": "AllToAll", "reducescatter": "ReduceScatter"}


def markdown(rows: list[dict], collective: str = "allgather") -> str:
    flag = "" if collective == "allgather" else f" --collective {collective}"
    lines = ["# Synthesis cost against cluster size", "",
             f"`python3 bench/bench_synthesis_scale.py{flag}`: {NAMES[collective]} 1 GiB on dgx_h100(nodes=N), "
             "stage by stage",
             "(seconds; the machine is shared, load averages given).", "",
             "| N | GPUs | time / bound | bounds s | synthesize s | simulate s | peak MiB | chunks, ops | LP runs | load |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['nodes']} | {r['gpus']} | {r['ratio_to_bound']:.4f} | {r['bounds_s']:.1f} | "
                     f"{r['synthesize_s']:.1f} | {r['simulate_s']:.1f} | {r['peak_rss_bytes'] / MIB:.0f} | "
                     f"{r['chunks']}, {r['ops']} | {r['work']['solver_runs']} | "
                     f"{r['load_before']:.1f}-{r['load_after']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="2,4,8,16,32,64,128")
    ap.add_argument("--collective", default="allgather", choices=sorted(NAMES))
    ap.add_argument("--out", default=None, help="results path without suffix (default "
                    "bench/results/synthesis_scale, with _COLLECTIVE for other collectives)")
    ap.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one, args.collective)))
        return 0
    if args.out is None:
        suffix = "" if args.collective == "allgather" else f"_{args.collective}"
        args.out = str(Path(__file__).resolve().parent / "results" / f"synthesis_scale{suffix}")
    from collc.io import atomic_write

    out = Path(args.out)
    old = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").exists() else []
    rows = {r["nodes"]: r for r in old}
    for n in (int(x) for x in args.nodes.split(",")):
        proc = subprocess.run([sys.executable, __file__, "--one", str(n), "--collective", args.collective],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode
        rows[n] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"nodes={n}: x{rows[n]['ratio_to_bound']:.4f}, synthesize {rows[n]['synthesize_s']:.1f} s, "
              f"{rows[n]['peak_rss_bytes'] / MIB:.0f} MiB", flush=True)
        ordered = [rows[k] for k in sorted(rows)]
        atomic_write(out.with_suffix(".json"), json.dumps(ordered, indent=2) + "\n")
        atomic_write(out.with_suffix(".md"), markdown(ordered, args.collective))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
