"""How long a pipeline step's timeline takes at the issue's scale.

    python3 bench/bench_pipeline.py      # writes bench/results/pipeline.json and pipeline.md

Jobs: interleaved 1F1B with 64 stages, 512 micro-batches and 2 chunks (131k actions,
the issue's target: under a second), the same with 1F1B and with 4 chunks, and ZB-H1 at
16 x 128. Each phase is timed best-of-3: building the schedule's order, laying out the
timeline, checking it, and finding every stage's bubbles. A pure-Python reference loop
is timed alongside, so figures from a busy machine can be scaled: on a shared machine
quote the ratio of a phase to the reference, not the bare seconds.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from collc.io import atomic_write
from collc.pipeline import bubbles, checks, schedules
from collc.pipeline.timeline import StageCosts, build_timeline

JOBS = [("interleaved", 64, 512, 2), ("1f1b", 64, 512, 1), ("interleaved", 64, 512, 4), ("zb-h1", 16, 128, 1)]
REPEATS = 3


def best(fn):
    times, out = [], None
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, min(times)


def reference_loop() -> float:
    """A fixed amount of plain Python work (10^6 multiply-adds)."""
    _, t = best(lambda: sum(i * i for i in range(1_000_000)))
    return t


def main() -> None:
    ref = reference_loop()
    rows = []
    for kind, p, m, v in JOBS:
        order, t_order = best(lambda: schedules.build(kind, p, m, v))
        costs = StageCosts.uniform(order, 1e-3, 2e-3, transfer=50e-6, gradient=5e-3)
        tl, t_timeline = best(lambda: build_timeline(order, costs))
        _, t_check = best(lambda: checks.check_timeline(tl))
        _, t_bubbles = best(lambda: bubbles.bubble_columns(tl))  # every rank's at once
        actions = len(order.columns)
        rows.append({"schedule": kind, "stages": p, "microbatches": m, "chunks": v, "actions": actions,
                     "order_s": t_order, "timeline_s": t_timeline, "check_s": t_check, "bubbles_s": t_bubbles,
                     "timeline_over_reference": t_timeline / ref, "step_ms": tl.step_s * 1e3})
        print(f"{kind:12} p={p:3} m={m:4} v={v}  {actions:7} actions  order {t_order:.3f} s  timeline "
              f"{t_timeline:.3f} s  check {t_check:.3f} s  bubbles {t_bubbles:.3f} s")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    result = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
              "load_average_1min": load, "reference_loop_s": ref, "jobs": rows}
    out = Path(__file__).resolve().parent / "results"
    atomic_write(out / "pipeline.json", json.dumps(result, indent=1) + "\n")
    lines = [f"Pipeline timelines (bench/bench_pipeline.py); Python {result['python']}, {result['cpus']} CPUs, "
             f"load average {load:.1f}; reference loop {ref:.3f} s.", "",
             "| schedule | stages | micro-batches | chunks | actions | order (s) | timeline (s) | check (s) | "
             "bubbles (s) | timeline / reference |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['schedule']} | {r['stages']} | {r['microbatches']} | {r['chunks']} | {r['actions']} | "
                     f"{r['order_s']:.3f} | {r['timeline_s']:.3f} | {r['check_s']:.3f} | {r['bubbles_s']:.3f} | "
                     f"{r['timeline_over_reference']:.1f} |")
    atomic_write(out / "pipeline.md", "\n".join(lines) + "\n")
    print(f"reference loop {ref:.3f} s, load average {load}")


if __name__ == "__main__":
    main()
