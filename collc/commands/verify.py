"""`collc verify FILE.xml...`: verify MSCCL XML files symbolically."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from collc.commands.args import EXIT_ERROR, EXIT_OK, int_at_least
from collc.commands.printing import json_out
from collc.diagnostics import printable


def cmd_verify(args: argparse.Namespace) -> int:
    from collc.backends.msccl_xml.verify import verify_files  # the verifier is heavy: not for `collc --help`

    reports = verify_files([Path(p) for p in args.files], max_steps=args.max_steps, strict=args.strict,
                           fifo_capacity=args.fifo_capacity, runtime=args.runtime, sms=args.sms)
    if args.json:
        json_out([{"file": r.source, "ok": r.ok, "summary": r.summary(),
                   "errors": [str(e) for e in r.errors], "warnings": [str(w) for w in r.warnings]}
                  for r in reports])
    else:
        for r in reports:
            (sys.stdout if r.ok else sys.stderr).write(printable(r.render()) + "\n")
    return EXIT_OK if all(r.ok for r in reports) else EXIT_ERROR


def add_commands(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("verify", help="verify MSCCL XML files symbolically")
    c.add_argument("files", nargs="+", metavar="FILE.xml", help="MSCCL XML files")
    c.add_argument("--max-steps", type=int_at_least(1), default=None, metavar="N",
                   help="steps per threadblock limit (default: the runtime's, 64 current, 256 legacy)")
    c.add_argument("--runtime", choices=["current", "legacy"], default="current",
                   help="judge against the current MSCCL executor (default: a file it would skip, e.g. one "
                        "without minBytes/maxBytes/outofplace, fails) or the older runtime (legacy)")
    c.add_argument("--sms", type=int_at_least(1), default=None, metavar="N",
                   help="SMs per GPU: fail a GPU with more threadblocks than can be resident at once (N - 2)")
    c.add_argument("--strict", action="store_true",
                   help="with --runtime legacy: treat what makes the current executor skip a file as errors")
    c.add_argument("--fifo-capacity", type=int_at_least(1), default=None, metavar="N",
                   help="messages a connection buffers (default: unbounded; Simple buffers 2)")
    c.add_argument("--json", action="store_true", help="as JSON")
    c.set_defaults(func=cmd_verify)
