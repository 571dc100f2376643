"""Jobs bigger than one process: per-rank files read (and library bands synthesized) by
one process, by the local pool of worker processes, and by a 2-worker Dask LocalCluster.

Inputs, made here:
  - 256 per-rank NCCL logs of an HSDP-like job (`make_hsdp_log.py`, from the real 2.27.7
    sample with ranks and communicators rewritten), `--records` each;
  - 64 Kineto traces: copies of HTA's `negative_queue_length_values_check` rank-0 trace
    (1.4 MB gzip, 80 NCCL kernels), each its own file;
  - the 20-size library of `bench_profile_library.py` (`collc profile --topology dgx1
    --library DIR`: 7 bands synthesized).
Each is the whole command as a user types it (`collc profile DIR --json OUT`, with
`--workers 1`, the default, or `--scheduler ADDRESS`) in a fresh process. Each mode's wall time is given as a ratio to one
process; the peak memory (VmHWM) is the reading process's own, workers not counted.

    python3 bench/bench_profile_parallel.py [--runs 2] [--records 10000] [--out bench/results/profile_parallel.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bench_profile_library import write_log as write_library_log  # noqa: E402
from make_hsdp_log import make_log  # noqa: E402

KINETO = ROOT / ".." / "shared" / "data" / "traces" / "hta__negative_queue_length_values_check__rank0.json.gz"

PEAK = "\ndef _peak():\n    for line in open('/proc/self/status'):\n        if line.startswith('VmHWM:'):\n" \
       "            return int(line.split()[1]) / 1024\n"
COMMAND = PEAK + """
import json, sys, time
from collc.cli import main
t = time.perf_counter()
code = main(sys.argv[1:])
print(json.dumps({'seconds': time.perf_counter() - t, 'code': code, 'peak_mib': _peak()}))
"""


def child(code: str, args: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def bench_reads(label: str, path: Path, runs: int, address: str, tmp: Path) -> dict:
    """The whole command (`collc profile DIR --json OUT`) in each mode."""
    row: dict = {"input": label}
    flags = {"one process": ["--workers", "1"], "local pool": [], "2-worker LocalCluster": ["--scheduler", address]}
    for name, extra in flags.items():
        results = []
        for _ in range(runs):
            out = tmp / "reads.json"
            results.append(child(COMMAND, ["profile", str(path), "--json", str(out), "-q", *extra]))
            results[-1]["records"] = sum(s["records"] for s in json.loads(out.read_text())["sources"])
        best = min(results, key=lambda r: r["seconds"])
        row[name] = {"seconds": round(best["seconds"], 2), "peak_mib": round(best["peak_mib"]),
                     "records": best["records"], "load": round(os.getloadavg()[0], 1)}
    base = row["one process"]["seconds"]
    for name in flags:
        row[name]["speedup"] = round(base / row[name]["seconds"], 2)
    print(json.dumps(row), flush=True)
    return row


def bench_library(tmp: Path, runs: int, address: str) -> dict:
    log = tmp / "library.log"
    write_library_log(log)
    row: dict = {"input": "20-size library on dgx1 (collc profile --library)"}
    flags = {"one process": ["--workers", "1"], "local pool": [], "2-worker LocalCluster": ["--scheduler", address]}
    for name, extra in flags.items():
        results = []
        for _ in range(runs):
            lib = tmp / "lib"
            shutil.rmtree(lib, ignore_errors=True)
            results.append(child(COMMAND, ["profile", str(log), "--topology", "dgx1", "--library", str(lib),
                                           "--json", str(tmp / "lib.json"), "-q", *extra]))
            saving = json.loads((tmp / "lib.json").read_text())["library"]["saving_per_iteration_us"]
            results[-1]["saving_us"] = saving
        best = min(results, key=lambda r: r["seconds"])
        row[name] = {"seconds": round(best["seconds"], 2), "peak_mib": round(best["peak_mib"]),
                     "saving_us": round(best["saving_us"], 1), "load": round(os.getloadavg()[0], 1)}
    base = row["one process"]["seconds"]
    for name in flags:
        row[name]["speedup"] = round(base / row[name]["seconds"], 2)
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--records", type=int, default=10_000, help="records per rank log (default 10,000)")
    ap.add_argument("--logs", type=int, default=256)
    ap.add_argument("--traces", type=int, default=64)
    ap.add_argument("--inputs", default="logs,kineto,library",
                    help="which rows to (re)measure; rows of the others are kept from --out")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "profile_parallel.json")
    args = ap.parse_args()
    wanted = set(args.inputs.split(","))
    import distributed   # the [dask] extra: this benchmark compares against it

    results: dict = {"cpus": len(os.sched_getaffinity(0)), "started": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                    time.gmtime()), "rows": []}
    with tempfile.TemporaryDirectory(prefix="collc-par-") as tmpdir, \
            distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
                                     silence_logs=50) as cluster:
        tmp = Path(tmpdir)
        if "logs" in wanted:
            logs = tmp / "logs"
            logs.mkdir()
            for r in range(args.logs):
                (logs / f"rank{r:04d}.log").write_text(make_log(r, args.records))
            results["rows"].append(bench_reads(f"{args.logs} per-rank NCCL logs, {args.records:,} records each",
                                               logs, args.runs, cluster.scheduler_address, tmp))
        if "kineto" in wanted:
            traces = tmp / "kineto"
            traces.mkdir()
            for r in range(args.traces):
                shutil.copy(KINETO, traces / f"rank{r:03d}.json.gz")
            results["rows"].append(bench_reads(f"{args.traces} Kineto traces (copies of an HTA rank trace)",
                                               traces, args.runs, cluster.scheduler_address, tmp))
        if "library" in wanted:
            results["rows"].append(bench_library(tmp, args.runs, cluster.scheduler_address))
    if args.out.exists() and wanted != {"logs", "kineto", "library"}:
        measured = {r["input"] for r in results["rows"]}
        kept = [r for r in json.loads(args.out.read_text())["rows"] if r["input"] not in measured]
        results["rows"] = kept + results["rows"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
