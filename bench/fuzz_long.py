"""The long run of the property tests (tests/fuzz): the same properties as the CI run,
for a set time instead of a set count of cases.

Every case: exit status 0, 1 or 2 and no traceback, within the per-case deadline, and no
file left behind when a command fails. Each round runs every property with the `long`
Hypothesis profile (fresh random seeds each round) until the time is up. A failing case
is recorded (Hypothesis's shrunk example) and the run goes on.

Writes bench/results/fuzz-long.md and bench/results/fuzz-long.json.

Usage: python3 bench/fuzz_long.py [--minutes 25] [--examples 300] [--only-tools]
       (nohup nice -n 15 .venv/bin/python bench/fuzz_long.py --minutes 25 &)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=25.0)
    ap.add_argument("--examples", type=int, default=300, help="cases per property per round")
    ap.add_argument("--only-tools", action="store_true",
                    help="only the newer commands' properties (pipeline, CSVs, traces, NCCL logs, harvest)")
    args = ap.parse_args()
    os.environ["COLLC_FUZZ_PROFILE"] = "long"
    os.environ["COLLC_FUZZ_EXAMPLES"] = str(args.examples)
    sys.path.insert(0, str(ROOT / "tests" / "fuzz"))
    sys.path.insert(1, str(ROOT / "tests"))  # the samples the fuzz inputs share with other tests
    import conftest  # noqa: F401  (registers and loads the profile)
    import fuzz_inputs
    import test_fuzz_coll
    import test_fuzz_tools
    import test_fuzz_xml

    properties = [test_fuzz_coll.test_generated_programs, test_fuzz_coll.test_mutated_programs,
                  test_fuzz_coll.test_mutated_generated_programs, test_fuzz_xml.test_generated_xml]
    if test_fuzz_xml.SEEDS:
        properties.append(test_fuzz_xml.test_mutated_real_xml)
    if args.only_tools:
        properties = []
    properties += [test_fuzz_tools.test_pipeline_declarations, test_fuzz_tools.test_schedule_csvs,
                   test_fuzz_tools.test_chrome_kineto_traces, test_fuzz_tools.test_nccl_log_lines,
                   test_fuzz_tools.test_harvest_arguments]
    start = time.perf_counter()
    deadline = start + args.minutes * 60
    failures: list[dict] = []
    rounds = 0
    while time.perf_counter() < deadline:
        rounds += 1
        for prop in properties:
            if time.perf_counter() >= deadline:
                break
            try:
                prop()
            except BaseException as exc:  # a failing case: keep it and go on
                if isinstance(exc, KeyboardInterrupt):
                    raise
                failures.append({"property": prop.__name__, "error": "".join(
                    traceback.format_exception_only(type(exc), exc))[-4000:]})
        _write(fuzz_inputs.STATS, failures, rounds, time.perf_counter() - start, args)
    _write(fuzz_inputs.STATS, failures, rounds, time.perf_counter() - start, args)
    return 1 if failures else 0


def _write(stats, failures: list[dict], rounds: int, seconds: float, args) -> None:
    kinds = sorted({k for k, _ in stats})
    total = sum(stats.values())
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {"cases": total, "seconds": round(seconds, 1), "rounds": rounds, "examples_per_round": args.examples,
            "by_kind": {k: {str(s): stats[(k, s)] for s in (0, 1, 2)} for k in kinds},
            "failures": failures, "python": platform.python_version(), "machine": platform.machine()}
    (RESULTS / "fuzz-long.json").write_text(json.dumps(data, indent=2) + "\n")
    lines = ["# Long property-test run (bench/fuzz_long.py)", "",
             f"{total:,} cases in {seconds / 60:.1f} minutes ({rounds} rounds of up to {args.examples} cases per "
             f"property), {len(failures)} failing.", "",
             "| input | exit 0 | exit 1 | exit 2 | cases |", "|---|---|---|---|---|"]
    for k in kinds:
        counts = [stats[(k, s)] for s in (0, 1, 2)]
        lines.append(f"| {k} | {counts[0]:,} | {counts[1]:,} | {counts[2]:,} | {sum(counts):,} |")
    for f in failures:
        lines += ["", f"## Failure in {f['property']}", "", "```", f["error"].strip(), "```"]
    (RESULTS / "fuzz-long.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
