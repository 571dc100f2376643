"""Where a hand-written compile spends its time, stage by stage (everything but a backend).

For `collc compile --topology "ring(N)" --collective C --algorithm ring --size 1GiB`, one
fresh Python process per case runs the stages the driver runs, each timed in CPU
seconds (time.process_time):

  start       importing collc and loading the parser (what every `collc` process pays)
  topology    `resolve_topology("ring(N)")`
  definition  `resolve_collective(C, N)`: the collective's definition
  algorithm   `instantiate_algorithm("ring", ...)`: the ring builder and the symbolic
              verification of its schedule (`verify` is also timed alone, as `verify`)
  simulate    the alpha-beta simulation of the schedule (the report's time)
  bounds      `lower_bounds` (ingress, egress, volume, cut, latency)
  baselines   the stdlib algorithms for the collective, timed on the same model (the
              job's own ring is reused, not rebuilt)
  compile     `compile_job` with no output file and the schedule already built, in the
              same process afterwards (the report: simulation, bounds, baselines)
  reverify    what the pass manager does after `msccl-merge` (the merge itself not
              timed): verify the merged schedule again (`verify_rewritten`: the same
              work as the verified schedule, checked on arrays; older code: `verify`)

and the process's peak resident memory (getrusage ru_maxrss). Then, in another fresh
process, the whole compile as the CLI runs it up to its backend (`run_whole`): CPU
seconds including the imports, and that process's peak memory. The backend's lowering and
file writing are not included: they belong to the backend (bench/bench_scale.py times
the whole `collc compile ... --backend msccl-xml`).

Usage: python3 bench/bench_compile_stages.py [--ranks 256,512,1024] [--collectives allreduce]
       [--markdown]   (prints the table of bench/results/compile_stages.md)
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time

STAGES = ["start", "topology", "definition", "algorithm", "verify", "simulate", "bounds", "baselines", "compile",
          "reverify"]


def run_case(ranks: int, collective: str) -> dict:
    """The stages in this process (called in a fresh child by `main`)."""
    t = time.process_time()
    import collc.frontend as fe
    from collc.analysis.bounds import _lower_bounds, lower_bounds
    from collc.analysis.simulate import simulate
    from collc.driver import CompileJob, baselines_for, compile_job
    from collc.frontend.parser import lark_parser
    from collc.ir.heap import few_collections
    from collc.verify import verify

    lark_parser()
    out: dict = {"ranks": ranks, "collective": collective}
    out["start"] = time.process_time() - t
    size = 1 << 30

    def timed(name, fn):
        t0 = time.process_time()
        value = fn()
        out[name] = time.process_time() - t0
        return value

    with few_collections():
        topo = timed("topology", lambda: fe.resolve_topology(f"ring({ranks})"))
        coll = timed("definition", lambda: fe.resolve_collective(collective, ranks))
        sched = timed("algorithm", lambda: fe.instantiate_algorithm("ring", topo, coll))
        timed("verify", lambda: verify(sched, topo))
        sim = timed("simulate", lambda: simulate(sched, topo, size))
        timed("bounds", lambda: lower_bounds(topo, coll, size))
        job = CompileJob(topology=topo, collective=coll, size_bytes=size, algorithm="ring", schedule=sched)
        timed("baselines", lambda: baselines_for(job, sched, sim.time_s))
    out["ops"] = len(sched.ops)
    _lower_bounds.cache_clear()  # the whole compile pays for its bounds
    timed("compile", lambda: compile_job(job, "json", None))
    from collc.backends.msccl_xml.merge import merge_ops

    merged = merge_ops(sched)
    try:
        from collc.verify.regrouped import verify_rewritten
    except ImportError:  # the code before this check: the pass manager verified in full
        timed("reverify", lambda: verify(merged, topo))
    else:
        timed("reverify", lambda: verify_rewritten(sched, merged, topo))
    out["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def run_whole(ranks: int, collective: str) -> dict:
    """What `collc compile --topology "ring(N)" --collective C --algorithm ring --size 1GiB`
    does before its backend writes a file, in this (fresh) process: resolve the
    topology and collective, then `compile_job` (ring builder, verification, report
    with simulation, bounds and baselines). CPU seconds include the imports."""
    import collc.frontend as fe
    from collc.driver import CompileJob, compile_job

    topo = fe.resolve_topology(f"ring({ranks})")
    coll = fe.resolve_collective(collective, ranks)
    result = compile_job(CompileJob(topology=topo, collective=coll, size_bytes=1 << 30, algorithm="ring"),
                         "json", None)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"ranks": ranks, "collective": collective, "whole_cpu_s": usage.ru_utime + usage.ru_stime,
            "whole_peak_mib": usage.ru_maxrss / 1024, "time_us": result.report["time_us"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="256,512,1024")
    ap.add_argument("--collectives", default="allreduce")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("RANKS", "COLLECTIVE"), help=argparse.SUPPRESS)
    ap.add_argument("--whole", nargs=2, metavar=("RANKS", "COLLECTIVE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_case(int(args.child[0]), args.child[1])))
        return
    if args.whole:
        print(json.dumps(run_whole(int(args.whole[0]), args.whole[1])))
        return
    rows = []
    for coll in args.collectives.split(","):
        for n in (int(x) for x in args.ranks.split(",")):
            row = {}
            for mode in ("--child", "--whole"):  # each in a fresh process
                proc = subprocess.run([sys.executable, __file__, mode, str(n), coll], capture_output=True,
                                      text=True, check=True)
                row.update(json.loads(proc.stdout))
            rows.append(row)
            if not args.markdown:
                print(json.dumps(rows[-1]), flush=True)
    if args.markdown:
        print(f"Measured on {platform.machine()}, Python {platform.python_version()}; CPU seconds.\n")
        print("| collective | ranks | ops | " + " | ".join(STAGES) + " | whole compile s | its peak MiB |")
        print("|---|---|---|" + "---|" * (len(STAGES) + 2))
        for r in rows:
            cells = " | ".join(f"{r[s]:.2f}" for s in STAGES)
            print(f"| {r['collective']} | {r['ranks']} | {r['ops']:,} | {cells} | {r['whole_cpu_s']:.2f} | "
                  f"{r['whole_peak_mib']:.0f} |")


if __name__ == "__main__":
    main()
