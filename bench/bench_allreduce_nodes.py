"""AllReduce 1 GiB on dgx_h100(nodes=N) composed over the nodes (collc.synthesis.nodes)
against the flat composition, by collc's model: the schedule's time over the lower
bound, the synthesis seconds (with its verification), and the ops.

Each case is synthesized in this process with `synthesize{nodes=on}` (or `off`) at the
MSCCL XML backend's op budget (1,024 ops per rank) and its peer limit, as `collc
compile --backend msccl-xml` asks for it; the bound is collc.analysis.bounds'. The flat
composition is run up to `--flat-up-to` nodes (it takes minutes beyond).

    python3 bench/bench_allreduce_nodes.py [--nodes 2,4,16,32,64] [--flat-up-to 16]
        [--out bench/results/allreduce_nodes]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from collc.analysis.bounds import lower_bounds
from collc.frontend import resolve_topology
from collc.ir.collective import standard
from collc.synthesis.core import synthesize
from collc.synthesis.options import SynthesisOptions

GIB = 1 << 30
OPS_PER_RANK = 1024  # the MSCCL XML backend's op budget
PEER_LIMIT, MAX_PEERS = 130, 32  # an H100's resident threadblocks; the driver's fallback


def case(nodes: int, over_nodes: bool) -> dict:
    topo = resolve_topology(f"dgx_h100(nodes={nodes})")
    coll = standard("allreduce", topo.num_ranks, 1)
    options = SynthesisOptions(progress=False, nodes="on" if over_nodes else "off",
                               max_ops=OPS_PER_RANK * topo.num_ranks, max_peers=MAX_PEERS, peer_limit=PEER_LIMIT)
    t0 = time.perf_counter()
    result = synthesize(topo, coll, GIB, options)
    seconds = time.perf_counter() - t0
    bound = lower_bounds(topo, coll, GIB).best_s
    return {"nodes": nodes, "gpus": topo.num_ranks, "over_nodes": over_nodes,
            "time_over_bound": round(result.estimate_s / bound, 4), "time_us": round(result.estimate_s * 1e6, 1),
            "bound_us": round(bound * 1e6, 1), "seconds": round(seconds, 1), "ops": len(result.schedule.ops),
            "chunks": result.chunks, "method": result.method, "facts": result.facts.get("over_nodes")}


def markdown(rows: list[dict], machine: str) -> str:
    lines = ["# AllReduce over nodes (`bench/bench_allreduce_nodes.py`)", "",
             f"AllReduce 1 GiB on `dgx_h100(nodes=N)` at the MSCCL XML backend's op budget, synthesized in one "
             f"process on {machine}. Time / bound by collc's model (collc.analysis.bounds).", "",
             "| N | GPUs | composition | time / bound | synthesis s | ops | chunks per rank | batches |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        facts = r["facts"] or {}
        lines.append(f"| {r['nodes']} | {r['gpus']} | {'over nodes' if r['over_nodes'] else 'flat'} | "
                     f"{r['time_over_bound']:.4f} | {r['seconds']:.1f} | {r['ops']:,} | {r['chunks']} | "
                     f"{facts.get('batches', '-')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="2,4,16,32,64")
    ap.add_argument("--flat-up-to", type=int, default=16)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "allreduce_nodes"))
    args = ap.parse_args()
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    rows = []
    for nodes in (int(x) for x in args.nodes.split(",") if x):
        for over in ([False, True] if nodes <= args.flat_up_to else [True]):
            rows.append(case(nodes, over))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "facts"}), flush=True)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(rows, machine))
    print(markdown(rows, machine))


if __name__ == "__main__":
    main()
