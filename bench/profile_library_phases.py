"""Where `collc profile --topology T --library DIR` spends its time, per phase: the bands'
synthesis (`model._synthesize_all`: worker processes where --workers > 1) and the
library's lowering, verification and writing (`emit_library`: in the command's own
process). Wall time, CPU of this process and CPU of its worker processes, per phase.

    python3 bench/profile_library_phases.py profile JOB.log --topology dgx1 --library DIR -q --workers N

(`bench/bench_profile_library.py` writes the 20-size job's log; run with --workers 1 and
2 back to back to compare one process with the pool at the same load.)
"""

from __future__ import annotations

import resource
import sys
import time

import collc.profile.library as profile_library
import collc.profile.model as model
from collc.cli import main

PHASES: dict[str, tuple[float, float, float]] = {}


def timed(module, name: str) -> None:
    function = getattr(module, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        self0 = resource.getrusage(resource.RUSAGE_SELF).ru_utime
        children0 = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
        try:
            return function(*args, **kwargs)
        finally:
            PHASES[name] = (round(time.perf_counter() - t0, 2),
                            round(resource.getrusage(resource.RUSAGE_SELF).ru_utime - self0, 2),
                            round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - children0, 2))
    setattr(module, name, wrapper)


if __name__ == "__main__":
    timed(model, "_synthesize_all")
    timed(profile_library, "emit_library")     # the driver's, as `write_library` calls it
    start = time.perf_counter()
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
    print(f"total {time.perf_counter() - start:.2f} s; per phase (wall s, CPU s here, CPU s in workers): {PHASES}",
          file=sys.stderr)
