"""Reading traces: collc's streaming readers against HolisticTraceAnalysis, side by side.

Kineto: a large trace is built by replicating the events of a real sample (the HTA
`df_index_resolver` trace, 54 MB, 216k events) N times, each copy's timestamps shifted
past the previous copy and its correlation / External ids offset, so the result is a
consistent trace (N x 2020 NCCL kernels, each still matched to its launch). It is
written uncompressed to a temporary directory and read, each in its own process so that
peak memory is per reader, by:
  - collc: `read_traces` (the NCCL calls, what `collc profile` needs);
  - collc: `iter_events` over every event (all 216k x N parsed into dicts);
  - HTA: `Trace(...).load_traces(use_multiprocessing=False)` in a separate Python
    (HTA is not a collc dependency: pass its interpreter with --hta-python).
Each reports its own time (after imports) and peak RSS; the parent reports wall time.

NCCL logs: a log built by replicating the lines of the real 2.27.7 all_reduce_perf log
(990 COLL, 495 TUNING, INIT and other lines), plain and gzip-compressed, read with
`read_traces` in a fresh process `--log-runs` times each: MB (of decompressed log) per
CPU second of the reading process (what the reader costs, whatever else the machine
runs) and per wall-clock second, with the load average at each run.

    python3 bench/bench_profile_read.py --hta-python /tmp/htavenv/bin/python \
        [--copies 1 4 20] [--log-copies 300] [--out bench/results/profile_read.json]
    python3 bench/bench_profile_read.py --only-log [--baseline REV]   # the NCCL log rows only

`--baseline REV` reads the same logs with the collc package of git revision REV too (its
source exported to a temporary folder and put first on PYTHONPATH), the runs of both
interleaved so that both see the same load.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data"
KINETO_SAMPLE = DATA / "traces" / "hta__df_index_resolver__df_index_resolver.json.gz"
LOG_SAMPLE = DATA / "nccl-logs" / "nccl-tests__Timez-zx_all_reduce_perf_2xA100_nccl-2.27.7.log"

_TS = re.compile(rb'("ts": )(\d+)')
_IDS = re.compile(rb'("(?:correlation|External id)": )(\d+)')
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')

# Run in a child process: prints {"seconds", "peak_rss_mib", ...} as JSON. Peak memory is
# VmHWM: unlike ru_maxrss it starts afresh at exec, not at the parent's size at fork.
PEAK = """
def peak_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
"""
COLLC_CALLS = PEAK + """
import json, sys, time
from collc.profile.sources import read_traces
t, c = time.perf_counter(), time.process_time()
ts = read_traces([sys.argv[1]])
dt, dc = time.perf_counter() - t, time.process_time() - c
print(json.dumps({"seconds": dt, "cpu_seconds": dc, "calls": len(ts.calls),
                  "peak_rss_mib": peak_mib()}))
"""
COLLC_EVENTS = PEAK + """
import json, sys, time
from collc.profile.chrome import iter_events
t, c = time.perf_counter(), time.process_time()
n = sum(1 for _ in iter_events(sys.argv[1]))
dt, dc = time.perf_counter() - t, time.process_time() - c
print(json.dumps({"seconds": dt, "cpu_seconds": dc, "events": n,
                  "peak_rss_mib": peak_mib()}))
"""
HTA_LOAD = PEAK + """
import json, logging, os, sys, time
logging.disable(logging.CRITICAL)
from hta.common.trace import Trace
path = sys.argv[1]
t, c = time.perf_counter(), time.process_time()
trace = Trace(trace_files={0: os.path.basename(path)}, trace_dir=os.path.dirname(path))
trace.load_traces(use_multiprocessing=False, use_memory_profiling=False)
dt, dc = time.perf_counter() - t, time.process_time() - c
print(json.dumps({"seconds": dt, "cpu_seconds": dc, "rows_kept": int(len(trace.traces[0])),
                  "peak_rss_mib": peak_mib()}))
