"""`collc harvest ...`: run a manager, submit and stop side tasks, watch and picture it.

    collc harvest serve [--dir D] --device cpu:0=1GiB [--report R --stage S]
    (--dir: default $XDG_RUNTIME_DIR/collc-harvest, else collc-harvest-UID in the
    temporary directory; it must be yours and not writable by others)
    collc harvest submit --dir D collc.harvest.workloads:PageRank --memory 512M
    collc harvest status --dir D           (or --log D/harvest-log.json after shutdown)
    collc harvest stop --dir D 2
    collc harvest evict --dir D 2          (state off the device until it next runs)
    collc harvest shutdown --dir D
    collc harvest trace D/harvest-log.json -o run.json --png run.png
    collc harvest bubbles report.json --stage 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from collc.diagnostics import CollcError, UsageError
from collc.io import check_output_path
from collc.limits import exceeded, int_limit
from collc.units import SIZE, parse_quantity

EXIT_OK = 0


def _usage_error(message: str) -> Exception:
    return UsageError(message)


def _handle(args: argparse.Namespace) -> Any:
    from collc.harvest.client import ManagerHandle
    return ManagerHandle(args.dir)


def _manager_call(fn: Any) -> Any:
    from collc.harvest.client import ManagerError
    try:
        return fn()
    except ManagerError as exc:
        raise CollcError(str(exc)) from None


# --- argument checks (before a manager is built or asked anything) ----------------------

IMPORT_TIMEOUT_S = 30.0


def memory_bytes(text: str, what: str) -> int:
    """A memory size in the language's units as the manager reads it (512M, 512MB, 2GiB,
    1e9; any case: `collc.units`), checked: a positive whole number of bytes within
    collc's size limit (usage error otherwise)."""
    try:
        value = parse_quantity(text.strip(), SIZE, ignore_case=True, filename="<size>")
    except CollcError as err:
        if "too large" in err.message:
            raise _usage_error(f"{what} {text!r} is not a finite size") from None
        raise _usage_error(f"{what} {text!r} must be a size such as 512M or 2GiB") from None
    if value < 1:
        raise _usage_error(f"{what} {text!r} must be at least one byte")
    if value > int_limit("size_bytes"):
        raise _usage_error(f"{what} {text!r} is more memory than any device has" + exceeded("size_bytes"))
    return int(value)


def usable_cores() -> set[int]:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def visible_gpus() -> int:
    """GPUs a side task could use: CUDA_VISIBLE_DEVICES where set, else the NVIDIA
    driver's list (none without the driver)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")])
    gpus = Path("/proc/driver/nvidia/gpus")
    return sum(1 for _ in gpus.iterdir()) if gpus.is_dir() else 0


def check_device(text: str) -> None:
    """`cpu:N` a core this process may run on, `cuda:N` a GPU that exists, and the
    free memory after `=` a real size."""
    name, sep, size = text.partition("=")
    kind, _, index = name.partition(":")
    if kind not in ("cpu", "cuda") or not index.isdigit() or len(index) > 6:
        raise _usage_error(f"--device {text!r} must be cpu:N or cuda:N, optionally =FREE (cpu:0=2GiB)")
    if kind == "cpu" and int(index) not in usable_cores():
        cores = sorted(usable_cores())
        raise _usage_error(f"--device {name}: this machine has no core {index} to run on "
                           f"(cores {cores[0]}..{cores[-1]})")
    if kind == "cuda" and int(index) >= visible_gpus():
        raise _usage_error(f"--device {name}: there is no GPU {index} ({visible_gpus()} visible)")
    if sep:
        memory_bytes(size, f"--device {name}: free memory")


def check_serve_args(args: argparse.Namespace) -> None:
    for text in args.device:
        check_device(text)
    for option in ("margin_ms", "overrun_limit_ms", "hang_timeout_s"):
        value = getattr(args, option, None)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise _usage_error(f"--{option.replace('_', '-')} must be a finite number, at least 0")
    check_output_path(Path(args.dir), directory=True, what="runtime directory")


def check_target(target: str, paths: list[str]) -> None:
    """Import the task's class in a throwaway process (the task's module runs its own
    code on import; it must not run in the command's process) and say why it cannot be
    a task: the module is missing or broken, or the name is not a task class."""
    if ":" not in target:
        raise _usage_error(f"task target {target!r} must be 'module:Class'")
    import subprocess  # here: every collc command imports this module for its parser

    try:
        done = subprocess.run([sys.executable, "-c", _IMPORT_CHECK, target, *paths], capture_output=True,
                              text=True, timeout=IMPORT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise CollcError(f"importing the task {target} took more than {IMPORT_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        reason = lines[-1] if lines else f"the import exited with status {done.returncode}"
        raise CollcError(f"cannot submit {target}: {reason}")


# Run by check_target in a fresh interpreter: argv = target, extra import paths.
_IMPORT_CHECK = """
import importlib, sys
target, paths = sys.argv[1], sys.argv[2:]
sys.path[:0] = paths
module_name, _, attr = target.partition(":")
try:
    obj = importlib.import_module(module_name)
