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
`read_traces` in a fresh process `--log-runs` times each, by this checkout as a user
gets it (a log this big is read by as many processes as there are usable CPUs) and with
COLLC_NCCL_LOG_PROCESSES=1 (one process), in turn: MB (of decompressed log) per
wall-clock second (the figure the goal of 100 MB/s is about: it needs a calm machine,
since the workers need CPUs that nobody else is using) and per CPU second of the reading
process and its workers together (what the read costs, whatever else the machine runs),
with the load average at each run. The last line printed is the wall MB/s.

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
from collc.traces.sources import read_traces
t, c = time.perf_counter(), time.process_time()
ts = read_traces([sys.argv[1]])
dt, dc = time.perf_counter() - t, time.process_time() - c
print(json.dumps({"seconds": dt, "cpu_seconds": dc, "calls": len(ts.calls),
                  "peak_rss_mib": peak_mib()}))
"""
COLLC_EVENTS = PEAK + """
import json, sys, time
from collc.traces.chrome import iter_events
t, c = time.perf_counter(), time.process_time()
n = sum(1 for _ in iter_events(sys.argv[1]))
dt, dc = time.perf_counter() - t, time.process_time() - c
print(json.dumps({"seconds": dt, "cpu_seconds": dc, "events": n,
                  "peak_rss_mib": peak_mib()}))
"""
# The NCCL log reader may hand pieces of a big log to worker processes: their CPU time
# (RUSAGE_CHILDREN, counted once they have exited) is part of what the read costs.
LOG_CALLS = PEAK + """
import json, os, resource, sys, time
from collc.traces.sources import read_traces
def cpu_wait():   # seconds this process was ready to run but waited for a CPU (Linux)
    try:
        return int(open("/proc/self/schedstat").read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")
w = cpu_wait()
t, c = time.perf_counter(), time.process_time()
ts = read_traces([sys.argv[1]])
dt, dc = time.perf_counter() - t, time.process_time() - c
w = cpu_wait() - w
workers = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"seconds": dt, "cpu_seconds": dc, "calls": len(ts.calls),
                  "worker_cpu_seconds": workers.ru_utime + workers.ru_stime, "cpu_wait_seconds": w,
                  "worker_peak_rss_mib": workers.ru_maxrss / 1024,
                  "processes": os.environ.get("COLLC_NCCL_LOG_PROCESSES", "default"),
                  "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                  else os.cpu_count(), "peak_rss_mib": peak_mib()}))
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
              pythonpath: Path | None = None, env_extra: dict | None = None) -> dict:
    """Run `code` on `path` in a fresh interpreter; on a shared machine, stop it (and say
    so) when the machine's available memory falls below `min_available_mib`."""
    # The reader's process count is this script's to set, not the calling shell's.
    env = {k: v for k, v in os.environ.items() if k != "COLLC_NCCL_LOG_PROCESSES"}
    env.update(env_extra or {})
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(pythonpath)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
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
            results["nccl_log"] = log_rows(Path(tmp), args.log_copies, args.log_runs, baseline,
                                           args.baseline)
            if baseline is not None:
                results["nccl_log"]["baseline"] = args.baseline
    results["machine"]["loadavg_at_end"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(results))
    print(markdown(results))
    print(log_summary(results["nccl_log"]))
    return 0


def export_revision(rev: str, tmp: Path) -> Path:
    """The `collc` package of git revision `rev`, exported under `tmp`; the folder to import it from."""
    out = tmp / "baseline"
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "collc"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


# The NCCL log readers compared, run in turn for each read so that all see the same load:
# (key in the results, label, collc source folder or None for this checkout, environment).
def log_versions(baseline: Path | None, baseline_rev: str | None) -> list[tuple]:
    versions = [("runs", "this checkout", None, {}),
                ("single_runs", "this checkout, one process", None, {"COLLC_NCCL_LOG_PROCESSES": "1"})]
    if baseline is not None:
        versions.append(("baseline_runs", f"at {baseline_rev}", baseline, {}))
    return versions


