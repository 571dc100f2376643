"""`collc pipeline` end to end at the sizes the limits allow: many stages, many
micro-batches. Each job runs as a user runs it (`collc pipeline FILE:p(S, M)
--no-synthesis`, in a fresh process) and is timed in CPU seconds of that process (the
machine is shared: wall-clock time is quoted beside it, not instead of it).

    python3 bench/bench_pipeline_scale.py      # writes bench/results/pipeline-scale.{json,md}

Jobs: 1F1B on a star of S GPUs (one switch), S stages x M micro-batches:
- 1,000 x 8 and 8,192 x 8: the stage boundaries' path search (it searched the whole
  topology once per stage: 10 s and over a minute before it stopped at the layer that
  reaches the next stage's GPU);
- 1,000 x 1,000: one million stage-micro-batch pairs, two million compute actions.

Peak memory is the largest of the jobs run so far (getrusage of the children); the jobs
run smallest first.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = [(1000, 8), (8192, 8), (1000, 1000)]
PROGRAM = """
topology star(n = 8) {
    switch sw;
    gpu g[n];
    for i in 0..n { link g[i] <-> sw bw 25 GB/s lat 1 us; }
}
pipeline p(stages = 4, mb = 8) on star(stages) {
    stages = stages;
    microbatches = mb;
    schedule = "1f1b";
    forward = 1 ms;
    backward = 2 ms;
    activations = 16 MiB;
}
"""


def run_job(program: Path, stages: int, microbatches: int) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "collc", "pipeline", f"{program}:p({stages}, {microbatches})",
                           "--no-synthesis", "--json"], capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"collc pipeline {stages} x {microbatches} failed: {done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    return {"stages": stages, "microbatches": microbatches, "actions": 2 * stages * microbatches,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), "wall_s": wall,
            "max_rss_mib": after.ru_maxrss / 1024, "step_us": report["step_us"]}


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        program = Path(tmp) / "star.coll"
        program.write_text(PROGRAM)
        for stages, mb in JOBS:
            row = run_job(program, stages, mb)
            rows.append(row)
            print(f"{stages:5} stages x {mb:5} micro-batches: {row['cpu_s']:.1f} s CPU, {row['wall_s']:.1f} s wall, "
                  f"{row['max_rss_mib']:.0f} MiB", flush=True)
    load = os.getloadavg()[0]
    result = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
              "load_average_1min": load, "jobs": rows}
    out = ROOT / "bench" / "results"
    (out / "pipeline-scale.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"`collc pipeline` end to end (bench/bench_pipeline_scale.py); Python {result['python']}, "
             f"{result['cpus']} CPUs, load average {load:.1f} at the end.", "",
             "| stages | micro-batches | compute actions | CPU s | wall s | peak memory MiB |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['stages']:,} | {r['microbatches']:,} | {r['actions']:,} | {r['cpu_s']:.1f} | "
                     f"{r['wall_s']:.1f} | {r['max_rss_mib']:.0f} |")
    (out / "pipeline-scale.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
