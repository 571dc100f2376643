"""`collc verify` of large MSCCL XML files: CPU seconds and peak memory.

Each case is a file `collc compile ... --backend msccl-xml` writes: the stdlib ring
AllReduce 1 GiB on ring(64), ring(256) and ring(1024), and a synthesized AllGather 1 GiB
on dgx_h100(nodes=32) (256 GPUs, 24,576 threadblocks). `--make` writes the missing ones
into `--dir` first (ring(1024) and the dgx file take minutes each). Every verification
runs `collc verify FILE` in a fresh process; CPU seconds (user + system) and the peak
resident memory come from getrusage of that child, so a busy machine changes the wall
time but hardly the figures recorded. `--collc` names the collc executable to time
(default: this checkout's), so two versions can be compared on the same files:

    python3 bench/bench_xml_verify.py --dir /tmp/xv --make
    python3 bench/bench_xml_verify.py --dir /tmp/xv --collc /path/to/old/.venv/bin/collc \
        --label before --md bench/results/xml_verify.md

Goals (issues 10 and 11): ring(256) within 1.5 CPU s, ring(1024) within 30 s, and every
file under 8 GiB.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CASES: dict[str, list[str]] = {
    "ring64": ["--topology", "ring(64)", "--collective", "allreduce", "--algorithm", "ring"],
    "ring256": ["--topology", "ring(256)", "--collective", "allreduce", "--algorithm", "ring"],
    "ring1024": ["--topology", "ring(1024)", "--collective", "allreduce", "--algorithm", "ring"],
    "dgx32": ["--topology", "dgx_h100(nodes=32)", "--collective", "allgather"],
}
GOALS_S = {"ring256": 1.5, "ring1024": 30.0}
GOAL_MIB = 8192


@dataclass
class Run:
    case: str
    label: str
    cpu_s: float
    wall_s: float
    peak_mib: float
    status: int
    summary: str


def default_collc() -> str:
    here = Path(sys.executable).with_name("collc")
    return str(here) if here.exists() else (shutil.which("collc") or "collc")


def measure(collc: str, path: Path, timeout: float) -> tuple[int, float, float, float, str]:
    """`collc verify path` in a child: exit status, CPU s, wall s, peak MiB of that child
    alone (os.wait4), and the first line it printed."""
    start = time.perf_counter()
    proc = subprocess.Popen([collc, "verify", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # reap it here, to read its own usage
    timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    lines = [line for line in out.splitlines() if line.strip()]
    return (proc.returncode, usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024,
            lines[0] if lines else "")


def make(collc: str, directory: Path, cases: list[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for case in cases:
        target = directory / f"{case}.xml"
        if target.exists():
            continue
        print(f"writing {target} ...", flush=True)
        subprocess.run([collc, "compile", *CASES[case], "--size", "1GiB", "--backend", "msccl-xml",
                        "-o", str(target)], check=True, cwd=directory)


def table(runs: list[Run]) -> str:
    lines = ["| file | version | collc verify CPU s | peak MiB | wall s | result |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r.case} | {r.label} | {r.cpu_s:.2f} | {r.peak_mib:.0f} | {r.wall_s:.1f} | {r.summary} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, required=True, help="where the XML files are (or are written)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--collc", default=default_collc(), help="the collc executable to time")
    parser.add_argument("--label", default="this checkout", help="names the version in the table")
    parser.add_argument("--make", action="store_true", help="write the missing files first")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--md", type=Path, help="append the table to this Markdown file")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}")
    if args.make:
        make(args.collc, args.dir, cases)
    runs = []
    for case in cases:
        path = args.dir / f"{case}.xml"
        if not path.exists():
            print(f"{path}: missing (run with --make)", file=sys.stderr)
            continue
        status, cpu, wall, peak, summary = measure(args.collc, path, args.timeout)
        summary = summary.replace(str(path) + ": ", "")
        run = Run(case, args.label, cpu, wall, peak, status, summary)
        runs.append(run)
        goal = GOALS_S.get(case)
        verdict = "" if goal is None else f" (goal {goal} s: {'met' if cpu <= goal else 'missed'})"
        print(f"{case}: {cpu:.2f} CPU s{verdict}, {peak:.0f} MiB, {wall:.1f} s wall: {summary}", flush=True)
    text = table(runs)
    print(text)
    if args.md:
        with open(args.md, "a", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0 if all(r.status == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
