"""What the synthesis benchmarks share: each case runs in a fresh process (the script
itself with `--one NAME`, printing one JSON row), and the results file keeps the rows of
cases run earlier, so that cases can be run in batches."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

# The search's work as the solver facts name it (same input, same work: see the report).
WORK_KEYS = ("solver_runs", "pricing_rounds", "candidates_timed", "time_limit_fired")


def run_fresh(script: str, name: str) -> tuple[dict, float, float]:
    """`script --one name` in a new process: its JSON row and the 1-minute load average
    before and after."""
    load_before = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, script, "--one", name], capture_output=True, text=True)
    load_after = os.getloadavg()[0]
    if proc.returncode != 0:
        raise SystemExit(f"{name}: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), load_before, load_after


def check_names(ap: argparse.ArgumentParser, names: Sequence[str], known: Sequence[str]) -> None:
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(known)}")


def earlier_rows(out: Path, keep: Callable[[dict], bool] = lambda row: True) -> dict[str, dict]:
    """The rows already in `out`.json, by case name."""
    path = out.with_suffix(".json")
    old = json.loads(path.read_text()) if path.exists() else {}
    return {row["case"]: row for row in old.get("cases", []) if keep(row)}


def save_rows(out: Path, machine: str, done: dict[str, dict], order: Sequence[str],
              markdown: Callable[[list[dict], str], str]) -> None:
    """`out`.json and `out`.md with every row, in the order of `order` (others last)."""
    from collc.io import atomic_write

    rows = sorted(done.values(), key=lambda r: order.index(r["case"]) if r["case"] in order else len(order))
    atomic_write(out.with_suffix(".json"), json.dumps({"machine": machine, "cases": rows}, indent=2) + "\n")
    atomic_write(out.with_suffix(".md"), markdown(rows, machine))
