"""Demand matrices (AllToAllv) compiled by the `collc compile --demand` command, as typed.

Random matrices of three kinds, each N x N in shares of the per-rank size (row i is
what rank i sends; rows of different sums, as a mixture-of-experts layer's are):

- uniform: every entry off the diagonal uniform in [0, 1), the largest row scaled to 1;
- zipf: destination j's popularity 1 / k_j^1.2 (k a random ranking of the ranks), each
  source's row that popularity times a uniform factor in [0.5, 1.5), each row's sum a
  uniform share in [0.5, 1] of the size (skewed: a few GPUs receive most of the data);
- sparse: 10% of the entries off the diagonal non-zero (at least one per matrix),
  uniform in [0, 1), the largest row scaled to 1.

on `dgx1`, `ndv2(chassis=2)` and `dgx_h100(nodes=2)` at each size (default 64 MiB and
1 GiB per rank). Every case runs

    collc compile --topology T --demand M.csv --size S -o out.json --report r.json -q

in a fresh process (the schedule is verified by the compile itself) and records the
schedule's time over the matrix's lower bound, the wall and CPU seconds of the whole
command, the synthesis seconds from the report, and NCCL's direct AllToAllv (every
block straight to its owner, all at once) where the topology has a switch path between
every two GPUs. Goals: <= 1.05 of the bound, <= 10 s a compile.

Then the README's custom collective, `fan_out` in its language tour (`my_cluster.coll`,
read from the README), at each of --custom-sizes (default 1 MiB and 64 MiB):

    collc compile my_cluster.coll --request fan_out -o out/ --report r.json -q

recording the schedule's time over the bound and over the bound with latency (the cut
with latency windows and late entry, collc.analysis.latency_cut). Goals: at 1 MiB <= 1.05
of the bound with latency, at 64 MiB <= 1.05 of the bound.

    python3 bench/bench_demand.py [--sizes 64MiB,1GiB] [--seed 1] [--timeout 600] [--tolerance F]
        [--topologies T,...] [--kinds K,...] [--custom-sizes 1MiB,64MiB]
        [--out bench/results/demand.json] [--md bench/results/demand.md] [--label TEXT]

An empty --topologies or --custom-sizes leaves those cases out.

The JSON file is replaced; the Markdown table goes in as a new section at the top.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

TOPOLOGIES = {"dgx1": 8, "ndv2(chassis=2)": 16, "dgx_h100(nodes=2)": 16}
KINDS = ("uniform", "zipf", "sparse")
ZIPF_EXPONENT = 1.2
SPARSE_DENSITY = 0.10
GOAL_RATIO = 1.05
GOAL_SECONDS = 10.0


def matrix(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Shares of the per-rank size: row i is what rank i sends each rank."""
    off = ~np.eye(n, dtype=bool)
    if kind == "uniform":
        m = rng.random((n, n)) * off
    elif kind == "zipf":
        popularity = 1.0 / (rng.permutation(n) + 1.0) ** ZIPF_EXPONENT
        m = popularity[None, :] * rng.uniform(0.5, 1.5, size=(n, n)) * off
        m = m / m.sum(axis=1, keepdims=True) * rng.uniform(0.5, 1.0, size=(n, 1))
        return m
    elif kind == "sparse":
        mask = (rng.random((n, n)) < SPARSE_DENSITY) & off
        if not mask.any():
            mask[0, 1] = True
        m = rng.random((n, n)) * mask
    else:
        raise ValueError(kind)
    return m / m.sum(axis=1).max()


def run(args: list[str], cwd: Path, timeout: float) -> dict:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = usage.ru_utime + usage.ru_stime
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "collc", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=timeout)
        status: int | None = proc.returncode
        err = proc.stderr[-2000:]
    except subprocess.TimeoutExpired:
        status, err = None, "timed out"
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"status": status, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime - cpu0, "stderr": err}


def parse_size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, scale in units.items():
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * scale)
    return int(text)


