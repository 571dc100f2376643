"""`collc profile FILE --json OUT` with two installed collc commands, back to back: the
least CPU time (the process and its workers) of N runs each, with its wall time and the
load before it. Both see the same load, so the CPU ratio is the figure to quote on a
busy machine.

    python3 bench/compare_profile_cpu.py RUNS BEFORE_COLLC THIS_COLLC FILE...
    COLLC_NCCL_LOG_PROCESSES=1 python3 bench/compare_profile_cpu.py ...   # one process
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time


def timed(collc: str, path: str, out: str) -> tuple[float, float, float]:
    """(CPU s, wall s, load) of one run."""
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([collc, "profile", path, "--json", out], stdout=subprocess.DEVNULL, check=True,
                   cwd=os.path.dirname(out))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return round(cpu, 3), round(wall, 3), round(load, 2)


def main() -> int:
    runs, commands, files = int(sys.argv[1]), {"before": sys.argv[2], "this": sys.argv[3]}, sys.argv[4:]
    mode = os.environ.get("COLLC_NCCL_LOG_PROCESSES", "default")
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            best: dict[str, tuple[float, float, float]] = {}
            for _ in range(runs):
                for key, collc in commands.items():     # alternated: both see the same load
                    run = timed(collc, os.path.abspath(path), os.path.join(tmp, "out.json"))
                    best[key] = min(best.get(key, run), run)
            ratio = round(best["this"][0] / best["before"][0], 2)
            print(f"{os.path.basename(path)} ({mode}): (CPU s, wall s, load) {best}; CPU this/before {ratio}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
