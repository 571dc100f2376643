"""`collc show`: a .coll file, a compiled schedule (JSON), a topology or a collective."""

from __future__ import annotations

import argparse
import json
from typing import Any

from collc.commands.args import EXIT_OK, int_at_least
from collc.commands.printing import json_out, out
from collc.diagnostics import CollcError, Span, UsageError, printable

# Ops and ranks `collc show` lists before it says how many more there are.
SHOW_OPS = 64
SHOW_RANK_LINES = 32
# A collective's postcondition has ranks x slots entries: beyond this it is no view.
SHOW_MAX_RANKS = 256


def cmd_show(args: argparse.Namespace) -> int:
    from collc import frontend  # loaded by the command, not by `collc --help`

    if args.file and is_json(args.file):
        data = read_schedule_json(args.file)
    elif args.file:
        data = frontend.show_file(args.file)
    elif args.topology:
        topo = frontend.resolve_topology(args.topology)
        data = {"topology": topo.to_json()}
    elif args.collective:
        coll = frontend.resolve_collective(args.collective, args.ranks)
        data = {"collective": coll.to_json()}
    else:
        raise UsageError("show needs FILE, --topology T or --collective C")
    if args.json:
        json_out(data)
    else:
        out(describe(data))
    return EXIT_OK


def is_json(path: str) -> bool:
    """A file collc wrote with `--backend json` (rather than a .coll program)."""
    if path.endswith(".json"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(64).lstrip().startswith(b"{")
    except OSError:
        return False


def read_schedule_json(path: str) -> dict[str, Any]:
    """A compiled schedule (`--backend json`) in the form `describe` shows."""
    from collc.ir.schedule import Schedule
    from collc.ir.topology import Topology

    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except OSError as exc:
        raise CollcError(f"cannot read '{path}': {exc.strerror or exc}") from None
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        line, col = getattr(exc, "lineno", 1), getattr(exc, "colno", 1)
        raise CollcError(f"not valid JSON: {getattr(exc, 'msg', exc)}", Span(path, line, col)) from None
    if not isinstance(doc, dict) or doc.get("format") != "collc-schedule":
        raise CollcError("not a schedule collc wrote (`--backend json` files have \"format\": "
                         "\"collc-schedule\")", Span(path, 1, 1))
    try:
        schedule = Schedule.from_json(doc["schedule"])
        topology = Topology.from_json(doc["topology"])
        return {"topology": topology.to_json(), "collectives": [schedule.collective.to_json()],
                "schedules": [{"for": f"{schedule.collective.name} on {schedule.topology}, "
                               f"{doc.get('size_bytes'):,} bytes", "schedule": doc["schedule"]}]}
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise CollcError(f"this collc schedule is damaged: {type(exc).__name__} {exc}", Span(path, 1, 1)) from None


def describe_schedule(item: dict[str, Any]) -> list[str]:
    from collc.ir.schedule import Op

    sched = item["schedule"]
    ops = [Op.from_json(o) for o in sched["ops"]]
    steps = 1 + max((op.step for op in ops), default=-1)
    lines = [f"schedule {sched['name']} for {item['for']}: {len(ops)} ops in {steps} steps"]
    for op in ops[:SHOW_OPS]:
        count = f" x{op.count}" if op.count != 1 else ""
        deps = f" after {', '.join(map(str, op.deps))}" if op.deps else ""
        lines.append(f"  step {op.step}: op {op.id} {op.kind.value} {op.src} -> {op.dst}{count}{deps}")
    if len(ops) > SHOW_OPS:
        lines.append(f"  ... {len(ops) - SHOW_OPS} more ops (--json shows all)")
    return lines


def describe(data: dict[str, Any]) -> str:
    """A short human-readable view of the JSON form."""
    lines: list[str] = []
    for topo in ([data["topology"]] if "topology" in data else data.get("topologies", [])):
        gpus = [n for n in topo["nodes"] if n["kind"] == "gpu"]
        others = [n for n in topo["nodes"] if n["kind"] != "gpu"]
        lines.append(f"topology {topo['name']}: {len(gpus)} GPUs, {len(others)} switches/NICs, "
                     f"{len(topo['links'])} directed links")
        if topo.get("description"):
            lines.extend(f"  {line}" for line in topo["description"].splitlines())
        for l in topo["links"]:
            mult = f" x{l['multiplicity']}" if l["multiplicity"] != 1 else ""
            lines.append(f"  {l['src']} -> {l['dst']}: {l['bandwidth'] / 1e9:g} GB/s{mult}, "
                         f"{l['latency'] * 1e6:g} us")
    for coll in ([data["collective"]] if "collective" in data else data.get("collectives", [])):
        lines.append(f"collective {coll['name']} ({coll['kind']}): {coll['ranks']} ranks, "
                     f"{coll['chunks']} chunk(s) per rank")
        for r, buf in enumerate(coll["outputs"][:SHOW_RANK_LINES]):
            want = ", ".join("-" if v is None else "+".join(f"c{a}.{b}" for a, b in v) for v in buf[:SHOW_OPS])
            more = f", ... {len(buf) - SHOW_OPS} more" if len(buf) > SHOW_OPS else ""
            lines.append(f"  rank {r} output: [{want}{more}]")
        if len(coll["outputs"]) > SHOW_RANK_LINES:
            lines.append(f"  ... {len(coll['outputs']) - SHOW_RANK_LINES} more ranks (--json shows all)")
    for item in data.get("schedules", []):
        lines.extend(describe_schedule(item))
    for req in data.get("requests", []):
        lines.append(f"compile {req}")
    return printable("\n".join(lines)) if lines else "(nothing to show)"


def add_commands(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("show", help="print the IR of a file, a topology or a collective")
    c.add_argument("file", nargs="?", metavar="FILE", help="a .coll file, or a schedule collc wrote as JSON")
    c.add_argument("--topology", metavar="T", help='e.g. "ndv2(chassis=2)"')
    c.add_argument("--collective", metavar="C", help='e.g. "allgather(chunks=2)"')
    c.add_argument("--ranks", type=int_at_least(1, SHOW_MAX_RANKS), default=8,
                   help=f"ranks for --collective (default 8, at most {SHOW_MAX_RANKS})")
    c.add_argument("--json", action="store_true", help="as JSON")
    c.set_defaults(func=cmd_show)