"""


def build_kineto(copies: int, out: Path) -> dict:
    """The sample's events `copies` times over, as one uncompressed Kineto trace."""
    text = gzip.open(KINETO_SAMPLE).read()
    m = _EVENTS_KEY.search(text)
    end = text.rindex(b"]")               # the sample's tail is `]`, traceName, `}`
    header, events, tail = text[:m.end()], text[m.end():end].rstrip(), text[end:]
    ts_values = [int(v) for _, v in _TS.findall(events)]
    span = max(ts_values) - min(ts_values) + 1_000_000
    id_step = 10 ** (len(str(max(int(v) for _, v in _IDS.findall(events)))) + 1)
    with open(out, "wb") as f:
        f.write(header)
        for k in range(copies):
            if k:
                f.write(b",")
                shifted = _TS.sub(lambda mm: mm.group(1) + str(int(mm.group(2)) + k * span).encode(), events)
                shifted = _IDS.sub(lambda mm: mm.group(1) + str(int(mm.group(2)) + k * id_step).encode(), shifted)
                f.write(shifted)
            else:
                f.write(events)
        f.write(b"\n  " + tail)
    return {"copies": copies, "bytes": out.stat().st_size}


def build_log(copies: int, out: Path) -> dict:
    lines = LOG_SAMPLE.read_bytes()
    with open(out, "wb") as f:
        for _ in range(copies):
            f.write(lines)
    return {"copies": copies, "bytes": out.stat().st_size}


def _mem_available_mib() -> float:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


def _child_hwm_mib(pid: int) -> float | None:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run_child(python: str, code: str, path: Path, min_available_mib: float = 0,
              pythonpath: Path | None = None) -> dict:
    """Run `code` on `path` in a fresh interpreter; on a shared machine, stop it (and say
    so) when the machine's available memory falls below `min_available_mib`."""
    env = None
    if pythonpath is not None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(pythonpath)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    t = time.perf_counter()
    proc = subprocess.Popen([python, "-c", code, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            cwd=path.parent)   # not the checkout: `python -c` imports from its folder first
    stopped = None
    while proc.poll() is None:
        try:
            proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            if _mem_available_mib() < min_available_mib:
                hwm = _child_hwm_mib(proc.pid)
                proc.kill()
                proc.wait()
                stopped = {"stopped": f"machine memory available fell below {min_available_mib:.0f} MiB",
                           "seconds_at_stop": time.perf_counter() - t, "peak_rss_mib_at_stop": hwm}
    out, err = proc.communicate()
    wall = time.perf_counter() - t
    if stopped:
        return stopped
    if proc.returncode != 0:
        return {"error": err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}",
                "wall_seconds": wall}
    result = json.loads(out.strip().splitlines()[-1])
    result["wall_seconds"] = wall
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hta-python", help="a Python with HolisticTraceAnalysis installed")
    ap.add_argument("--copies", type=int, nargs="+", default=[1, 4, 20],
                    help="Kineto sizes, as copies of the 54 MB sample (20 = 1.0 GiB)")
    ap.add_argument("--log-copies", type=int, default=300, help="copies of the 389 kB log")
    ap.add_argument("--skip-hta-above", type=int, default=10**9,
                    help="do not run HTA on traces of more copies than this")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "profile_read.json"))
    ap.add_argument("--tmp", default=None, help="where to build the large files")
    ap.add_argument("--min-available-mib", type=float, default=3072,
                    help="stop HTA when the machine has less memory available than this")
    ap.add_argument("--only-hta", action="store_true", help="run HTA only (to redo one size)")
    ap.add_argument("--only-log", action="store_true",
                    help="run the NCCL log rows only, keeping the Kineto rows of --out")
    ap.add_argument("--log-runs", type=int, default=5, help="fresh-process reads of each log")
    ap.add_argument("--baseline", metavar="REV",
                    help="also read the logs with collc as of this git revision")
    ap.add_argument("--render", action="store_true", help="only rewrite the .md from the .json")
    args = ap.parse_args()
    if args.render:
        out = Path(args.out)
        out.with_suffix(".md").write_text(markdown(json.loads(out.read_text())))
        return 0

    results: dict = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                 "loadavg_at_start": os.getloadavg()},
                     "kineto": [], "nccl_log": None}
    if args.only_log:
        before = json.loads(Path(args.out).read_text())
        results["kineto"] = before["kineto"]
        results["machine"]["kineto_loadavg"] = before["machine"].get(
            "kineto_loadavg", [before["machine"]["loadavg_at_start"], before["machine"]["loadavg_at_end"]])
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for copies in [] if args.only_log else args.copies:
            path = Path(tmp) / f"kineto_x{copies}.json"
            info = build_kineto(copies, path)
            row = {"trace": info}
            if not args.only_hta:
                row["collc_calls"] = run_child(sys.executable, COLLC_CALLS, path)
                row["collc_all_events"] = run_child(sys.executable, COLLC_EVENTS, path)
            if args.hta_python and copies <= args.skip_hta_above:
                row["hta_load"] = run_child(args.hta_python, HTA_LOAD, path, args.min_available_mib)
                hta = row["hta_load"]
                if "seconds_at_stop" in hta and "collc_calls" in row:
                    # HTA did not finish: its time so far bounds the ratio from below.
                    row["speedup_vs_hta_at_least"] = {
                        "collc_calls": hta["seconds_at_stop"] / row["collc_calls"]["seconds"],
                        "collc_all_events": hta["seconds_at_stop"] / row["collc_all_events"]["seconds"]}
                if "seconds" in hta and "collc_calls" in row:
                    row["speedup_vs_hta"] = {
                        "collc_calls": hta["seconds"] / row["collc_calls"]["seconds"],
                        "collc_all_events": hta["seconds"] / row["collc_all_events"]["seconds"],
                        "collc_calls_wall": hta["wall_seconds"] / row["collc_calls"]["wall_seconds"]}
            results["kineto"].append(row)
            print(json.dumps(row), flush=True)
            path.unlink()
        if not args.only_hta:
            baseline = export_revision(args.baseline, Path(tmp)) if args.baseline else None
            results["nccl_log"] = log_rows(Path(tmp), args.log_copies, args.log_runs, baseline)
            if baseline is not None:
                results["nccl_log"]["baseline"] = args.baseline
    results["machine"]["loadavg_at_end"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))
    return 0


