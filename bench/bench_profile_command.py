"""The whole `collc profile` command, as a user types it: `collc profile FILE --json OUT`.

Inputs, made here (`bench/make_hsdp_log.py`: one rank of a 64-rank HSDP-like job, from
the real 2.27.7 sample):
  - one log of 301,422 records (57 MB): the issue's log;
  - logs of 30k, 300k and 3M records: is the command linear (10x records, <= 11x time)?
  - a directory of N per-rank logs of 301,422 records each (`--ranks`, 64 in the issue),
    read by the default pool of processes and, with `--one-process`, by one (`--workers 1`);
  - with `--tuning`, the 301,422-record log with a TUNING line after every call (as
    `NCCL_DEBUG_SUBSYS=COLL,TUNING` writes it);
  - the 1 GiB Kineto trace of `bench_profile_read.py` (`--kineto-copies`, 20 copies of
    the HTA sample): the whole command against the reader's own time (`read_traces` in
    a fresh process).
Each run is a fresh process; wall time, CPU time of the process and its workers
(`RUSAGE_CHILDREN`), the peak resident memory of the process itself (its workers apart), the load average before the run, and MB/s and records/s of wall
time. `--baseline REV` runs the same commands with collc at git revision REV as well,
interleaved, so that both see the same load; `--baseline-site DIR` instead takes the
baseline from an installed collc's site-packages folder (installed, with its bytecode
compiled, as users have it; an exported revision is compiled anew by every run where
PYTHONDONTWRITEBYTECODE is set).

    python3 bench/bench_profile_command.py [--runs 3] [--ranks 64] [--one-process] [--tuning]
        [--kineto-copies 20] [--baseline REV] [--out bench/results/profile_command.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from make_hsdp_log import make_log  # noqa: E402  (a script beside this one)

# The measured process writes its own peak resident set (KiB) as it leaves, the parent's
# peak apart from its workers': collc's command leaves through os._exit (no teardown),
# so that is wrapped too; forked workers, which also leave through it, write nothing.
# The peak is VmHWM, as in bench_profile_read.py: ru_maxrss keeps, across exec, the size
# of the process that started it (this one, after it wrote a 573 MB log or built a 1 GiB
# trace: the 3 M-record and Kineto rows read 1,846 MiB that were this script's own).
PEAK = ("import atexit, os, resource\n"
        "def _hwm_kib():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmHWM:'):\n"
        "            return int(line.split()[1])\n"
        "    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "def _peak(pid=os.getpid()):\n"
        "    if os.getpid() == pid:\n"
        "        open(os.environ['BENCH_PEAK_FILE'], 'w').write(str(_hwm_kib()))\n"
        "def _leave(code, _exit=os._exit):\n"
        "    _peak()\n"
        "    _exit(code)\n"
        "os._exit = _leave\n"
        "atexit.register(_peak)\n")
COMMAND = PEAK + "import sys; from collc.cli import run; sys.argv = ['collc', *sys.argv[1:]]; run()"
READER = PEAK + "import sys; from collc.traces.sources import read_traces; read_traces(sys.argv[1:])"


def export_revision(rev: str, tmp: Path) -> Path:
    """collc at `rev` (with the folders pyproject maps into it), importable from the result."""
    out = tmp / "baseline"
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    for mapped in ("grammar", "backends", "stdlib"):
        if (out / mapped).is_dir() and not (out / "collc" / mapped).exists():
            (out / "collc" / mapped).symlink_to(out / mapped)
    return out


def timed(code: str, args: list[str], source: Path | None, cwd: Path) -> dict:
    """One run in a fresh process, in `cwd`: not in the checkout, whose `collc/` folder
    would shadow the collc being measured (`python -c` puts the current folder first)."""
    env = dict(os.environ)
    peak_file = cwd / "peak-kib.txt"
    peak_file.unlink(missing_ok=True)
    env["BENCH_PEAK_FILE"] = str(peak_file)
    if source is not None:
        env["PYTHONPATH"] = str(source)
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *args], check=True, env=env, stdout=subprocess.DEVNULL, cwd=cwd)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    peak_mib = int(peak_file.read_text()) / 1024 if peak_file.exists() else None
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "load": round(load, 2),
            "parent_peak_mib": None if peak_mib is None else round(peak_mib)}


def best(runs: list[dict]) -> dict:
    return min(runs, key=lambda r: r["wall_s"])


def measure(label: str, path: Path, mbytes: float, records: int, runs: int, versions: dict, tmp: Path,
            options: tuple[str, ...] = ()) -> dict:
    out = {"input": label, "mbytes": round(mbytes, 1), "records": records}
    for key, source in versions.items():
        out[key] = []
    for _ in range(runs):
        for key, source in versions.items():   # interleaved: both see the same load
            out[key].append(timed(COMMAND, ["profile", str(path), "--json", str(tmp / "out.json"), *options],
                                  source, tmp))
    for key in versions:
        b = best(out[key])
        out[f"{key}_best"] = {**b, "MB_per_s": round(mbytes / b["wall_s"], 1),
                              "records_per_s": round(records / b["wall_s"]),
                              "MB_per_cpu_s": round(mbytes / b["cpu_s"], 1)}
    print(json.dumps({k: v for k, v in out.items() if not isinstance(v, list)}), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=64, help="per-rank logs in the directory (0: none)")
    ap.add_argument("--one-process", action="store_true", dest="one_process",
                    help="the per-rank logs read by one process as well (--workers 1)")
    ap.add_argument("--tuning", action="store_true", help="a row for a 301,422-record log with TUNING lines")
    ap.add_argument("--kineto-copies", type=int, default=20, help="copies of the HTA sample (0: no Kineto row)")
    ap.add_argument("--sizes", default="30000,301422,3000000", help="records of the linearity logs")
    ap.add_argument("--baseline", metavar="REV")
    ap.add_argument("--baseline-site", metavar="DIR", type=Path, dest="baseline_site",
                    help="the baseline: the collc installed in this site-packages folder")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "profile_command.json")
    args = ap.parse_args()
    if args.baseline_site is not None and not (args.baseline_site / "collc").is_dir():
        # Else PYTHONPATH names nothing, and the "baseline" runs this collc again.
        ap.error(f"--baseline-site {args.baseline_site}: no collc package in it")
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                 "affinity": len(os.sched_getaffinity(0))}, "rows": []}
    with tempfile.TemporaryDirectory(prefix="collc-bench-") as tmpdir:
        tmp = Path(tmpdir)
        versions: dict[str, Path | None] = {"this": None}
        if args.baseline_site:
            versions[f"baseline_{args.baseline or 'installed'}"] = args.baseline_site
        elif args.baseline:
            versions[f"baseline_{args.baseline}"] = export_revision(args.baseline, tmp)
        for records in (int(s) for s in args.sizes.split(",")):
            path = tmp / f"hsdp-{records}.log"
            path.write_text(make_log(0, records))
            results["rows"].append(measure(f"one log, {records:,} records", path, path.stat().st_size / 1e6,
                                           records, args.runs, versions, tmp))
            path.unlink()
        if args.tuning:
            path = tmp / "hsdp-tuning.log"
            path.write_text(make_log(0, 301_422, tuning=True))
            results["rows"].append(measure("one log, 301,422 records, a TUNING line after each", path,
                                           path.stat().st_size / 1e6, 301_422, args.runs, versions, tmp))
            path.unlink()
        if args.ranks:
            folder = tmp / "ranks"
            folder.mkdir()
            for r in range(args.ranks):
                (folder / f"rank{r:04d}.log").write_text(make_log(r, 301_422))
            size = sum(p.stat().st_size for p in folder.iterdir()) / 1e6
            results["rows"].append(measure(f"{args.ranks} per-rank logs, 301,422 records each", folder, size,
                                           301_422 * args.ranks, 1, versions, tmp))
            if args.one_process:
                results["rows"].append(measure(f"{args.ranks} per-rank logs, one process (--workers 1)", folder,
                                               size, 301_422 * args.ranks, 1, {"this": None}, tmp,
                                               ("--workers", "1")))
            for p in folder.iterdir():
                p.unlink()
        if args.kineto_copies:
            from bench_profile_read import build_kineto
            trace = tmp / "big.json"
            build_kineto(args.kineto_copies, trace)
            size = trace.stat().st_size / 1e6
            reader = [timed(READER, [str(trace)], None, tmp) for _ in range(args.runs)]
            row = measure(f"Kineto trace, {args.kineto_copies} copies of the HTA sample", trace, size,
                          2020 * args.kineto_copies, args.runs, {"this": None}, tmp)
            row["reader_best"] = best(reader)
            row["reader"] = reader
            row["command_over_reader"] = round(row["this_best"]["wall_s"] / row["reader_best"]["wall_s"], 2)
            row["command_over_reader_cpu"] = round(row["this_best"]["cpu_s"] / row["reader_best"]["cpu_s"], 2)
            print(json.dumps({"kineto command/reader": row["command_over_reader"],
                              "cpu": row["command_over_reader_cpu"]}), flush=True)
            results["rows"].append(row)
    lin = [r for r in results["rows"] if r["input"].startswith("one log") and "TUNING" not in r["input"]]
    if len(lin) >= 2:
        results["linearity"] = [{"records": (a["records"], b["records"]),
                                 "time_ratio": round(b["this_best"]["wall_s"] / a["this_best"]["wall_s"], 2),
                                 "cpu_ratio": round(b["this_best"]["cpu_s"] / a["this_best"]["cpu_s"], 2),
                                 "records_ratio": round(b["records"] / a["records"], 2)}
                                for a, b in zip(lin, lin[1:])]
        print(json.dumps(results["linearity"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
