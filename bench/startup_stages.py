"""Where the README's main job spends its CPU seconds, stage by stage.

`collc compile --topology dgx1 --collective allgather --size 256MiB -o out.json --report
report.json` runs in a fresh Python process (`--child`) with each stage timed in CPU
seconds of the thread that runs it (time.thread_time) by a wrapper around the function
that does it, replaced where its caller looks it up:

  imports        collc's command line and the modules the job loads (the driver, numpy,
                 HiGHS, the synthesis, the JSON backend), before the command runs; rich
                 (the table) is loaded by the command, as idle work (below)
  front end      `compile_jobs`: the command line's specs through the standard library
  bound          the lower bounds the synthesis aims at
  rate LP        the steady-state rates (HiGHS)
  problems       the synthesis problems (1 and 512 chunks per rank); the refined one is
                 built by the work begun on the MILP's incumbents (below)
  MILP rounding  the MILP that rounds the shares to whole chunks (HiGHS), in its own
                 thread (collc.synthesis.ahead): the stages below run meanwhile
  pacing         `paced_transfers`: the transfers and their order keys (every incumbent
                 the work was begun on counts, also those dropped)
  ops            `copy_fields_steps`: the plan's transfers as ops (lists of their fields)
  list sched.    `sequence_fields_steps`: the ops list-scheduled on the network
  steps          `_assign_steps`: the timeline written back as steps, the final ops
  verification   the schedule verified (on arrays), by the driver
  idle work      what the command's thread did while it would have waited for the
                 MILP (collc.idle: rich's modules, the verifier's array form, the
                 baselines)
  synthesis      the synthesize pass, all of the above from the bound on and the rest,
                 in the command's thread (the MILP's thread not counted)
  report         `make_report`: simulation, bounds, the ring baseline
  JSON fork      writing out.json as this process sees it: the fork of the child that
                 writes it while this process verifies and reports
  table          the terminal table (rich)
  command        the whole `main()`, imports excluded, CPU of the command's thread
  command wall   the same, wall seconds

Each child runs once; `--runs N` fresh children give each stage's least and median.
The interpreter's own start (`python -c pass`) and the whole command as typed (CPU of
the process and of the child that writes the JSON, as bench_startup.py measures it) are
measured beside them. The machine's load is read before each run: on a shared machine
compare CPU seconds and ratios, and say the load.

    python3 bench/startup_stages.py [--runs 5] [--python PATH] [--markdown]

`--python` is the interpreter of the installation to time (its environment's collc).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MAIN_JOB = ["compile", "--topology", "dgx1", "--collective", "allgather", "--size", "256MiB",
            "-o", "out.json", "--report", "report.json"]
# (stage, module whose attribute is replaced, attribute)
WRAPPED = [
    ("front end", "collc.commands.compile", "compile_jobs"),
    ("bound", "collc.synthesis.auto", "_lower_bounds"),
    ("rate LP", "collc.synthesis.auto", "solve_rates"),
    ("problems", "collc.synthesis.auto", "problem_for"),
    ("MILP rounding", "collc.synthesis.steady.pipelining", "solve"),
    ("pacing", "collc.synthesis.steady.pipelining", "paced_transfers"),
    ("ops", "collc.synthesis.candidates", "copy_fields_steps"),
    ("list sched.", "collc.synthesis.candidates", "sequence_fields_steps"),
    ("steps", "collc.synthesis.timing", "_assign_steps"),
    ("idle work", "collc.idle", "run_one"),
    ("verification", "collc.driver", "verify"),
    ("synthesis", "collc.passes.synthesize", "synthesize"),
    ("report", "collc.driver", "make_report"),
    ("JSON fork", "collc.backends.json_backend", "atomic_write"),
    ("table", "collc.commands.compile", "print_report"),
]
IMPORTS = ["collc.cli", "collc.commands.compile", "collc.driver", "collc.passes.synthesize",
           "collc.synthesis.steady.pipelining", "collc.backends.json_backend"]
STAGES = ["imports", "front end", "bound", "rate LP", "problems", "MILP rounding", "pacing", "ops", "list sched.",
          "steps", "idle work", "verification", "synthesis", "report", "JSON fork", "table", "command",
          "command wall"]


def child() -> None:
    """One run of the main job in this process; prints the stages' CPU seconds as JSON."""
    import importlib

    start = time.process_time()
    for name in IMPORTS:
        importlib.import_module(name)
    spent: dict[str, float] = {"imports": time.process_time() - start}
    for stage, module_name, attr in WRAPPED:
        module = importlib.import_module(module_name)
        setattr(module, attr, _timed(stage, getattr(module, attr), spent))
    from collc.cli import main

    before, wall = time.thread_time(), time.perf_counter()
    with open(os.devnull, "w") as quiet:
        stdout, sys.stdout = sys.stdout, quiet
        try:
            code = main(MAIN_JOB)
        finally:
            sys.stdout = stdout
    spent["command"] = time.thread_time() - before
    spent["command wall"] = time.perf_counter() - wall
    if code != 0:
        raise SystemExit(f"the main job failed ({code})")
    print(json.dumps(spent))


