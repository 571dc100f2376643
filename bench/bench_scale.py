"""Hand-written algorithms at scale: the stdlib ring AllReduce on ring(N), compiled,
verified and written as MSCCL XML by the `collc` command, as a user runs it; and
`collc check` of a 2,000-GPU cluster with a compile request; and a synthesized AllGather
1 GiB on dgx_h100(nodes=N) written as MSCCL XML (the lowering of schedules where a GPU
talks to dozens of peers), and the same for a synthesized AllToAll (`--alltoall-nodes`:
a GPU with 70 peers at 64 nodes), AllReduce (`--allreduce-nodes`: composed over the
nodes where the flat composition passes the op budget) and ReduceScatter
(`--reducescatter-nodes`). Synthesized rows record the schedule's time over its lower
bound from the compile's report.

Each case runs `collc` in a fresh process; wall time and the process's peak resident
memory (getrusage of the child) are recorded, then `collc verify` of the written file.
Goals: 256 ranks in under 5 s, 1,024 ranks in under 60 s, memory under 4 GiB; `check`
of 2,000 GPUs in seconds (it took about 110 s); dgx_h100(nodes=128) (1,024 GPUs) to XML
within 600 s and 8 GiB; AllToAll on dgx_h100(nodes=128) to MSCCL XML within 300 s, 6 GiB and
1.05 of the bound, the file accepted by `collc verify --sms 132`.

    python3 bench/bench_scale.py [--ranks 64,128,256,1024] [--dgx-nodes 32,128] [--alltoall-nodes 32,64]
        [--allreduce-nodes 32,128] [--reducescatter-nodes 128]
        [--timeout 900] [--out bench/results/scale.json] [--md bench/results/scale.md] [--label TEXT]

The JSON file is replaced; the table goes into the Markdown file as a new section at
its top (under the title), headed by the label, so that earlier measurements stay.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOALS_S = {256: 5.0, 1024: 60.0}
GOAL_MIB = 4096
DGX_GOALS = {128: (600.0, 8192)}  # nodes: (seconds, MiB)
# AllToAll to MSCCL XML at 1,024 GPUs: (seconds, MiB, time over the lower bound), with
# `collc verify --sms 132` accepting the file (every threadblock resident).
ALLTOALL_GOALS = {128: (300.0, 6144, 1.05)}

BIG_CLUSTER = """
topology big {
    gpu g[2000];
    switch s;
    for i in 0..2000 { link g[i] <-> s bw 100 GB/s; }
}
compile allgather on big() size 1 MiB;
"""


def run(args: list[str], cwd: Path, timeout: float) -> dict:
    """One `collc` process: seconds, CPU seconds, peak MiB, exit status (None: timed out).

    The process is reaped with `os.wait4`, whose resource usage is that process's own
    (with the children it waited for): its peak memory is exact for every case, where
    the largest child so far (RUSAGE_CHILDREN) repeated an earlier, larger case's peak."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "collc", *args], cwd=cwd, stdout=out, stderr=err, text=True)
        timed_out = False
        while True:
            pid, wait_status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout:
                proc.kill()
                _, wait_status, usage = os.wait4(proc.pid, 0)
                timed_out = True
                break
            time.sleep(0.02)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(wait_status)  # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        status: int | None = None if timed_out else proc.returncode
        tail = f"timed out after {timeout:.0f} s" if timed_out else (err.read() or out.read())[-300:]
    # ru_maxrss is in KiB on Linux. CPU seconds (user + system) say more than wall time
    # on a shared machine.
    return {"seconds": round(seconds, 2), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_mib": round(usage.ru_maxrss / 1024), "status": status,
            "tail": tail if status else ""}


def ring_case(ranks: int, cwd: Path, timeout: float) -> dict:
    out = cwd / f"ring{ranks}.xml"
    compile_run = run(["compile", "--topology", f"ring({ranks})", "--collective", "allreduce", "--algorithm",
                       "ring", "--size", "1GiB", "--backend", "msccl-xml", "-o", str(out), "-q"], cwd, timeout)
    row = {"case": f"ring allreduce, ring({ranks})", "ranks": ranks, "compile": compile_run}
    if compile_run["status"] == 0:
        row["verify"] = run(["verify", str(out)], cwd, timeout)
        row["xml_mib"] = round(out.stat().st_size / 2 ** 20, 1)
    goal = GOALS_S.get(ranks)
    if goal is not None:
        row["goal_s"] = goal
        row["met"] = (compile_run["status"] == 0 and compile_run["seconds"] < goal
                      and compile_run["peak_mib"] < GOAL_MIB)
    return row