def case(topology: str, n: int, kind: str, size: str, rng: np.random.Generator, work: Path,
         timeout: float, tolerance: str | None = None) -> dict:
    name = f"{kind}-{n}-{size}"
    np.savetxt(work / f"{name}.csv", matrix(kind, n, rng), delimiter=",", fmt="%.9g")
    cmd = ["compile", "--topology", topology, "--demand", f"{name}.csv", "--size", size,
           "-o", f"{name}.json", "--report", f"{name}-report.json", "-q"]
    if tolerance:
        cmd[-1:-1] = ["--tolerance", tolerance]
    out = {"topology": topology, "kind": kind, "size": size, "command": "collc " + " ".join(cmd)}
    out.update(run(cmd, work, timeout))
    if out["status"] == 0:
        rep = json.loads((work / f"{name}-report.json").read_text())
        direct = rep["baselines"].get("direct", {})
        out.update({
            "time_us": rep["time_us"], "bound_us": rep["lower_bound_us"], "ratio": rep["ratio_to_lower_bound"],
            "dominant": rep["lower_bounds"]["dominant"], "synth_s": (rep.get("solver") or {}).get("seconds"),
            "method": (rep.get("solver") or {}).get("method"), "entries": rep["demand"]["entries"],
            "extra_share": rep["demand"]["extra_share"], "ops": rep["schedule"]["ops"],
            "direct_us": direct.get("time_us"), "direct_error": direct.get("error"),
        })
        if out["direct_us"]:
            out["speedup"] = out["direct_us"] / out["time_us"]
            out["speedup_allowed"] = out["direct_us"] / out["bound_us"]
    return out


README = Path(__file__).resolve().parents[1] / "README.md"
FAN_OUT_SIZE = "size 1 MiB;"


def readme_program(size: str) -> str:
    """The README's language tour (`my_cluster.coll`), its fan_out compiled at `size`."""
    text = README.read_text(encoding="utf-8")
    program = "// my_cluster.coll\n" + text.split("```\n// my_cluster.coll\n", 1)[1].split("```", 1)[0]
    if FAN_OUT_SIZE not in program:
        raise SystemExit(f"the README's fan_out request no longer reads '{FAN_OUT_SIZE}'")
    amount = size[:-3] + " " + size[-3:] if size[-3:] in ("KiB", "MiB", "GiB") else size
    return program.replace(FAN_OUT_SIZE, f"size {amount};")


def custom_case(size: str, work: Path, timeout: float) -> dict:
    name = f"fan_out-{size}"
    (work / f"{name}.coll").write_text(readme_program(size))
    cmd = ["compile", f"{name}.coll", "--request", "fan_out", "-o", f"{name}-out/", "--report",
           f"{name}-report.json", "-q"]
    out = {"collective": "fan_out", "size": size, "command": "collc " + " ".join(cmd)}
    out.update(run(cmd, work, timeout))
    if out["status"] == 0:
        rep = json.loads((work / f"{name}-report.json").read_text())
        out.update({
            "time_us": rep["time_us"], "bound_us": rep["lower_bound_us"], "ratio": rep["ratio_to_lower_bound"],
            "latency_bound_us": rep["lower_bounds"]["cut_latency_us"],
            "latency_ratio": rep["time_us"] / rep["lower_bounds"]["cut_latency_us"],
            "synth_s": (rep.get("solver") or {}).get("seconds"), "chunks": rep["schedule"]["chunks_per_rank"],
            "ops": rep["schedule"]["ops"],
        })
    return out


