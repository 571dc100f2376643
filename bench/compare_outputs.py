"""The same compiles with two installations, outputs compared byte for byte.

Each compile runs as a user types it (`collc compile --topology T --collective C --size S
-o OUT --report report.json`), once with `--collc` and once with `--baseline`, in
fresh processes; the output file must be byte-for-byte the same, and the report too but
for the solver's seconds. The set: every standard-library topology (at its default
parameters) x AllGather, AllReduce, ReduceScatter and AllToAll at 1 MiB and 256 MiB, JSON
backend (`--set wide`); and MSCCL XML and JSON of AllReduce, AllToAll and ReduceScatter on
dgx1 and of AllGather and AllReduce on ndv2(chassis=2) (`--set backends`).

    python3 bench/compare_outputs.py --baseline PATH [--collc PATH] [--set wide|backends|all]
        [--keep DIR] [--out bench/results/compare_outputs.json]

A compile that fails with both installations (a collective a topology cannot run) counts
as the same where both print the same error. Prints one line per compile and a summary;
exits 1 where any differ.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TOPOLOGIES = ["dgx1", "dgx2", "dgx_h100", "hypercube", "mi250", "ndv2", "ring"]
COLLECTIVES = ["allgather", "allreduce", "reducescatter", "alltoall"]
SIZES = ["1MiB", "256MiB"]
BACKEND_CASES = ([("dgx1", c, "256MiB", b) for c in ("allreduce", "alltoall", "reducescatter")
                  for b in ("json", "msccl-xml")]
                 + [("ndv2(chassis=2)", c, "64MiB", b) for c in ("allgather", "allreduce")
                    for b in ("json", "msccl-xml")])
SOLVER_SECONDS = re.compile(rb'("seconds": )[0-9.e+-]+')


def cases(which: str) -> list[tuple[str, str, str, str]]:
    wide = [(t, c, s, "json") for t in TOPOLOGIES for c in COLLECTIVES for s in SIZES]
    return {"wide": wide, "backends": BACKEND_CASES, "all": wide + BACKEND_CASES}[which]


def default_collc() -> str:
    here = Path(sys.executable).parent / "collc"
    return str(here) if here.exists() else (shutil.which("collc") or "collc")


def compile_once(collc: str, case: tuple[str, str, str, str], cwd: Path) -> tuple[int, bytes, bytes, bytes]:
    """(exit status, output, report without the solver's seconds, stderr's last line)."""
    topology, collective, size, backend = case
    out = cwd / ("out.xml" if backend == "msccl-xml" else "out.json")
    for stale in (out, cwd / "report.json"):
        stale.unlink(missing_ok=True)
    done = subprocess.run([collc, "compile", "--topology", topology, "--collective", collective, "--size", size,
                           "--backend", backend, "-o", out.name, "--report", "report.json"],
                          cwd=cwd, capture_output=True)
    output = out.read_bytes() if out.exists() else b""
    report = cwd / "report.json"
    report_text = SOLVER_SECONDS.sub(rb"\1-", report.read_bytes()) if report.exists() else b""
    last = done.stderr.strip().splitlines()[-1:] or [b""]
    return done.returncode, output, report_text, last[0]


def compare(collc: str, baseline: str, case: tuple[str, str, str, str], keep: Path | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="collc-compare-") as tmp:
        runs = {}
        for name, install in (("baseline", baseline), ("collc", collc)):
            where = Path(tmp) / name
            where.mkdir()
            runs[name] = compile_once(install, case, where)
            if keep is not None:
                dest = keep / "_".join(re.sub(r"[^A-Za-z0-9=]+", "-", part) for part in case) / name
                shutil.copytree(where, dest, dirs_exist_ok=True)
    (b_code, b_out, b_rep, b_err), (c_code, c_out, c_rep, c_err) = runs["baseline"], runs["collc"]
    same = b_code == c_code and b_out == c_out and b_rep == c_rep and (b_code == 0 or b_err == c_err)
    return {"case": list(case), "exit": [b_code, c_code], "bytes": len(c_out), "same": same,
            "output_same": b_out == c_out, "report_same": b_rep == c_rep,
            **({"error": c_err.decode(errors="replace")} if c_code else {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--collc", default=default_collc())
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--set", choices=["wide", "backends", "all"], default="all")
    ap.add_argument("--keep", type=Path, help="keep every output under this folder")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = []
    for case in cases(args.set):
        row = compare(args.collc, args.baseline, case, args.keep)
        rows.append(row)
        print(("same     " if row["same"] else "DIFFERENT") + f" exit {row['exit']} {row['bytes']:>10} B  "
              + " ".join(case), flush=True)
    differ = [r for r in rows if not r["same"]]
    print(f"{len(rows) - len(differ)} of {len(rows)} compiles the same; load (1 min) {os.getloadavg()[0]:.1f}")
    if args.out:
        args.out.write_text(json.dumps({"collc": args.collc, "baseline": args.baseline, "rows": rows}, indent=1)
                            + "\n")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