def dgx_case(nodes: int, cwd: Path, timeout: float, collective: str = "allgather") -> dict:
    """A synthesized `collective` 1 GiB on dgx_h100(nodes) to MSCCL XML, then `collc
    verify` (with the H100's 132 SMs: every GPU's threadblocks resident at once)."""
    out = cwd / f"dgx_h100_{nodes}_{collective}.xml"
    report = cwd / f"dgx_h100_{nodes}_{collective}.report.json"
    compile_run = run(["compile", "--topology", f"dgx_h100(nodes={nodes})", "--collective", collective,
                       "--size", "1GiB", "--backend", "msccl-xml", "-o", str(out), "--report", str(report), "-q"],
                      cwd, timeout)
    row = {"case": f"synthesized {collective}, dgx_h100(nodes={nodes}) ({8 * nodes} GPUs)", "ranks": 8 * nodes,
           "compile": compile_run}
    if compile_run["status"] == 0:
        facts = json.loads(report.read_text())
        row["time_over_bound"] = round(facts["ratio_to_lower_bound"], 4)
        for structure in ("over_nodes", "rails"):
            if structure in facts.get("solver", {}):
                row[structure] = facts["solver"][structure]
        row["verify"] = run(["verify", "--sms", "132", str(out)], cwd, timeout)
        row["xml_mib"] = round(out.stat().st_size / 2 ** 20, 1)
    if nodes in DGX_GOALS and collective == "allgather":
        seconds, mib = DGX_GOALS[nodes]
        row["goal_s"] = seconds
        row["met"] = (compile_run["status"] == 0 and compile_run["seconds"] < seconds
                      and compile_run["peak_mib"] < mib)
    if nodes in ALLTOALL_GOALS and collective == "alltoall":
        seconds, mib, ratio = ALLTOALL_GOALS[nodes]
        row["goal_s"] = seconds
        row["met"] = (compile_run["status"] == 0 and compile_run["seconds"] <= seconds
                      and compile_run["peak_mib"] <= mib and row.get("time_over_bound", ratio + 1) <= ratio
                      and row.get("verify", {}).get("status") == 0)
    return row


def check_case(cwd: Path, timeout: float) -> dict:
    path = cwd / "big.coll"
    path.write_text(BIG_CLUSTER)
    return {"case": "check of 2,000 GPUs with an AllGather request", "ranks": 2000,
            "compile": run(["check", str(path)], cwd, timeout)}


def markdown(rows: list[dict], machine: str) -> str:
    lines = [f"Measured on {machine}; `collc` run as a user runs it (a fresh process each).", "",
             "| case | collc wall s (goal) | collc CPU s | peak MiB | collc verify wall / CPU s | XML MiB | "
             "time / bound | goal |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["compile"]
        took = f"{c['seconds']:.1f}" if c["status"] == 0 else ("timed out" if c["status"] is None else "failed")
        goal = f" ({r['goal_s']:.0f})" if "goal_s" in r else ""
        ver = f"{r['verify']['seconds']:.1f} / {r['verify']['cpu_seconds']:.1f}" if "verify" in r else "-"
        met = "-" if "met" not in r else ("met" if r["met"] else "not met")
        lines.append(f"| {r['case']} | {took}{goal} | {c['cpu_seconds']:.1f} | {c['peak_mib']} | {ver} | "
                     f"{r.get('xml_mib', '-')} | {r.get('time_over_bound', '-')} | {met} |")
    return "\n".join(lines) + "\n"


def write_section(path: Path, heading: str, table: str) -> None:
    """Put `table` under `## heading` at the top of the Markdown file (after its title
    and the paragraphs before its first section), keeping what is there."""
    section = f"## {heading}\n\n{table}\n"
    if not path.exists():
        path.write_text(f"# Scale (`bench/bench_scale.py`)\n\n{section}")
        return
    text = path.read_text()
    at = text.find("\n## ")
    head, rest = (text, "") if at < 0 else (text[:at + 1], text[at + 1:])
    path.write_text(f"{head.rstrip()}\n\n{section}{rest}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="64,128,256")
    ap.add_argument("--dgx-nodes", default="32", help="dgx_h100 node counts for the synthesized XML rows "
                    "('' for none; 128 takes about 10 minutes)")
    ap.add_argument("--alltoall-nodes", default="", help="dgx_h100 node counts for synthesized AllToAll XML rows "
                    "(64 takes about 1.5 minutes, 128 about 5)")
    ap.add_argument("--allreduce-nodes", default="", help="dgx_h100 node counts for synthesized AllReduce XML rows "
                    "(128 takes about 7 minutes)")
    ap.add_argument("--reducescatter-nodes", default="", help="dgx_h100 node counts for synthesized ReduceScatter "
                    "XML rows (128 takes about 5 minutes)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default="bench/results/scale.json")
    ap.add_argument("--md", default="bench/results/scale.md")
    ap.add_argument("--label", default="", help="what is measured (e.g. a commit), written into the results")
    args = ap.parse_args()
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    if args.label:
        machine += f" ({args.label})"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        rows.append(check_case(cwd, args.timeout))
        print(json.dumps(rows[-1]), flush=True)
        for n in (int(x) for x in args.ranks.split(",") if x):
            rows.append(ring_case(n, cwd, args.timeout))
            print(json.dumps(rows[-1]), flush=True)
        for nodes in (int(x) for x in args.dgx_nodes.split(",") if x):
            rows.append(dgx_case(nodes, cwd, args.timeout))
            print(json.dumps(rows[-1]), flush=True)
        for collective, counts in (("alltoall", args.alltoall_nodes), ("allreduce", args.allreduce_nodes),
                                   ("reducescatter", args.reducescatter_nodes)):
            for nodes in (int(x) for x in counts.split(",") if x):
                rows.append(dgx_case(nodes, cwd, args.timeout, collective))
                print(json.dumps(rows[-1]), flush=True)
    Path(args.out).write_text(json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n")
    write_section(Path(args.md), args.label or time.strftime("%Y-%m-%d"), markdown(rows, machine))
    print(markdown(rows, machine))


if __name__ == "__main__":
    main()
