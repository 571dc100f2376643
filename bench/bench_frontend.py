"""How long the front end takes to load and check the whole standard library.

Measures, in one process:
  - import: importing collc.frontend and loading the LALR parser (Lark's table cache);
  - check_stdlib: `check_file` on every standard library file with all caches cleared
    first (parse, imports, static checks, every topology instantiated with its
    defaults, every collective at 4 ranks, every algorithm verified at 2, 3, 4 and 8
    ranks), median of several runs;
  - per-topology elaboration and ring search for the larger instances;
  - parse throughput over the standard library's text.
Writes bench/results/frontend.json.

Usage: python3 bench/bench_frontend.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

T0 = time.perf_counter()
import collc.frontend as fe  # noqa: E402  (the import is part of what is measured)
from collc.frontend.parser import lark_parser, parse  # noqa: E402

lark_parser()
IMPORT_S = time.perf_counter() - T0

from collc.io import atomic_write  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "frontend.json"
LARGE_TOPOLOGIES = ["dgx1", "ndv2(chassis=2)", "ndv2(chassis=8)", "dgx2(chassis=2)", "dgx_h100(nodes=2)",
                    "dgx_h100(nodes=16)", "mi250(chassis=2)", "mi250(chassis=4)", "torus2d(x=8, y=8)"]


def check_stdlib() -> float:
    fe.clear_caches()
    t = time.perf_counter()
    for path in fe.stdlib_modules().values():
        fe.check_file(path)
    return time.perf_counter() - t


def topology_times(spec: str) -> dict:
    fe.clear_caches()
    fe.resolve_topology("ring")  # load the standard library first: time the instance alone
    t = time.perf_counter()
    topo = fe.resolve_topology(spec)
    t_elab = time.perf_counter() - t
    t = time.perf_counter()
    ring = fe.find_ring(topo)
    t_ring = time.perf_counter() - t
    from collc.frontend.rings import ring_speed

    return {"topology": topo.name, "gpus": topo.num_ranks, "nodes": len(topo.nodes), "links": len(topo.links),
            "elaborate_s": round(t_elab, 5), "ring_s": round(t_ring, 5),
            "ring_bottleneck_GBps": round(ring_speed(topo, ring) / 1e9, 3)}


def parse_throughput(runs: int) -> dict:
    texts = [(str(p), p.read_text()) for p in fe.stdlib_modules().values()]
    chars = sum(len(t) for _, t in texts)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        for name, text in texts:
            parse(text, name)
        times.append(time.perf_counter() - t)
    median = statistics.median(times)
    return {"files": len(texts), "chars": chars, "median_s": round(median, 5),
            "chars_per_s": round(chars / median)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="repetitions of each measurement (median reported)")
    args = ap.parse_args(argv)
    runs = [check_stdlib() for _ in range(args.runs)]
    result = {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "runs": args.runs,
        "import_and_parser_s": round(IMPORT_S, 4),
        "check_stdlib": {"median_s": round(statistics.median(runs), 4), "min_s": round(min(runs), 4),
                         "max_s": round(max(runs), 4), "files": len(fe.stdlib_modules())},
        "parse": parse_throughput(args.runs),
        "topologies": [topology_times(s) for s in LARGE_TOPOLOGIES],
    }
    atomic_write(RESULTS, json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
