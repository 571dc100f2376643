"""Where a `collc compile` spends its time and memory, stage by stage, in the command's
own process: the stages (front end, each MSCCL lowering pass and the steps inside
`msccl-threadblocks`, the re-verification, the report, writing the file) are wrapped,
and on entry and exit each prints its wall and CPU seconds and the process's resident
and peak memory (VmRSS, VmHWM from /proc/self/status; Linux). Sampling at stage
boundaries costs nothing; tracemalloc snapshots take minutes at a million halves.

    python3 bench/compile_trace.py compile --topology "ring(1024)" --collective allreduce \\
        --algorithm ring --size 1GiB --backend msccl-xml -o /tmp/r.xml -q

The arguments are `collc`'s. Lines go to stderr, nested as the calls are:
`> stage t=<s since start> rss=<MiB> hwm=<MiB>` on entry and
`< stage wall=<s> cpu=<s> rss=<MiB> hwm=<MiB>` on exit; `end` after the command. The
process then leaves without tearing its heap down, as `collc` does.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any, Callable

START = time.perf_counter()
_depth = [0]


def memory_mib() -> tuple[int, int]:
    """(resident, peak) MiB of this process."""
    fields: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                key, value = line.split(":", 1)
                fields[key] = int(value.split()[0]) // 1024
    return fields["VmRSS"], fields["VmHWM"]


def _say(text: str) -> None:
    print("  " * _depth[0] + text, file=sys.stderr, flush=True)


def traced(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        rss, hwm = memory_mib()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        _say(f"> {label} t={wall0 - START:.1f} rss={rss} hwm={hwm}")
        _depth[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _depth[0] -= 1
            rss, hwm = memory_mib()
            _say(f"< {label} wall={time.perf_counter() - wall0:.2f} cpu={time.process_time() - cpu0:.2f} "
                 f"rss={rss} hwm={hwm}")

    return wrapper


def wrap(module: Any, name: str) -> None:
    """Trace `module.name` where the module has it (the stages differ between versions)."""
    fn = getattr(module, name, None)
    if fn is not None:
        setattr(module, name, traced(fn, f"{module.__name__.rsplit('.', 1)[-1]}.{name}"))


def install() -> None:
    import collc.cli  # noqa: F401  (registers the backends and their passes)
    import collc.driver as driver
    import collc.frontend as frontend
    import collc.verify.regrouped as regrouped
    from collc.backends.msccl_xml import backend, channels, halves, threadblocks
    from collc.passes.base import Pass

    for name in ("produce_schedule", "make_report", "simulate", "lower_bounds", "baselines_for"):
        wrap(driver, name)
    wrap(frontend, "instantiate_algorithm")
    wrap(regrouped, "verify_rewritten")
    wrap(backend, "write_algo")
    for name in ("split_schedule", "channel_counts", "PlanCache", "plan_threadblocks", "fuse", "order_steps"):
        wrap(threadblocks, name)
    for name in ("slot_analysis", "_forward_order", "_key_places"):
        wrap(halves, name)
    for name in ("_assign_channels", "_build"):
        wrap(channels, name)
    for cls in Pass.__subclasses__():
        if cls.name.startswith("msccl-"):
            cls.run = traced(cls.run, cls.name)


def main() -> None:
    install()
    import collc.cli

    code = collc.cli.main(sys.argv[1:])
    rss, hwm = memory_mib()
    print(f"end t={time.perf_counter() - START:.1f} rss={rss} hwm={hwm}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    main()
