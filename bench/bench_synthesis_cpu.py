"""CPU seconds of the synthesis search, this tree against another, interleaved.

On a shared machine wall seconds follow the load; CPU seconds much less so, and running
the two trees one after the other, case by case and repetition by repetition, exposes
both to the same load. Each run is a fresh process that calls
`collc.synthesis.core.synthesize` with the defaults (what `collc compile` runs, with the
op cap the JSON backend gives) and records the CPU seconds of the search (the part the
report's solver seconds time: choosing, building and stepping the schedule, not the
final verification), its modelled time, and a digest of the ops (equal digests: the
same schedule).

    python3 bench/bench_synthesis_cpu.py --baseline /path/to/other/checkout [--reps 3]
        [--cases dgx1,...] [--out bench/results/synthesis_cpu]

--baseline is the root of another checkout of collc (for example `git worktree add` or
`git archive REV | tar -x`): its `collc` package is put first on the import path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "allgather-256MiB-dgx1": ("dgx1", "allgather", 256 << 20),
    "allgather-1GiB-ndv2x2": ("ndv2(chassis=2)", "allgather", 1 << 30),
    "allgather-1GiB-dgx2x2": ("dgx2(chassis=2)", "allgather", 1 << 30),
    "alltoall-1GiB-ndv2x2": ("ndv2(chassis=2)", "alltoall", 1 << 30),
}

ONE = r"""
import hashlib, json, sys, time
from collc import frontend
from collc.ir.heap import few_collections
import collc.synthesis.core as core
from collc.synthesis.options import SynthesisOptions
spent = []
search = core.synthesize_copies
def timed(*a, **k):
    t = time.process_time()
    try:
        return search(*a, **k)
    finally:
        spent.append(time.process_time() - t)
core.synthesize_copies = timed
topo = frontend.resolve_topology(sys.argv[1], None)
coll = frontend.resolve_collective(sys.argv[2], topo.num_ranks, None)
with few_collections():
    r = core.synthesize(topo, coll, int(sys.argv[3]), SynthesisOptions(progress=False))
digest = hashlib.sha256(repr([(o.id, o.kind.value, tuple(o.src), tuple(o.dst), o.count, o.deps, o.step, o.route)
                              for o in r.schedule.ops]).encode()).hexdigest()
print(json.dumps({"cpu_s": sum(spent), "estimate_s": r.estimate_s, "ops_sha256": digest}))
"""


def run(tree: Path, case: str) -> dict:
    topo, coll, size = CASES[case]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", ONE, topo, coll, str(size)], capture_output=True, text=True,
                          env=env, cwd=tree)
    if proc.returncode != 0:
        raise SystemExit(f"{case} in {tree}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="root of the other checkout")
    ap.add_argument("--label", default="", help="what the baseline is (a commit), for the results")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "synthesis_cpu"))
    args = ap.parse_args(argv)
    base = Path(args.baseline).resolve()
    names = [c for c in args.cases.split(",") if c]
    rows = []
    for name in names:
        pairs = []
        for _ in range(args.reps):
            load = os.getloadavg()[0]
            pairs.append((run(base, name), run(ROOT, name), load))
        old = [p[0]["cpu_s"] for p in pairs]
        new = [p[1]["cpu_s"] for p in pairs]
        same = all(p[0]["ops_sha256"] == p[1]["ops_sha256"] for p in pairs)
        ratio = sorted(n / o for o, n in zip(old, new))[len(pairs) // 2]
        rows.append({"case": name, "baseline_cpu_s": old, "cpu_s": new, "median_ratio": ratio,
                     "estimate_s": pairs[0][1]["estimate_s"], "baseline_estimate_s": pairs[0][0]["estimate_s"],
                     "same_schedule": same, "load": [p[2] for p in pairs]})
        print(f"{name}: {' '.join(f'{o:.2f}' for o in old)} -> {' '.join(f'{n:.2f}' for n in new)} CPU s, "
              f"x{ratio:.2f}, same schedule: {same}", flush=True)
    from collc.io import atomic_write

    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    out = Path(args.out)
    atomic_write(out.with_suffix(".json"), json.dumps({"machine": machine, "baseline": args.label or str(base),
                                                      "cases": rows},
                                                      indent=2) + "\n")
    lines = ["# Synthesis search: CPU seconds against a baseline tree, interleaved", "",
             f"`python3 bench/bench_synthesis_cpu.py --baseline ...` on {machine}; baseline:",
             f"{args.label or base}. Each repetition runs the baseline, then this tree, in fresh processes",
             "(default options). CPU s of the search (what the",
             "report's solver seconds time, without the final verification).", "",
             "| case | baseline CPU s | CPU s | median ratio | same schedule | load (1 min) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {' / '.join(f'{x:.2f}' for x in r['baseline_cpu_s'])} | "
                     f"{' / '.join(f'{x:.2f}' for x in r['cpu_s'])} | {r['median_ratio']:.2f} | "
                     f"{'yes' if r['same_schedule'] else 'NO'} | {' / '.join(f'{x:.1f}' for x in r['load'])} |")
    atomic_write(out.with_suffix(".md"), "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
