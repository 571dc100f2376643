"""Time to lower a 64-GPU AllGather schedule to MSCCL XML and write it.

Schedules are built with the IR directly: a ring (one chunk per rank) and a pipelined
ring (4 chunks per rank, chunk k starting k steps later), in place and out of place. For
each, the median over the runs of: lowering (all msccl-* passes, schedule verification
included), serializing and writing the file; and, once, `collc verify` of the result.

    python3 bench/bench_xml.py [--runs 5] [--ranks 64] [--out bench/results/xml.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

from collc.backends import BackendOptions
from collc.backends.msccl_xml.backend import BACKEND
from collc.backends.msccl_xml.lowering import lower
from collc.backends.msccl_xml.verify import verify_algo
from collc.backends.msccl_xml.writer import write_algo
from collc.io import atomic_write
from collc.ir import Buffer, Link, Loc, Node, NodeKind, Op, OpKind, Schedule, Topology
from collc.ir.collective import allgather
from collc.passes.base import CompileUnit
from collc.verify import verify


def ring_topology(n: int) -> Topology:
    nodes = tuple(Node(f"g{i}", NodeKind.GPU, i) for i in range(n))
    links = []
    for i in range(n):
        j = (i + 1) % n
        links += [Link(f"g{i}", f"g{j}", 25e9, 1e-6), Link(f"g{j}", f"g{i}", 25e9, 1e-6)]
    return Topology(f"ring{n}", nodes, tuple(links))


def pipelined_ring_allgather(n: int, chunks: int) -> Schedule:
    """Rank r copies its chunks into output slots r*chunks.., sends chunk k to r+1 at step
    k, and every rank forwards what it received one step later."""
    ops: list[Op] = []
    for r in range(n):
        ops.append(Op(len(ops), OpKind.COPY, Loc(r, Buffer.INPUT, 0), Loc(r, Buffer.OUTPUT, r * chunks),
                      count=chunks, step=0))
    for src in range(n):
        for k in range(chunks):
            prev: tuple[int, ...] = ()
            for hop in range(1, n):
                a, b = (src + hop - 1) % n, (src + hop) % n
                frm = Loc(a, Buffer.INPUT, k) if hop == 1 else Loc(a, Buffer.OUTPUT, src * chunks + k)
                ops.append(Op(len(ops), OpKind.COPY, frm, Loc(b, Buffer.OUTPUT, src * chunks + k), deps=prev,
                              step=hop - 1 + k))
                prev = (ops[-1].id,)
    ops.sort(key=lambda op: op.step)
    renumber = {op.id: i for i, op in enumerate(ops)}
    ops = [Op(renumber[op.id], op.kind, op.src, op.dst, op.count, tuple(renumber[d] for d in op.deps), op.step)
           for op in ops]
    return Schedule(f"ring-allgather-{n}x{chunks}", allgather(n, chunks), f"ring{n}", tuple(ops))


def measure(unit: CompileUnit, options: BackendOptions, runs: int, directory: Path) -> dict:
    lower_s, write_s = [], []
    algo = None
    for _ in range(runs):
        t0 = time.perf_counter()
        algo = lower(unit, options).lowered
        t1 = time.perf_counter()
        path = write_algo(algo, directory / "bench.xml")
        t2 = time.perf_counter()
        lower_s.append(t1 - t0)
        write_s.append(t2 - t1)
    t0 = time.perf_counter()
    report = verify_algo(algo)
    verify_s = time.perf_counter() - t0
    steps = [len(tb.steps) for g in algo.gpus for tb in g.tbs]
    return {
        "lower_s": round(statistics.median(lower_s), 4),
        "write_s": round(statistics.median(write_s), 4),
        "total_s": round(statistics.median(a + b for a, b in zip(lower_s, write_s)), 4),
        "verify_s": round(verify_s, 3),
        "verified": report.ok,
        "bytes": path.stat().st_size,
        "channels": algo.nchannels,
        "threadblocks": len(steps),
        "steps": sum(steps),
        "longest_threadblock": max(steps),
        "nops": sum(st.type.value == "nop" for g in algo.gpus for tb in g.tbs for st in tb.steps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "xml.json")
    args = ap.parse_args()
    topo = ring_topology(args.ranks)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for chunks in (1, 4):
            schedule = pipelined_ring_allgather(args.ranks, chunks)
            verify(schedule, topo)
            unit = CompileUnit(topo, schedule.collective, 1 << 30).with_verified(schedule)
            for inplace in (False, True):
                options = BackendOptions(inplace=inplace)
                row = {"schedule": schedule.name, "ops": len(schedule.ops), "inplace": inplace,
                       "pipeline": BACKEND.lowering(options),
                       **measure(unit, options, args.runs, Path(tmp))}
                results.append(row)
                print(f"{schedule.name:24} inplace={inplace!s:5} lower {row['lower_s']:.3f}s write "
                      f"{row['write_s']:.3f}s  {row['threadblocks']} tbs, {row['steps']} steps, "
                      f"{row['channels']} ch, verified={row['verified']}")
    doc = {"benchmark": "msccl-xml lowering and writing", "ranks": args.ranks, "runs": args.runs,
           "python": platform.python_version(), "machine": platform.machine(), "results": results}
    atomic_write(args.out, json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
