"""How long the lower bounds and the simulator take at realistic scale.

    python3 bench/analysis_scaling.py        # writes bench/results/analysis_scaling.json

Topologies are the standard library's (TE-CCL's DGX-2 and NDv2 pairs, 8 DGX H100
nodes); schedules are a pipelined ring AllGather on ring(64) (about 200k ops) and a
one-step direct AllToAll on a switch.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

from collc import frontend
from collc.analysis.bounds import lower_bounds
from collc.analysis.simulate import simulate
from collc.io import atomic_write
from collc.ir import Buffer, Loc, Op, OpKind, Schedule
from collc.ir.collective import alltoall, standard

# The test suite's schedule builders (tests/schedules.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from schedules import pipelined_ring_allgather  # noqa: E402


def direct_alltoall(n: int) -> Schedule:
    ops = tuple(Op(s * n + d, OpKind.COPY, Loc(s, Buffer.INPUT, d), Loc(d, Buffer.OUTPUT, s))
                for s in range(n) for d in range(n))
    return Schedule("direct", alltoall(n), f"switch{n}", ops)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    size = 10**9
    rows = []
    for spec in ("dgx2(chassis=2)", "ndv2(chassis=2)", "dgx_h100(nodes=8)"):
        topo = frontend.resolve_topology(spec)
        for kind in ("allgather", "reducescatter", "allreduce", "alltoall", "broadcast"):
            lb, sec = timed(lambda: lower_bounds(topo, standard(kind, topo.num_ranks), size))
            rows.append({"what": "lower_bounds", "topology": spec, "collective": kind, "seconds": sec,
                         "best_us": lb.best_s * 1e6, "dominant": lb.dominant, "cut_us": lb.cut_s * 1e6,
                         "ingress_us": lb.ingress_s * 1e6, "volume_us": lb.volume_s * 1e6})
            print(f"bounds {spec:18} {kind:14} {sec:6.2f}s best {lb.best_s * 1e6:10.1f} us ({lb.dominant})")
    cases = [(pipelined_ring_allgather(64, 50), frontend.resolve_topology("ring(n=64)")),
             (direct_alltoall(32), frontend.resolve_topology("switch(n=32)")),
             (direct_alltoall(64), frontend.resolve_topology("switch(n=64)"))]
    for sched, topo in cases:
        for sharing in ("fifo", "fair"):
            sim, sec = timed(lambda: simulate(sched, topo, size, sharing=sharing))
            rows.append({"what": "simulate", "schedule": sched.name, "topology": topo.name, "ops": len(sched.ops),
                         "sharing": sharing, "seconds": sec, "time_us": sim.time_s * 1e6})
            print(f"simulate {sched.name:15} {topo.name:7} {len(sched.ops):7} ops {sharing:4} {sec:6.2f}s "
                  f"-> {sim.time_s * 1e6:10.1f} us")
    out = Path(__file__).resolve().parent / "results" / "analysis_scaling.json"
    atomic_write(out, json.dumps({"machine": platform.platform(), "python": platform.python_version(),
                                  "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
