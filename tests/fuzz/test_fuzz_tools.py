"""Properties of the newer commands, on generated and mutated inputs: `collc pipeline`
on pipeline declarations and schedule CSVs, `collc bubbles` and `collc profile` on
Chrome/Kineto traces and NCCL logs, and the `collc harvest` command line. Every case
exits 0, 1 or 2, without a traceback, within the deadline, and leaves no file behind
when it fails (fuzz_inputs.run_case).

In the suite (profile `ci`) each property runs COLLC_FUZZ_TOOL_EXAMPLES cases (40): a
pipeline case costs more than a `check`, and the long run (bench/fuzz_long.py) is where
the count is."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from collc.harvest import rundir

import tool_inputs as ti
from fuzz_inputs import run_case

_CI = os.environ.get("COLLC_FUZZ_PROFILE", "ci") == "ci"
_FEW = settings(max_examples=int(os.environ.get("COLLC_FUZZ_TOOL_EXAMPLES", "40"))) if _CI else (lambda f: f)


@_FEW
@given(program=ti.pipeline_program(), argv=ti.pipeline_command())
def test_pipeline_declarations(program, argv):
    run_case("pipeline declarations", {"p.coll": program.encode(), "s.csv": b"0F0,0B0\n"}, argv)


@_FEW
@given(data=st.data())
def test_schedule_csvs(data):
    csv = data.draw(ti.schedule_csv())
    rows, microbatches = ti.csv_shape(csv)
    program = data.draw(ti.pipeline_program(schedule='"s.csv"', stages=rows, microbatches=microbatches))
    run_case("schedule CSVs", {"p.coll": program.encode(), "s.csv": csv}, data.draw(ti.pipeline_command()))


@_FEW
@given(trace=ti.kineto_trace(), argv=ti.trace_command())
def test_chrome_kineto_traces(trace, argv):
    run_case("Chrome/Kineto traces", {"k.json": trace}, argv)


@_FEW
@given(log=ti.nccl_log(), argv=ti.nccl_command())
def test_nccl_log_lines(log, argv):
    run_case("NCCL log lines", {"n.log": log}, argv)


class _IdleManager:
    """What `harvest serve` gets instead of a manager: the property is about the checks
    made before one is built, and a real one would serve until stopped."""

    def __init__(self, args):
        self.stopping = mock.Mock()
        # serve checks and locks the runtime directory itself, as with a real manager
        self.dir = Path(args.dir) if args.dir is not None else rundir.default_runtime_dir()

    def serve(self) -> None:
        return None


@_FEW
@given(log=ti.harvest_log(), argv=ti.harvest_command())
def test_harvest_arguments(log, argv):
    with mock.patch("collc.harvest.manager.build_manager", _IdleManager):
        run_case("harvest arguments", {"log.json": log}, argv)