def custom_table(rows: list[dict]) -> str:
    lines = ["The README's `fan_out` (`collc compile my_cluster.coll --request fan_out`):", "",
             "| size | time | bound | time / bound | bound with latency | time / bound with latency | chunks/rank | "
             "ops | compile s (wall / CPU) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != 0:
            lines.append(f"| {r['size']} | failed ({r['status']}) | - | - | - | - | - | - | "
                         f"{r['wall_s']:.1f} / {r['cpu_s']:.1f} |")
            continue
        lines.append(f"| {r['size']} | {r['time_us']:,.2f} us | {r['bound_us']:,.2f} us | {r['ratio']:.4f} | "
                     f"{r['latency_bound_us']:,.2f} us | {r['latency_ratio']:.4f} | {r['chunks']} | {r['ops']:,} | "
                     f"{r['wall_s']:.1f} / {r['cpu_s']:.1f} |")
    return "\n".join(lines + [""])


def table(rows: list[dict], label: str) -> str:
    lines = [f"## {label}", "",
             "| topology | matrix | size/rank | blocks | time / bound | slots move | compile s (wall / CPU) | "
             "synthesis s | direct AllToAllv | speedup (bound allows) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] != 0:
            lines.append(f"| `{r['topology']}` | {r['kind']} | {r['size']} | - | failed ({r['status']}) | - | "
                         f"{r['wall_s']:.1f} / {r['cpu_s']:.1f} | - | - | - |")
            continue
        direct = f"{r['direct_us']:,.1f} us" if r.get("direct_us") else "n/a (no switch path between every two GPUs)"
        speed = f"{r['speedup']:.2f}x ({r['speedup_allowed']:.2f}x)" if r.get("speedup") else "-"
        lines.append(f"| `{r['topology']}` | {r['kind']} | {r['size']} | {r['entries']} | {r['ratio']:.4f} | "
                     f"{r['extra_share']:+.2%} | {r['wall_s']:.1f} / {r['cpu_s']:.1f} | {r['synth_s']:.1f} | "
                     f"{direct} | {speed} |")
    ok = [r for r in rows if r["status"] == 0]
    lines += ["", f"{sum(r['ratio'] <= GOAL_RATIO for r in ok)} of {len(rows)} within {GOAL_RATIO} of the bound; "
              f"{sum(r['cpu_s'] <= GOAL_SECONDS for r in ok)} of {len(rows)} within {GOAL_SECONDS:.0f} CPU s, "
              f"{sum(r['wall_s'] <= GOAL_SECONDS for r in ok)} within {GOAL_SECONDS:.0f} wall s.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="64MiB,1GiB")
    ap.add_argument("--topologies", default=",".join(TOPOLOGIES))
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--out", default="bench/results/demand.json")
    ap.add_argument("--md", default="bench/results/demand.md")
    ap.add_argument("--label", default="")
    ap.add_argument("--tolerance", default=None, help="passed to collc compile (default: its own, 0.01)")
    ap.add_argument("--custom-sizes", default="1MiB,64MiB", help="sizes of the README's fan_out")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    rows, custom = [], []
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for topology in filter(None, args.topologies.split(",")):
            for kind in args.kinds.split(","):
                for size in args.sizes.split(","):
                    r = case(topology, TOPOLOGIES[topology], kind, size, rng, Path(tmp), args.timeout, args.tolerance)
                    print(json.dumps({k: v for k, v in r.items() if k != "stderr"}), flush=True)
                    rows.append(r)
        for size in filter(None, args.custom_sizes.split(",")):
            r = custom_case(size, Path(tmp), args.timeout)
            print(json.dumps({k: v for k, v in r.items() if k != "stderr"}), flush=True)
            custom.append(r)
    label = args.label or (f"{time.strftime('%Y-%m-%d')}, shared machine, {os.cpu_count()} cores, load "
                           f"{load:.1f} at the start" + (f", --tolerance {args.tolerance}" if args.tolerance else ""))
    Path(args.out).write_text(json.dumps({"label": label, "seed": args.seed, "rows": rows, "custom": custom},
                                         indent=2) + "\n")
    md = Path(args.md)
    head = "# Demand matrices (AllToAllv): `python3 bench/bench_demand.py`\n\n"
    old = md.read_text().split("\n", 2)[2] if md.exists() else ""
    section = table(rows, label) if rows else f"## {label}\n"
    md.write_text(head + section + "\n" + (custom_table(custom) + "\n" if custom else "") + old)
    return 0


if __name__ == "__main__":
    sys.exit(main())
