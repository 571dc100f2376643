"""The `collc` command line: the parser built from every command module, and the run.

User errors print `FILE:LINE:COL: error: MESSAGE` with the source line and a caret and
exit 1; usage errors exit 2 (argparse's convention). No traceback for bad input.

Each command module exposes `add_commands(subparsers)`, registering subcommands whose
`func` returns an exit code and raises CollcError (exit 1) or UsageError (exit 2): the
compiler's own commands live in `collc.commands`, and the tools beside the compiler
(profiling, pipelines, harvesting) keep their argument parsing in their own packages.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import threading
from types import ModuleType
from typing import Sequence

from collc import __version__
from collc.commands.args import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from collc.diagnostics import CollcError, UsageError, format_error

# Each command and the module whose `add_commands` registers it, in the order `collc
# --help` lists them. The modules are named, not imported here: a command line that
# names its command imports that command's module alone (`collc check` need not load
# `compile`'s writers and backends, nor the tools' parsers, ~30 ms of its start-up);
# `--help`, `--version` and a wrong name build the whole parser.
COMMANDS: dict[str, str] = {
    "check": "collc.commands.check",
    "list": "collc.commands.catalog",
    "show": "collc.commands.show",
    "compile": "collc.commands.compile",
    "verify": "collc.commands.verify",
    "passes": "collc.commands.passes",
    "profile": "collc.profile.cli",
    "pipeline": "collc.pipeline.cli",
    "bubbles": "collc.pipeline.cli",
    "harvest": "collc.harvest.cli",
}


def command_modules(names: Sequence[str] | None = None) -> list[ModuleType]:
    """The modules registering the commands `names` (all of them when None), each once,
    in `COMMANDS`' order."""
    wanted = COMMANDS.keys() if names is None else names
    paths = dict.fromkeys(COMMANDS[name] for name in COMMANDS if name in wanted)
    return [importlib.import_module(path) for path in paths]


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; with `argv` whose first word names a command, the
    parser of that command alone (it parses that command line exactly as the whole one
    does: the top level has no option that takes a value, so the first word is the
    command)."""
    p = argparse.ArgumentParser(prog="collc", description="Compile GPU collectives into verified schedules.")
    p.add_argument("--version", action="version", version=f"collc {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    first = list(argv[:1]) if argv else []
    for module in command_modules(first if first and first[0] in COMMANDS else None):
        module.add_commands(sub)
    return p


def _spec_sources() -> dict[str, str]:
    """Command-line specs (`<--topology>` ...) as sources, so their errors get a caret."""
    try:
        from collc import frontend  # only once an error is printed: not for `collc --help`

        return frontend.spec_sources()
    except ImportError:
        return {}


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        sys.stderr.write(f"collc {args.command}: error: {exc}\n")
        return EXIT_USAGE
    except CollcError as err:
        sys.stderr.write(format_error(err, _spec_sources()) + "\n")
        return EXIT_ERROR
    except RecursionError:
        # The parser bounds nesting; this is the last guard for what slips past it.
        sys.stderr.write("collc: error: the input is nested too deeply to process\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("collc: interrupted\n")
        return 130
    except BrokenPipeError:
        return EXIT_OK


def run() -> None:
    """The `collc` command: main(), then exit without tearing the heap down object by
    object. A compile of a few hundred ranks leaves millions of objects (schedules,
    cached collectives and bounds), and the interpreter's own teardown spent 1.1 s of a
    5 s ring(256) compile freeing them. Where a child process or another thread is
    still running, or a profiler or tracer (cProfile, coverage) waits to write its
    results at exit, the normal exit is kept."""
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, OSError):
        pass  # the reader went away (a closed pipe): nothing more can reach it
    if (threading.active_count() == 1 and not _children_alive() and sys.getprofile() is None
            and sys.gettrace() is None):
        os._exit(code)
    sys.exit(code)


def _children_alive() -> bool:
    mp = sys.modules.get("multiprocessing")  # only a command that used it can have children
    return mp is not None and bool(mp.active_children())


if __name__ == "__main__":
    run()
