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
import os
import sys
import threading
from typing import Sequence

from collc import __version__
from collc.commands import catalog, check, passes, show, verify
from collc.commands import compile as compile_command  # not to shadow the builtin compile()
from collc.commands.args import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from collc.diagnostics import CollcError, UsageError, format_error
from collc.harvest import cli as harvest_cli
from collc.pipeline import cli as pipeline_cli
from collc.profile import cli as profile_cli

# In the order `collc --help` lists their commands.
COMMAND_MODULES = (check, catalog, show, compile_command, verify, passes, profile_cli, pipeline_cli, harvest_cli)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="collc", description="Compile GPU collectives into verified schedules.")
    p.add_argument("--version", action="version", version=f"collc {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
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
    parser = build_parser()
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
