"""`collc passes`: the registered passes and their options."""

from __future__ import annotations

import argparse

from collc.commands.args import EXIT_OK
from collc.commands.printing import out


def cmd_passes(args: argparse.Namespace) -> int:
    from collc.passes.base import registered_passes  # loads every pass: not for `collc --help`

    for name, cls in registered_passes().items():
        opts = " ".join(f"{k}:{getattr(t, '__name__', t)}" for k, t in cls.options().items())
        out(f"{name:24} {cls.summary}" + (f"  [{opts}]" if opts else ""))
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("passes", help="list the registered passes and their options")
    c.set_defaults(func=cmd_passes)