except BaseException as exc:
    print(f"cannot import {module_name}: {type(exc).__name__}: {exc}")
    sys.exit(3)
for part in attr.split("."):
    if not hasattr(obj, part):
        print(f"{module_name} has no {attr}")
        sys.exit(3)
    obj = getattr(obj, part)
from collc.harvest.tasks import ImperativeTask, IterativeTask
if not (isinstance(obj, type) and issubclass(obj, (IterativeTask, ImperativeTask))):
    print(f"{target} is not an IterativeTask or ImperativeTask subclass")
    sys.exit(3)
"""


# --- serve ------------------------------------------------------------------------------

def cmd_serve(args: argparse.Namespace) -> int:
    import os

    from collc.harvest import rundir
    from collc.harvest.manager import build_manager
    from collc.harvest.rundir import RuntimeDirError
    check_serve_args(args)
    try:
        manager = build_manager(args)
    except ValueError as exc:
        raise _usage_error(str(exc)) from None
    try:   # refuse an unsafe or taken directory before saying anything else
        manager.dir = rundir.prepare_dir(manager.dir)
        os.close(rundir.acquire_lock(manager.dir))
    except RuntimeDirError as exc:
        raise CollcError(str(exc)) from None
    sys.stderr.write(f"collc harvest: manager serving {', '.join(args.device)} in "
                     f"{manager.dir} (SIGTERM or `collc harvest shutdown` to stop)\n")
    try:
        manager.serve()
    except KeyboardInterrupt:
        manager.stopping.set()
    except RuntimeDirError as exc:
        raise CollcError(str(exc)) from None
    return EXIT_OK


# --- submit / stop / shutdown -----------------------------------------------------------

def _parse_arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise _usage_error(f"--arg {text!r} must be NAME=VALUE")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def cmd_submit(args: argparse.Namespace) -> int:
    from collc.harvest.tasks import TaskSpec
    memory = memory_bytes(args.memory, "--memory")
    if args.device is not None:
        check_device(args.device)
    try:
        spec = TaskSpec(args.target, dict(_parse_arg(a) for a in args.arg), args.name or "",
                        args.priority, memory, list(args.path), args.device)
    except ValueError as exc:
        raise _usage_error(str(exc)) from None
    check_target(args.target, list(args.path))
    task_id = _manager_call(lambda: _handle(args).submit(spec))
    print(task_id)
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    _manager_call(lambda: _handle(args).stop(args.task))
    return EXIT_OK


def cmd_evict(args: argparse.Namespace) -> int:
    _manager_call(lambda: _handle(args).evict(args.task))
    return EXIT_OK


def cmd_shutdown(args: argparse.Namespace) -> int:
    handle = _handle(args)
    log = _manager_call(lambda: handle.shutdown())
    _print_state(log, title=f"final state ({handle.dir})")
    return EXIT_OK


# --- status -----------------------------------------------------------------------------

def _console() -> Any:
    from rich.console import Console
    # Piped output is read by scripts and people alike: do not squeeze columns to 80.
    return Console(highlight=False, emoji=False,
                   width=None if sys.stdout.isatty() else 160)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def _print_state(state: dict[str, Any], title: str) -> None:
    from rich.table import Table

    console = _console()
    devices = Table(title=f"Devices: {title}", title_justify="left")
    for col in ("device", "bubbles", "bubble time s", "harvested s", "harvested %",
                "task CPU %", "runs", "max overrun ms", "p99 overrun ms"):
        devices.add_column(col, justify="left" if col == "device" else "right")
    for name, d in state["devices"].items():
        devices.add_row(name, str(d["bubbles"]), f"{d['bubble_s']:.2f}",
                        f"{d['harvested_s']:.2f}", f"{100 * d['harvested_share']:.1f}",
                        f"{100 * d.get('cpu_share', 0.0):.1f}", str(d["runs"]), _ms(d["max_overrun_s"]), _ms(d["p99_overrun_s"]))
    console.print(devices)
    tasks = Table(title="Tasks", title_justify="left")
    for col in ("id", "name", "kind", "device", "state", "prio", "mem MiB", "harvested s",
                "runs", "progress", "max overrun ms", "procs", "memory cap by", "tree by"):
        tasks.add_column(col, justify="left" if col in ("name", "kind", "device", "state")
                         else "right")
    for t in state["tasks"]:
        tasks.add_row(str(t["id"]), t["name"], t["kind"] or "-", t["device"], t["state"],
                      str(t["priority"]), f"{t['memory_bytes'] / 2**20:.0f}",
                      f"{t['harvested_s']:.2f}", str(t["runs"]),
                      f"{t['progress']:.3g} {t['progress_unit']}", _ms(t["max_overrun_s"]),
                      str(t.get("processes", "-")), t.get("memory_enforcement") or "-",
                      t.get("tree_enforcement") or "-")
    console.print(tasks)
    console.print(f"margin {_ms(state['margin_s'])} ms before each bubble end; tasks still "
                  f"in step() {_ms(state['overrun_limit_s'])} ms after it are frozen; "
                  f"hang timeout {state['hang_timeout_s']:.1f} s")
    for inc in state["incidents"]:
        console.print(f"[red]{inc['t']:9.3f} s  {inc['what']}:[/red] {inc['message']}")


def cmd_status(args: argparse.Namespace) -> int:
    if args.log:
        from collc.harvest.trace import load_log
        state = load_log(args.log)
        title = str(args.log)
    else:
        handle = _handle(args)          # --dir, else the default runtime directory
        state = _manager_call(lambda: handle.status())
        title = f"{handle.dir}, up {state['uptime_s']:.1f} s"
    if args.json:
        print(json.dumps(state, indent=2))
    else:
        _print_state(state, title)
    return EXIT_OK


# --- trace / bubbles --------------------------------------------------------------------

def cmd_trace(args: argparse.Namespace) -> int:
    from collc.harvest.trace import chrome_trace, load_log, timeline_figure
    from collc.io import atomic_write
    log = load_log(args.log)
    atomic_write(args.output, json.dumps(chrome_trace(log)))
    print(f"wrote {args.output} ({len(log['runs'])} task runs, {len(log['bubbles'])} bubbles)")
    for path in (args.png, args.svg):
        if path:
            import io
            fig = timeline_figure(log)
            buf = io.BytesIO()
            fig.savefig(buf, format=path.rsplit(".", 1)[-1], dpi=110)
            atomic_write(path, buf.getvalue())
            print(f"wrote {path}")
    return EXIT_OK


def cmd_bubbles(args: argparse.Namespace) -> int:
    from rich.table import Table

    from collc.harvest.report import load_report
    report = load_report(args.report)
    stages = [report.stage(args.stage)] if args.stage is not None else list(report.stages)
    table = Table(title=f"{args.report}: {report.kind}, step {report.step_s * 1e3:.3f} ms",
                  title_justify="left")
    for col in ("stage", "start ms", "end ms", "length ms", "cause", "free MiB"):
        table.add_column(col, justify="right")
    for s in stages:
        for b in s.bubbles:
            table.add_row(str(s.stage), f"{b.start_s * 1e3:.3f}", f"{b.end_s * 1e3:.3f}",
                          f"{b.duration_s * 1e3:.3f}", b.cause,
                          "-" if b.free_bytes is None else f"{b.free_bytes / 2**20:.0f}")
    _console().print(table)
    for s in stages:
        share = sum(b.duration_s for b in s.bubbles) / report.step_s
        print(f"stage {s.stage}: {len(s.bubbles)} bubbles, {100 * share:.1f}% of the step "
              "harvestable")
    return EXIT_OK


def add_commands(subparsers: Any) -> None:
    from collc.harvest.manager_args import manager_argument_parser

    p = subparsers.add_parser("harvest", help="run side tasks in a pipeline's bubbles",
                              description="Run side tasks inside a pipeline-parallel "
                                          "trainer's bubbles (see docs/harvest.md).")
    sub = p.add_subparsers(dest="harvest_command", required=True)

    serve = manager_argument_parser(sub.add_parser("serve", help="run a manager "
                                                                 "(foreground)"))
    serve.set_defaults(func=cmd_serve)

    submit = sub.add_parser("submit", help="submit a side task; prints its id")
    submit.add_argument("--dir", help="runtime directory (default: the private one)")
    submit.add_argument("target", help="the task class, module:Class")
    submit.add_argument("--arg", action="append", default=[], metavar="NAME=VALUE",
                        help="keyword argument for the task (VALUE as JSON, else a string)")
    submit.add_argument("--name")
    submit.add_argument("--priority", type=int, default=0)
    submit.add_argument("--memory", default="256M", help="memory cap, e.g. 512M, 2G")
    submit.add_argument("--device", help="run on this device (default: placed)")
    submit.add_argument("--path", action="append", default=[],
                        help="directory to add to the task's import path")
    submit.set_defaults(func=cmd_submit)

    status = sub.add_parser("status", help="tasks, harvested time, overruns")
    status.add_argument("--dir", help="a running manager's runtime directory (default: "
                                      "the private one)")
    status.add_argument("--log", help="a finished run's harvest-log.json instead")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)

    stop = sub.add_parser("stop", help="stop a side task")
    stop.add_argument("--dir", help="runtime directory (default: the private one)")
    stop.add_argument("task", type=int)
    stop.set_defaults(func=cmd_stop)

    evict = sub.add_parser("evict", help="move a paused task's state off its device")
    evict.add_argument("--dir", help="runtime directory (default: the private one)")
    evict.add_argument("task", type=int)
    evict.set_defaults(func=cmd_evict)

    shutdown = sub.add_parser("shutdown", help="stop every task and the manager")
    shutdown.add_argument("--dir", help="runtime directory (default: the private one)")
    shutdown.set_defaults(func=cmd_shutdown)

    trace = sub.add_parser("trace", help="Chrome trace (and PNG/SVG) of a run")
    trace.add_argument("log", help="harvest-log.json, or the runtime directory")
    trace.add_argument("-o", "--output", required=True)
    trace.add_argument("--png")
    trace.add_argument("--svg")
    trace.set_defaults(func=cmd_trace)

    bubbles = sub.add_parser("bubbles", help="the bubbles a pipeline report offers")
    bubbles.add_argument("report")
    bubbles.add_argument("--stage", type=int)
    bubbles.set_defaults(func=cmd_bubbles)
