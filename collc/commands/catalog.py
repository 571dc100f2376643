"""`collc list`: what the standard library offers (topologies, collectives, algorithms)."""

from __future__ import annotations

import argparse

from collc.commands.args import EXIT_OK
from collc.commands.printing import json_out
from collc.diagnostics import printable


def cmd_list(args: argparse.Namespace) -> int:
    from collc import frontend  # loaded by the command, not by `collc --help`

    catalog = frontend.stdlib_catalog()
    if args.json:
        json_out(catalog)
        return EXIT_OK
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False, emoji=False)
    for section, title in (("topologies", "Topologies"), ("collectives", "Collectives"),
                           ("algorithms", "Algorithms")):
        table = Table(title=title, title_justify="left")
        table.add_column("name")
        table.add_column("parameters" if section != "algorithms" else "implements")
        table.add_column("description")
        for item in catalog.get(section, []):
            if section == "algorithms":
                second = ", ".join(item.get("implements", []))
            else:
                second = ", ".join(f"{p['name']}={p['default']}" if p.get("default") is not None else p["name"]
                                   for p in item.get("params", []))
            table.add_row(*(escape(printable(cell)) for cell in
                            (item["name"], second, first_sentence(item.get("description", "")))))
        console.print(table)
    return EXIT_OK


def first_sentence(text: str) -> str:
    flat = " ".join(text.split())
    end = flat.find(". ")
    return flat if end < 0 else flat[: end + 1]


def add_commands(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("list", help="what the standard library offers")
    c.add_argument("--json", action="store_true", help="as JSON")
    c.set_defaults(func=cmd_list)
