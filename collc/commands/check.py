"""`collc check FILE...`: parse and check .coll files."""

from __future__ import annotations

import argparse
import sys

from collc.commands.args import EXIT_ERROR, EXIT_OK
from collc.commands.printing import out
from collc.diagnostics import CollcError, format_error, printable


def cmd_check(args: argparse.Namespace) -> int:
    from collc import frontend  # loaded by the command, not by `collc --help`

    failed = 0
    for path in args.files:
        try:
            summary = frontend.check_file(path)
        except CollcError as err:
            sys.stderr.write(format_error(err) + "\n")
            failed += 1
            continue
        out(printable(f"{path}: ok: {summary}"))
    return EXIT_ERROR if failed else EXIT_OK


def add_commands(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("check", help="parse and check .coll files")
    c.add_argument("files", nargs="+", metavar="FILE", help=".coll files")
    c.set_defaults(func=cmd_check)
