"""`collc profile --topology dgx1 --library DIR` on a job of 8 ranks whose mix has 20
distinct sizes: the time from trace to a verified MSCCL XML library.

The job is written as an NCCL 2.27 debug log (`NCCL_DEBUG=INFO`, `NCCL_DEBUG_SUBSYS=
INIT,COLL`) of 8 ranks in one process, in the format of the real log in
shared/data/nccl-logs: an INIT line per rank, then 3 iterations of a data-parallel step
(12 AllReduce gradient buckets from 4 KiB to 256 MiB, 4 AllGathers and 4
ReduceScatters of sharded parameters), every call logged by all 8 ranks. The log has no
durations, so the mix is weighted by bytes. The command runs as a subprocess, as a user
runs it; the median of the runs is reported.

    python3 bench/bench_profile_library.py [--runs 3] [--out bench/results/profile_library.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANKS = 8
ITERATIONS = 3
ALLREDUCE = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 3 << 20, 8 << 20, 20 << 20, 40 << 20,
             64 << 20, 128 << 20, 256 << 20]
ALLGATHER = [2 << 20, 12 << 20, 48 << 20, 96 << 20]        # nccl-tests size: the output buffer
REDUCESCATTER = [6 << 20, 24 << 20, 80 << 20, 192 << 20]   # nccl-tests size: the input buffer
DATATYPE_FLOAT = 7


def write_log(path: Path) -> int:
    """The job's log; returns the number of distinct (collective, size) pairs."""
    comms = [0x55b6aa64a990 + 0x10a000 * r for r in range(RANKS)]
    lines = []
    for r, comm in enumerate(comms):
        lines.append(f"node0:4711:{4720 + r} [{r}] NCCL INFO ncclCommInitRankConfig comm {comm:#x} rank {r} "
                     f"nranks {RANKS} cudaDev {r} nvmlDev {r} busId {r + 1}000 commId 0x54fe282d32a87d85 - "
                     "Init START")
    calls = ([("AllReduce", s, s // 4) for s in ALLREDUCE] + [("AllGather", s, s // 4 // RANKS) for s in ALLGATHER]
             + [("ReduceScatter", s, s // 4 // RANKS) for s in REDUCESCATTER])
    op_count = 0
    for _ in range(ITERATIONS):
        for name, _, count in calls:
            for r, comm in enumerate(comms):
                lines.append(f"node0:4711:4711 [{r}] NCCL INFO {name}: opCount {op_count:x} sendbuff 0x7200000{r:02x}00 "
                             f"recvbuff 0x9200000{r:02x}00 count {count} datatype {DATATYPE_FLOAT} op 0 root 0 "
                             f"comm {comm:#x} [nranks={RANKS}] stream 0x55b6a98daaf0")
            op_count += 1
    path.write_text("\n".join(lines) + "\n")
    return len(calls)


def run_once(log: Path, work: Path, k: int) -> tuple[float, dict]:
    lib, out = work / f"lib{k}", work / f"mix{k}.json"
    cmd = [sys.executable, "-m", "collc", "profile", str(log), "--topology", "dgx1", "--library", str(lib),
           "--json", str(out), "-q"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0, json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="bench/results/profile_library.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        log = work / "job.log"
        distinct = write_log(log)
        times, data = [], {}
        for k in range(args.runs):
            seconds, data = run_once(log, work, k)
            times.append(seconds)
            print(f"run {k + 1}: {seconds:.1f} s", flush=True)
    model, library = data["model"], data["library"]
    result = {
        "what": "collc profile --topology dgx1 --library DIR: 8-rank job, 20 distinct sizes, NCCL log input",
        "distinct_sizes": distinct,
        "rows": len(data["collectives"]),
        "runs_s": times,
        "median_s": statistics.median(times),
        "synthesis_s": model["synthesis_seconds"],
        "bands": len(model["bands"]),
        "bands_synthesized": sum(1 for b in model["bands"] if b["covered"]),
        "files": len(library["files"]),
        "per_iteration_us": model["per_iteration_us"],
        "saving_per_iteration_us": library["saving_per_iteration_us"],
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