def export_revision(rev: str, tmp: Path) -> Path:
    """The `collc` package of git revision `rev`, exported under `tmp`; the folder to import it from."""
    out = tmp / "baseline"
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "collc"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def log_rows(tmp: Path, copies: int, runs: int, baseline: Path | None = None) -> dict:
    """The NCCL log read `runs` times, plain and gzip, each in a fresh process (and as
    often with the baseline's collc, alternating with this checkout's)."""
    log = tmp / "nccl.log"
    info = build_log(copies, log)
    packed = tmp / "nccl.log.gz"
    with open(log, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
        while block := src.read(1 << 24):
            dst.write(block)
    info["gzip_bytes"] = packed.stat().st_size
    rows: dict = {"log": info, "runs": {}}
    if baseline is not None:
        rows["baseline_runs"] = {}
    for name, path in (("plain", log), ("gzip", packed)):
        for key, source in (("runs", None), ("baseline_runs", baseline)):
            if key in rows:
                rows[key][name] = []
        for _ in range(runs):
            for key, source in (("runs", None), ("baseline_runs", baseline)):
                if key not in rows:
                    continue
                load = os.getloadavg()[0]
                run = run_child(sys.executable, COLLC_CALLS, path, pythonpath=source)
                run["loadavg"] = load
                if "seconds" in run:
                    run["mb_per_s"] = info["bytes"] / 1e6 / run["seconds"]
                    run["mb_per_cpu_s"] = info["bytes"] / 1e6 / run["cpu_seconds"]
                rows[key][name].append(run)
                print(json.dumps({key: {name: run}}), flush=True)
    return rows


def _log_markdown(log: dict) -> list[str]:
    if log is None:
        return []
    if "runs" not in log:                # results of the one-run format this script wrote first
        log = {"log": log["log"], "runs": {"plain": [log["collc"]]}}
    mb = log["log"]["bytes"] / 1e6
    rows = ["", f"NCCL log: {mb:,.0f} MB ({log['log']['copies']} copies of the 2.27.7 log), "
            "read by `read_traces` in a fresh process per run; best and median of the runs.", "",
            "| collc | input | runs | COLL lines | MB per CPU second (best / median) | wall MB/s (best / median) "
            "| CPU s (best) | peak RSS (MiB) | load average during the runs |",
            "|---|---|---|---|---|---|---|---|---|"]
    versions = [("this checkout", log["runs"])]
    if "baseline_runs" in log:
        versions.append((f"at {log['baseline']}", log["baseline_runs"]))
    for version, by_input in versions:
        rows += _log_version_rows(version, by_input, log["log"])
    if "baseline_runs" in log:
        ratios = []
        for name, runs in log["runs"].items():
            mine = [r["mb_per_cpu_s"] for r in runs if "mb_per_cpu_s" in r]
            theirs = [r["mb_per_cpu_s"] for r in log["baseline_runs"].get(name, []) if "mb_per_cpu_s" in r]
            if mine and theirs:
                ratios.append(f"{max(mine) / max(theirs):.2f}x {name} (median {_median(mine) / _median(theirs):.2f}x)")
        if ratios:
            rows += ["", f"This checkout against {log['baseline']}, MB per CPU second, best run against best run: "
                     + ", ".join(ratios) + "."]
    return rows


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _log_version_rows(version: str, by_input: dict, info: dict) -> list[str]:
    rows = []
    for name, runs in by_input.items():
        ok = [r for r in runs if "cpu_seconds" in r]
        if not ok:
            rows.append(f"| {version} | {name} | {len(runs)} | failed: {runs[0].get('error')} | | | | | |")
            continue
        cpu = sorted(r["mb_per_cpu_s"] for r in ok)
        wall = sorted(r["mb_per_s"] for r in ok)
        loads = [r["loadavg"] for r in ok if "loadavg" in r]
        load = f"{min(loads):.1f} to {max(loads):.1f}" if loads else ""
        label = "plain" if name == "plain" else f"gzip ({info['gzip_bytes'] / 1e6:,.1f} MB on disk)"
        rows.append(f"| {version} | {label} | {len(ok)} | {ok[0]['calls']:,} | {cpu[-1]:.0f} / {cpu[len(cpu) // 2]:.0f} | "
                    f"{wall[-1]:.0f} / {wall[len(wall) // 2]:.0f} | "
                    f"{min(r['cpu_seconds'] for r in ok):.2f} | {max(r['peak_rss_mib'] for r in ok):,.0f} | {load} |")
    return rows


def markdown(results: dict) -> str:
    rows = ["| trace | events | reader | time (s) | CPU (s) | peak RSS (MiB) | HTA time / this | HTA CPU / this |",
            "|---|---|---|---|---|---|---|---|"]
    for row in results["kineto"]:
        size = f"{row['trace']['bytes'] / 2**20:,.0f} MiB"
        hta = row.get("hta_load", {})
        events = row.get("collc_all_events", {}).get("events") or 0
        for name, key in (("collc read_traces (NCCL calls)", "collc_calls"),
                          ("collc iter_events (every event)", "collc_all_events"),
                          ("HTA 0.5 Trace.load_traces", "hta_load")):
            r = row.get(key)
            if not r:
                continue
            if "seconds_at_stop" in r:
                bound = (f"{r['seconds_at_stop'] / row['collc_calls']['seconds']:.1f}x at least"
                         if "collc_calls" in row else "")
                rows.append(f"| {size} | {events:,} | {name} | > {r['seconds_at_stop']:.0f} (stopped: "
                            f"{r['stopped']}) | | > {r['peak_rss_mib_at_stop'] or 0:,.0f} | {bound} |")
                continue
            if "seconds" not in r:
                rows.append(f"| {size} | {events:,} | {name} | failed: {r.get('error')} | | | | |")
                continue
            ratio = hta["seconds"] / r["seconds"] if "seconds" in hta else None
            cpu_ratio = (f"{hta['cpu_seconds'] / r['cpu_seconds']:.1f}x"
                         if "cpu_seconds" in hta and "cpu_seconds" in r else "")
            cpu = f"{r['cpu_seconds']:.2f}" if "cpu_seconds" in r else ""
            rows.append(f"| {size} | {events:,} | {name} | {r['seconds']:.2f} | {cpu} | {r['peak_rss_mib']:,.0f} | "
                        f"{'' if ratio is None else f'{ratio:.1f}x'} | {cpu_ratio} |")
    rows += _log_markdown(results["nccl_log"])
    m = results["machine"]
    kineto_load = m.get("kineto_loadavg")
    when = (f"load average {kineto_load[0][0]:.1f} to {kineto_load[1][0]:.1f} during the Kineto rows "
            f"and {m['loadavg_at_start'][0]:.1f} to {m.get('loadavg_at_end', [float('nan')])[0]:.1f} "
            "during the NCCL log rows" if kineto_load else
            f"load average {m['loadavg_at_start'][0]:.1f} at start and "
            f"{m.get('loadavg_at_end', [float('nan')])[0]:.1f} at end")
    rows += ["", f"Python {m['python']}, {m['cpus']} CPUs, {when} (a shared machine: compare ratios, "
             "not times; CPU seconds are the reading process's own)."]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.exit(main())
