"""Where the MSCCL XML backend spends its time: CPU seconds of each lowering pass, the
re-verification of the merged schedule, and writing the file, for one problem.

The schedule is produced first (a hand-written algorithm or synthesis, as `collc
compile` would) and is not timed; the stages then run as the driver runs them, in one
process with the driver's garbage-collector setting. Peak memory is the process's.

    python3 bench/lowering_stages.py "ring(256)" allreduce --algorithm ring
    python3 bench/lowering_stages.py "dgx_h100(nodes=16)" allgather
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from collc import frontend
from collc.backends import BackendOptions, get_backend
from collc.backends.msccl_xml.program import coll_token
from collc.driver import CompileJob, produce_schedule
from collc.ir.heap import few_collections
from collc.passes.base import parse_pipeline
from collc.verify import verify


def stages(topology: str, collective: str, algorithm: str | None, size: int) -> list[tuple[str, float]]:
    topo = frontend.resolve_topology(topology, None)
    coll = frontend.resolve_collective(collective, topo.num_ranks, None)
    back = get_backend("msccl-xml")
    budget = None if algorithm else back.op_budget(coll.ranks)
    unit, _ = produce_schedule(CompileJob(topo, coll, size, algorithm=algorithm), budget)
    coll_token(unit.schedule.collective)  # the standard collective it compares with: built by the front end
    options = BackendOptions()
    out: list[tuple[str, float]] = [("schedule ops", float(len(unit.schedule.ops)))]
    for p in parse_pipeline(back.lowering(options)):
        before = unit.schedule
        t0 = time.process_time()
        unit = p.run(unit)
        out.append((p.name, time.process_time() - t0))
        if unit.schedule is not before:  # the pass manager re-verifies a changed schedule
            t0 = time.process_time()
            verify(unit.schedule, unit.topology)
            out.append((f"re-verify after {p.name}", time.process_time() - t0))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.process_time()
        back.emit(unit, Path(tmp) / "out.xml", options)
        out.append(("write XML", time.process_time() - t0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("topology")
    ap.add_argument("collective")
    ap.add_argument("--algorithm", default=None)
    ap.add_argument("--size", type=int, default=1 << 30)
    args = ap.parse_args()
    with few_collections():
        rows = stages(args.topology, args.collective, args.algorithm, args.size)
    print(f"| stage | CPU s |\n|---|---|")
    total = 0.0
    for name, value in rows:
        if name == "schedule ops":
            print(f"| ({int(value):,} ops) | |")
            continue
        total += value
        print(f"| `{name}` | {value:.2f} |")
    print(f"| all of the above | {total:.2f} |")
    print(f"\npeak memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (schedule included)")


if __name__ == "__main__":
    main()
