"""The direct AllReduce (collc.synthesis.direct) on dgx2(chassis=2), 1 GiB, by piece
layout: the schedule's time over the lower bound under collc's model, and the XML nodes
its busiest rank needs at the least (`msccl-coalesce`'s `node_estimate`: every receive
that a send could forward counted as fused; no `<tb>`s), against the MSCCL executor's
4,096.

Two kinds of layout:

- equal pieces (`--pieces`): every GPU's chunk cut into K pieces, as synthesis builds it;
- unequal pieces (`--sizes`): every GPU's chunk cut into F fine slots and moved in G
  groups of contiguous slots, small groups at the pipeline's ends and large ones in the
  middle (MSCCL steps with cnt > 1 in the middle). Written as `1x4,2x28,1x4`: four
  groups of one slot, 28 of two, four of one (G = 36, F = 64). The G-piece direct
  AllReduce is built as synthesis builds it, each of its ops then moves its group's
  slots (one transfer of `count` slots under the alpha-beta model), and the ops are
  list-scheduled in the same order (their order keys). The result is checked by the
  symbolic verifier.

The question it answers: whether a pipeline whose ends move small pieces reaches the
time of many pieces at the XML node count of few (it does not: see
bench/results/scale.md, "pieces of unequal size").

    python3 bench/bench_direct_pieces.py [--pieces 16,24,28,32,48] [--sizes 1x4,2x28,1x4 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace

from collc.analysis.bounds import lower_bounds
from collc.backends.msccl_xml.coalesce import node_estimate
from collc.frontend import resolve_topology
from collc.ir.collective import CollectiveKind, standard
from collc.ir.schedule import Buffer, Loc, Op
from collc.synthesis import direct
from collc.synthesis.candidates import Candidate, to_result
from collc.synthesis.network import Network, reversed_topology
from collc.synthesis.options import SynthesisOptions
from collc.synthesis.progress import Progress
from collc.synthesis.solver import Deadline
from collc.synthesis.timing import sequence
from collc.verify import verify

GIB = 1 << 30
TOPOLOGY = "dgx2(chassis=2)"


def parse_sizes(text: str) -> list[int]:
    """`1x4,2x28` -> [1, 1, 1, 1, 2, ...]: group sizes in fine slots."""
    out: list[int] = []
    for part in text.split(","):
        size, _, times = part.partition("x")
        out += [int(size)] * int(times or 1)
    return out


def grouped(built: direct.DirectOps, sizes: list[int], network: Network, size_bytes: int) -> Candidate:
    """The direct AllReduce of `built` (len(sizes) equal pieces per GPU's chunk) with
    piece i of every chunk moved as sizes[i] contiguous fine slots (one op of that
    count), list-scheduled in the same order (the ops' order keys)."""
    groups, fine = len(sizes), sum(sizes)
    start = [sum(sizes[:i]) for i in range(groups)]

    def moved(loc: Loc) -> Loc:
        if loc.buffer is Buffer.SCRATCH:
            raise ValueError("the direct AllReduce keeps no scratch slots")
        owner, piece = divmod(loc.index, groups)
        return Loc(loc.rank, loc.buffer, owner * fine + start[piece])

    ops = [Op.make(op.id, op.kind, moved(op.src), moved(op.dst), sizes[op.src.index % groups], op.deps, op.step,
                   op.route, op.origin) for op in built.ops]
    old = built.plan.problem.collective
    coll = replace(standard(CollectiveKind.ALLREDUCE, old.ranks, fine, 0), name=old.name, root=old.root)
    timeline = sequence(ops, network, coll.slot_bytes(size_bytes))
    plan = replace(built.plan, problem=replace(built.plan.problem, collective=coll))
    return Candidate(plan, timeline, (), timeline.seconds, fine)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pieces", default="16,24,28,32,48", help="equal piece counts per GPU's chunk ('' for none)")
    ap.add_argument("--sizes", nargs="*", default=["1x4,2x28,1x4", "1x2,2x30,1x2", "2x30,1x4", "1x4,6x20,1x4"],
                    help="unequal layouts, group sizes in fine slots (SIZExTIMES,...)")
    ap.add_argument("--out", default="", help="write the rows as JSON here")
    args = ap.parse_args()
    options = SynthesisOptions(progress=False)
    topo = resolve_topology(TOPOLOGY)
    coll = standard("allreduce", topo.num_ranks, 1)
    forward, backward = Network(topo), Network(reversed_topology(topo))
    bound = lower_bounds(topo, coll, GIB).best_s
    t = time.process_time()
    rates = direct.joint_rates(forward, backward, coll, GIB, options, Deadline(600), Progress(False))
    rates = direct.with_own_rates(rates, forward, backward, coll, GIB, options, Deadline(600), Progress(False))
    print(f"rate LPs: {time.process_time() - t:.1f} CPU s; bound {bound * 1e6:,.1f} us; "
          f"load {os.getloadavg()[0]:.1f}", flush=True)

    def candidate(pieces: int):
        cand = direct.direct_candidate(forward, backward, coll, GIB, pieces, rates, options, Deadline(600),
                                       Progress(False))
        return cand, to_result(cand, coll, topo, Deadline(600)).schedule

    rows = []
    for pieces in (int(p) for p in args.pieces.split(",") if p):
        t = time.process_time()
        cand, schedule = candidate(pieces)
        nodes, _ = node_estimate(schedule)
        rows.append({"layout": f"{pieces} equal", "groups": pieces, "slots": pieces,
                     "time_over_bound": cand.estimate_s / bound, "xml_nodes_fused": nodes,
                     "cpu_s": time.process_time() - t})
        print(json.dumps(rows[-1]), flush=True)
    for text in args.sizes:
        sizes = parse_sizes(text)
        t = time.process_time()
        built = direct.direct_ops(forward, backward, coll, GIB, len(sizes), rates, options, Deadline(600),
                                  Progress(False))
        cand = grouped(built, sizes, forward, GIB)
        schedule = to_result(cand, coll, topo, Deadline(600)).schedule
        verify(schedule, topo)
        nodes, _ = node_estimate(schedule)
        rows.append({"layout": text, "groups": len(sizes), "slots": sum(sizes),
                     "time_over_bound": cand.estimate_s / bound,
                     "xml_nodes_fused": nodes, "verified": True, "cpu_s": time.process_time() - t})
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"topology": TOPOLOGY, "size": GIB, "bound_s": bound, "load_end": os.getloadavg()[0],
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
