"""Whole commands as a user types them, each in a fresh process: the README's main job
(`collc compile --topology dgx1 --collective allgather --size 256MiB -o out.json
--report report.json`), `collc check` of a small file (examples/pipeline_dgx1.coll,
21 lines) and `collc --help`. Goals: the main job at most 1.0 s wall, `check` and
`--help` at most 0.3 s, each the median of the runs.

One untimed run of each command comes first: it fills the parsed standard library's
cache (`$XDG_CACHE_HOME/collc`) and, unless PYTHONDONTWRITEBYTECODE is set, the
interpreter's bytecode cache, as a user's first run does. The load average (1 min) is
read before each timed run and recorded with it: a run started with the load above
half the machine's cores is marked busy, and the summary says how many were. On a
machine shared with others, run it when `uptime` is lowest and say how busy it was.

With `--collc PATH` another installation's `collc` is timed (an older checkout, for a
before/after); `--compare-outputs DIR` also checks that the main job's out.json is
byte-for-byte the one in DIR, and report.json too but for the solver's seconds.

With `--baseline PATH` the two installations run in turn, a baseline run then a run of
`--collc`, command by command, so that both see the same load: on a busy machine two
blocks measured minutes apart differ by the load more than by the code. The table then
gives both medians and their ratio (after / before), for wall and CPU seconds, and the
main job's outputs of the two are compared (as with `--compare-outputs`).

    python3 bench/bench_startup.py [--runs 3] [--collc PATH] [--baseline PATH] [--label TEXT]
        [--out bench/results/startup.json] [--md bench/results/startup.md]
        [--keep-outputs DIR] [--compare-outputs DIR]

The JSON file is replaced; the table goes into the Markdown file as a new section at
its top (under the title), headed by the label, so that earlier measurements stay.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SMALL_FILE = REPO / "examples" / "pipeline_dgx1.coll"
MAIN_JOB = ["compile", "--topology", "dgx1", "--collective", "allgather", "--size", "256MiB",
            "-o", "out.json", "--report", "report.json"]
# (name, arguments, goal in seconds)
COMMANDS: list[tuple[str, list[str], float]] = [
    ("main job (compile dgx1 allgather 256MiB)", MAIN_JOB, 1.0),
    ("check examples/pipeline_dgx1.coll", ["check", str(SMALL_FILE)], 0.3),
    ("--help", ["--help"], 0.3),
]
# The report's solver time differs from run to run; every other byte must not.
SOLVER_SECONDS = re.compile(rb'("seconds": )[0-9.e+-]+')


def default_collc() -> str:
    here = Path(sys.executable).parent / "collc"
    return str(here) if here.exists() else (shutil.which("collc") or "collc")


def busy_threshold() -> float:
    return (os.cpu_count() or 1) / 2


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(collc: str, args: list[str], cwd: Path) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of the process, 1-minute load average when it
    started). The CPU seconds move less with the machine's load than the wall time:
    on a shared machine they say more about the code."""
    load = os.getloadavg()[0]
    cpu = children_cpu_s()
    start = time.perf_counter()
    done = subprocess.run([collc, *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"collc {' '.join(args)} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    return wall, children_cpu_s() - cpu, load


def measure(collc: str, runs: int, workdir: Path) -> list[dict]:
    rows = []
    for name, args, goal in COMMANDS:
        run_once(collc, args, workdir)  # untimed: caches filled, as after a user's first run
        samples = [run_once(collc, args, workdir) for _ in range(runs)]
        rows.append(row_of(name, args, goal, samples))
    return rows


def measure_in_turn(collc: str, baseline: str, runs: int, workdir: Path, base_dir: Path
                    ) -> tuple[list[dict], list[dict]]:
    """(rows of `collc`, rows of `baseline`), their runs alternating command by command."""
    rows, base_rows = [], []
    for name, args, goal in COMMANDS:
        run_once(baseline, args, base_dir)  # untimed, each: caches filled
        run_once(collc, args, workdir)
        samples, base_samples = [], []
        for _ in range(runs):
            base_samples.append(run_once(baseline, args, base_dir))
            samples.append(run_once(collc, args, workdir))
        rows.append(row_of(name, args, goal, samples))
        base_rows.append(row_of(name, args, goal, base_samples))
    return rows, base_rows


def row_of(name: str, args: list[str], goal: float, samples: list[tuple[float, float, float]]) -> dict:
    walls = [w for w, _, _ in samples]
    cpus = [c for _, c, _ in samples]
    loads = [l for _, _, l in samples]
    return {
        "command": name, "argv": ["collc", *args], "goal_s": goal,
        "median_s": statistics.median(walls), "runs_s": walls, "load_1min": loads,
        "median_cpu_s": statistics.median(cpus), "runs_cpu_s": cpus,
        "busy_runs": sum(l > busy_threshold() for l in loads),
        "met": statistics.median(walls) <= goal,
    }


def same_outputs(workdir: Path, reference: Path) -> dict[str, bool]:
    out = (workdir / "out.json").read_bytes() == (reference / "out.json").read_bytes()
    mine = SOLVER_SECONDS.sub(rb"\1X", (workdir / "report.json").read_bytes())
    theirs = SOLVER_SECONDS.sub(rb"\1X", (reference / "report.json").read_bytes())
    return {"out.json": out, "report.json (but the solver's seconds)": mine == theirs}


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"## {meta['label']}", "",
             f"{meta['when']}, {meta['machine']}, {meta['cpus']} CPUs, Python {meta['python']}; "
             f"{meta['runs']} timed runs each after one untimed; PYTHONDONTWRITEBYTECODE "
             f"{'set (no bytecode cache)' if meta['no_bytecode'] else 'unset (bytecode cached)'}; "
             f"load average (1 min) {meta['load_min']:.2f}-{meta['load_max']:.2f} at the runs' starts "
             f"({meta['busy_runs']} of {meta['total_runs']} runs started busy, above {busy_threshold():g}).", "",
             "| command | median wall | runs (wall) | median CPU | load at start | goal (wall) | met |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        runs = ", ".join(f"{w:.2f}" for w in r["runs_s"])
        loads = ", ".join(f"{l:.1f}" for l in r["load_1min"])
        lines.append(f"| `{r['command']}` | {r['median_s']:.2f} s | {runs} | {r['median_cpu_s']:.2f} s | {loads} | "
                     f"<= {r['goal_s']:g} s | {'yes' if r['met'] else 'no'} |")
    if meta.get("baseline_rows"):
        lines += ["", f"In turn with the baseline `{meta['baseline']}` (a baseline run, then one of the "
                  "above, each time): medians, and after / before.", "",
                  "| command | wall before | wall after | ratio | CPU before | CPU after | ratio |",
                  "|---|---|---|---|---|---|---|"]
        for r, b in zip(rows, meta["baseline_rows"]):
            lines.append(f"| `{r['command']}` | {b['median_s']:.2f} s | {r['median_s']:.2f} s | "
                         f"{r['median_s'] / b['median_s']:.2f} | {b['median_cpu_s']:.2f} s | "
                         f"{r['median_cpu_s']:.2f} s | {r['median_cpu_s'] / b['median_cpu_s']:.2f} |")
    if meta.get("outputs"):
        lines += ["", "Outputs against the reference: " + ", ".join(
            f"{k} {'identical' if v else 'DIFFERENT'}" for k, v in meta["outputs"].items()) + "."]
    return "\n".join(lines) + "\n"


def write_md(path: Path, section: str) -> None:
    title = "# Start-up: whole commands, fresh processes (bench/bench_startup.py)\n"
    old = path.read_text() if path.exists() else title
    body = old[len(title):].lstrip("\n") if old.startswith(title) else old
    path.write_text(title + "\n" + section + ("\n" + body if body else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--collc", default=default_collc(), help="the collc executable to time")
    ap.add_argument("--baseline", help="another collc executable, timed in turn with --collc")
    ap.add_argument("--label", default="startup")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "startup.json")
    ap.add_argument("--md", type=Path, default=REPO / "bench" / "results" / "startup.md")
    ap.add_argument("--keep-outputs", type=Path, help="copy the main job's out.json and report.json here")
    ap.add_argument("--compare-outputs", type=Path, help="a directory with the reference out.json and report.json")
    args = ap.parse_args()
    base_rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="collc-startup-") as tmp:
        workdir = Path(tmp) / "after"
        workdir.mkdir()
        if args.baseline:
            base_dir = Path(tmp) / "before"
            base_dir.mkdir()
            rows, base_rows = measure_in_turn(args.collc, args.baseline, args.runs, workdir, base_dir)
        else:
            rows = measure(args.collc, args.runs, workdir)
        reference = args.compare_outputs or (base_dir if args.baseline else None)
        outputs = same_outputs(workdir, reference) if reference else None
        if args.keep_outputs:
            args.keep_outputs.mkdir(parents=True, exist_ok=True)
            for name in ("out.json", "report.json"):
                shutil.copy(workdir / name, args.keep_outputs / name)
    loads = [l for r in rows + base_rows for l in r["load_1min"]]
    meta = {"label": args.label, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "runs": args.runs, "collc": args.collc, "no_bytecode": bool(os.environ.get("PYTHONDONTWRITEBYTECODE")),
            "load_min": min(loads), "load_max": max(loads), "busy_runs": sum(r["busy_runs"] for r in rows + base_rows),
            "total_runs": len(loads), "outputs": outputs,
            **({"baseline": args.baseline, "baseline_rows": base_rows} if args.baseline else {})}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    section = markdown(rows, meta)
    write_md(args.md, section)
    sys.stdout.write(section)
    if outputs is not None and not all(outputs.values()):
        raise SystemExit("the outputs differ from the reference")


if __name__ == "__main__":
    main()