def log_rows(tmp: Path, copies: int, runs: int, baseline: Path | None = None,
             baseline_rev: str | None = None) -> dict:
    """The NCCL log read `runs` times, plain and gzip, each in a fresh process, by each
    version of `log_versions` in turn."""
    log = tmp / "nccl.log"
    info = build_log(copies, log)
    packed = tmp / "nccl.log.gz"
    with open(log, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
        while block := src.read(1 << 24):
            dst.write(block)
    info["gzip_bytes"] = packed.stat().st_size
    versions = log_versions(baseline, baseline_rev)
    rows: dict = {"log": info, "labels": {key: label for key, label, _, _ in versions}}
    for key, *_ in versions:
        rows[key] = {}
    for name, path in (("plain", log), ("gzip", packed)):
        for key, *_ in versions:
            rows[key][name] = []
        for _ in range(runs):
            for key, _label, source, env in versions:
                load = os.getloadavg()[0]
                run = run_child(sys.executable, LOG_CALLS, path, pythonpath=source, env_extra=env)
                run["loadavg"] = load
                if "seconds" in run:
                    cpu = run["cpu_seconds"] + run.get("worker_cpu_seconds", 0.0)
                    run["mb_per_s"] = info["bytes"] / 1e6 / run["seconds"]
                    run["mb_per_cpu_s"] = info["bytes"] / 1e6 / cpu
                rows[key][name].append(run)
                print(json.dumps({key: {name: run}}), flush=True)
    return rows


def _log_markdown(log: dict) -> list[str]:
    if log is None:
        return []
    if "runs" not in log:                # results of the one-run format this script wrote first
        log = {"log": log["log"], "runs": {"plain": [log["collc"]]}}
    mb = log["log"]["bytes"] / 1e6
    labels = log.get("labels", {"runs": "this checkout", "baseline_runs": f"at {log.get('baseline')}"})
    rows = ["", f"NCCL log: {mb:,.0f} MB ({log['log']['copies']} copies of the 2.27.7 log), "
            "read by `read_traces` in a fresh process per run, the versions in turn; best and "
            "median of the runs. CPU seconds are the reading process's and its workers' together.", "",
            "| collc | input | runs | COLL lines | wall MB/s (best / median) | MB per CPU second (best / median) "
            "| CPU s: all (reader + workers), best | reader's wait for a CPU, s (median) "
            "| peak RSS (MiB): reader / largest worker | load average during the runs |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for key, label in labels.items():
        if key in log:
            rows += _log_version_rows(label, log[key], log["log"])
    wall = {label: {name: _median([r["mb_per_s"] for r in runs if "mb_per_s" in r])
                    for name, runs in log[key].items() if any("mb_per_s" in r for r in runs)}
            for key, label in labels.items() if key in log}
    mine = wall.get(labels["runs"], {})
    for key, label in labels.items():
        if key == "runs" or key not in log:
            continue
        ratios = [f"{mine[name] / theirs:.2f}x {name}" for name, theirs in wall[label].items()
                  if name in mine and theirs]
        if ratios:
            rows += ["", f"Wall-clock speed of this checkout as a user runs it against {label} (median against median, "
                     "runs interleaved): " + ", ".join(ratios) + "."]
    return rows


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


def _log_version_rows(version: str, by_input: dict, info: dict) -> list[str]:
    rows = []
    for name, runs in by_input.items():
        ok = [r for r in runs if "cpu_seconds" in r]
        if not ok:
            rows.append(f"| {version} | {name} | {len(runs)} | failed: {runs[0].get('error')} | | | | | | |")
            continue
        cpu = sorted(r["mb_per_cpu_s"] for r in ok)
        wall = sorted(r["mb_per_s"] for r in ok)
        loads = [r["loadavg"] for r in ok if "loadavg" in r]
        load = f"{min(loads):.1f} to {max(loads):.1f}" if loads else ""
        label = "plain" if name == "plain" else f"gzip ({info['gzip_bytes'] / 1e6:,.1f} MB on disk)"
        all_cpu = min(r["cpu_seconds"] + r.get("worker_cpu_seconds", 0.0) for r in ok)
        worker_rss = max(r.get("worker_peak_rss_mib", 0.0) for r in ok)
        waits = [r["cpu_wait_seconds"] for r in ok if "cpu_wait_seconds" in r]
        wait = f"{_median(waits):.2f}" if waits else ""
        rows.append(f"| {version} | {label} | {len(ok)} | {ok[0]['calls']:,} | {wall[-1]:.0f} / {_median(wall):.0f} | "
                    f"{cpu[-1]:.0f} / {_median(cpu):.0f} | {all_cpu:.2f} | {wait} | "
                    f"{max(r['peak_rss_mib'] for r in ok):,.0f} / {worker_rss:,.0f} | {load} |")
    return rows


def log_summary(log: dict | None) -> str:
    """One line a person (or a script) reads the result from: this checkout's wall MB/s."""
    if not log:
        return ""
    parts = []
    for name, runs in log["runs"].items():
        wall = sorted(r["mb_per_s"] for r in runs if "mb_per_s" in r)
        if wall:
            parts.append(f"{name} {wall[-1]:.0f} best / {_median(wall):.0f} median")
    loads = [r["loadavg"] for runs in log["runs"].values() for r in runs if "loadavg" in r]
    return (f"NCCL log read, wall MB/s of this checkout: {', '.join(parts)} "
            f"(load average {min(loads):.1f} to {max(loads):.1f}; goal: 100)") if parts else ""


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