def _timed(stage: str, function, spent: dict[str, float]):
    if inspect.isgeneratorfunction(function):  # work in steps: each step timed where it runs
        def timed_steps(*args, **kwargs):
            steps = function(*args, **kwargs)
            sent = None
            while True:
                start = time.thread_time()
                try:
                    value = steps.send(sent)
                except StopIteration as stop:
                    return stop.value
                finally:
                    spent[stage] = spent.get(stage, 0.0) + time.thread_time() - start
                sent = yield value

        return timed_steps

    def timed(*args, **kwargs):
        start = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent[stage] = spent.get(stage, 0.0) + time.thread_time() - start

    return timed


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(python: str, args: list[str], cwd: str) -> tuple[str, float]:
    """(stdout, CPU seconds of the process)."""
    before = children_cpu_s()
    done = subprocess.run([python, *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed: {done.stderr[-2000:]}")
    return done.stdout, children_cpu_s() - before


def measure(python: str, runs: int) -> dict:
    stages: dict[str, list[float]] = {s: [] for s in STAGES}
    interpreter, whole, loads = [], [], []
    collc = str(Path(python).parent / "collc")
    with tempfile.TemporaryDirectory(prefix="collc-stages-") as tmp:
        run(collc, MAIN_JOB, tmp)  # untimed: the parse cache filled, as after a first run
        for _ in range(runs):
            loads.append(os.getloadavg()[0])
            out, _ = run(python, [__file__, "--child"], tmp)
            for stage, seconds in json.loads(out.strip().splitlines()[-1]).items():
                stages[stage].append(seconds)
            interpreter.append(run(python, ["-c", "pass"], tmp)[1])
            whole.append(run(collc, MAIN_JOB, tmp)[1])
    return {"python": python, "runs": runs, "load_1min": loads, "stages": stages,
            "interpreter": interpreter, "whole_command_cpu": whole}


def markdown(result: dict) -> str:
    loads = result["load_1min"]
    lines = [f"`{result['python']}`, {result['runs']} fresh processes, load (1 min) "
             f"{min(loads):.1f}-{max(loads):.1f}; CPU seconds of the thread that runs each stage (the "
             f"command's wall seconds too), least and median:", "",
             "| stage | least | median |", "|---|---|---|"]
    rows = [("interpreter start", result["interpreter"])] + [(s, result["stages"][s]) for s in STAGES]
    rows.append(("whole command as typed", result["whole_command_cpu"]))
    for name, values in rows:
        if values:
            lines.append(f"| {name} | {min(values):.3f} | {statistics.median(values):.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--python", default=sys.executable, help="the interpreter of the installation to time")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if args.child:
        child()
        return
    result = measure(args.python, args.runs)
    sys.stdout.write(markdown(result) if args.markdown else json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
