"""The manager's command-line arguments, apart from the manager itself.

`collc --help` builds every command's parser, `collc harvest serve` among them; the
manager module brings multiprocessing, sockets and signals with it, which no command
but `serve` needs, so its arguments live here.
"""

from __future__ import annotations

import argparse

# Trainer bubbles longer than this are ignored (a stall, not a bubble).
DEFAULT_MAX_BUBBLE_S = 30.0


def manager_argument_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--dir", default=None,
                   help="runtime directory (sockets, key, log): yours, not writable by "
                        "others; created with mode 0700 if missing (default: "
                        "$XDG_RUNTIME_DIR/collc-harvest, else collc-harvest-UID in the "
                        "temporary directory)")
    p.add_argument("--device", action="append", required=True, metavar="DEV[=FREE]",
                   help="a device to harvest: cpu:N (a core) or cuda:N, with the memory "
                        "free for side tasks during its bubbles")
    p.add_argument("--report", help="pipeline bubble report: bubbles ahead of time, "
                                    "placed at each step the trainer reports")
    p.add_argument("--stage", type=int, action="append", metavar="STAGE",
                   help="the report's stage for each --device, in order")
    p.add_argument("--margin-ms", type=float, default=2.0,
                   help="stop side tasks this long before a bubble's end")
    p.add_argument("--overrun-limit-ms", type=float, default=5.0,
                   help="freeze a task still in step() this long after a bubble's end")
    p.add_argument("--hang-timeout-s", type=float, default=2.0,
                   help="kill a task whose step() has run this much bubble time")
    p.add_argument("--max-bubble-s", type=float, default=DEFAULT_MAX_BUBBLE_S,
                   help="ignore trainer bubbles longer than this (with --report: the "
                        "report's step)")
    p.add_argument("--no-cgroups", dest="cgroups", action="store_false",
                   help="hold task trees with process groups and supervisors only, "
                        "even where cgroup v2 is writable")
    p.add_argument("--exit-with-parent", action="store_true", help=argparse.SUPPRESS)
    return p
