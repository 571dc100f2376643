"""How long the lower bounds and the simulator take at realistic scale.

    python3 bench/analysis_scaling.py        # writes bench/results/analysis_scaling.json

Topologies are built with the IR (TE-CCL's DGX-2 and NDv2 pairs, and a 64-GPU pod of
8-GPU nodes on a spine switch); schedules are a pipelined ring AllGather (about 200k
ops) and a one-step direct AllToAll on a switch.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from collc.analysis.bounds import lower_bounds
from collc.analysis.simulate import simulate
from collc.io import atomic_write
from collc.ir import Buffer, Link, Loc, Node, NodeKind, Op, OpKind, Schedule, Topology
from collc.ir.collective import allgather, alltoall, standard

GB, US = 1e9, 1e-6
DGX1_LANES = [
    [0, 2, 1, 1, 2, 0, 0, 0], [2, 0, 1, 2, 0, 1, 0, 0], [1, 1, 0, 2, 0, 0, 2, 0], [1, 2, 2, 0, 0, 0, 0, 1],
    [2, 0, 0, 0, 0, 2, 1, 1], [0, 1, 0, 0, 2, 0, 1, 2], [0, 0, 2, 0, 1, 1, 0, 2], [0, 0, 0, 1, 1, 2, 2, 0],
]


def both(a: str, b: str, bw: float, lat: float, lanes: int = 1) -> list[Link]:
    return [Link(a, b, bw, lat, lanes), Link(b, a, bw, lat, lanes)]


def dgx2_x2() -> Topology:
    nodes = [Node(f"c{c}g{i}", NodeKind.GPU, c * 16 + i) for c in range(2) for i in range(16)]
    links = []
    for c in range(2):
        nodes.append(Node(f"c{c}sw", NodeKind.SWITCH))
        for i in range(16):
            links += both(f"c{c}g{i}", f"c{c}sw", 125 * GB, 0.35 * US)
    for k in range(8):
        links += [Link(f"c0g{2 * k + 1}", f"c1g{2 * k}", 12.5 * GB, 2.6 * US),
                  Link(f"c1g{2 * k + 1}", f"c0g{2 * k}", 12.5 * GB, 2.6 * US)]
    return Topology("dgx2_x2", tuple(nodes), tuple(links))


def ndv2_x2() -> Topology:
    nodes = [Node(f"c{c}g{i}", NodeKind.GPU, c * 8 + i) for c in range(2) for i in range(8)]
    links = []
    for c in range(2):
        nodes.append(Node(f"c{c}nic", NodeKind.NIC))
        for i in range(8):
            for j in range(8):
                if DGX1_LANES[i][j]:
                    links.append(Link(f"c{c}g{i}", f"c{c}g{j}", 25 * GB, 0.7 * US, DGX1_LANES[i][j]))
            links += both(f"c{c}g{i}", f"c{c}nic", 12.5 * GB, 1.3 * US)
    links += both("c0nic", "c1nic", 12.5 * GB, 1.3 * US)
    return Topology("ndv2_x2", tuple(nodes), tuple(links))


def pod(hosts: int = 8, per_host: int = 8) -> Topology:
    nodes = [Node(f"h{h}g{i}", NodeKind.GPU, h * per_host + i) for h in range(hosts) for i in range(per_host)]
    nodes.append(Node("spine", NodeKind.SWITCH))
    links = []
    for h in range(hosts):
        nodes.append(Node(f"h{h}sw", NodeKind.SWITCH))
        for i in range(per_host):
            links += both(f"h{h}g{i}", f"h{h}sw", 300 * GB, 1 * US) + both(f"h{h}g{i}", "spine", 50 * GB, 2 * US)
    return Topology(f"pod{hosts}x{per_host}", tuple(nodes), tuple(links))


def ring(n: int) -> Topology:
    nodes = tuple(Node(f"g{i}", NodeKind.GPU, i) for i in range(n))
    links = tuple(l for i in range(n) for l in both(f"g{i}", f"g{(i + 1) % n}", 10 * GB, US))
    return Topology(f"ring{n}", nodes, links)


def star(n: int) -> Topology:
    nodes = tuple([Node(f"g{i}", NodeKind.GPU, i) for i in range(n)] + [Node("sw", NodeKind.SWITCH)])
    return Topology(f"star{n}", nodes, tuple(l for i in range(n) for l in both(f"g{i}", "sw", 10 * GB, US)))


def pipelined_ring_allgather(n: int, chunks: int) -> Schedule:
    ops: list[Op] = []
    last = {}
    for r in range(n):
        for k in range(chunks):
            ops.append(Op(len(ops), OpKind.COPY, Loc(r, Buffer.INPUT, k), Loc(r, Buffer.OUTPUT, r * chunks + k)))
            last[r * chunks + k] = ops[-1].id
    for s in range(1, n):
        for k in range(chunks):
            for r in range(n):
                slot = r * chunks + k
                ops.append(Op(len(ops), OpKind.COPY, Loc((r + s - 1) % n, Buffer.OUTPUT, slot),
                              Loc((r + s) % n, Buffer.OUTPUT, slot), deps=(last[slot],), step=s + k))
                last[slot] = ops[-1].id
    return Schedule("pipelined_ring", allgather(n, chunks), f"ring{n}", tuple(ops))


def direct_alltoall(n: int) -> Schedule:
    ops = tuple(Op(s * n + d, OpKind.COPY, Loc(s, Buffer.INPUT, d), Loc(d, Buffer.OUTPUT, s))
                for s in range(n) for d in range(n))
    return Schedule("direct", alltoall(n), f"star{n}", ops)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    size = 10**9
    rows = []
    for topo in (dgx2_x2(), ndv2_x2(), pod()):
        for kind in ("allgather", "reducescatter", "allreduce", "alltoall", "broadcast"):
            lb, sec = timed(lambda: lower_bounds(topo, standard(kind, topo.num_ranks), size))
            rows.append({"what": "lower_bounds", "topology": topo.name, "collective": kind, "seconds": sec,
                         "best_us": lb.best_s * 1e6, "dominant": lb.dominant, "cut_us": lb.cut_s * 1e6,
                         "ingress_us": lb.ingress_s * 1e6, "volume_us": lb.volume_s * 1e6})
            print(f"bounds {topo.name:10} {kind:14} {sec:6.2f}s best {lb.best_s * 1e6:10.1f} us ({lb.dominant})")
    cases = [(pipelined_ring_allgather(64, 50), ring(64)), (direct_alltoall(32), star(32)),
             (direct_alltoall(64), star(64))]
    for sched, topo in cases:
        for sharing in ("fifo", "fair"):
            sim, sec = timed(lambda: simulate(sched, topo, size, sharing=sharing))
            rows.append({"what": "simulate", "schedule": sched.name, "topology": topo.name, "ops": len(sched.ops),
                         "sharing": sharing, "seconds": sec, "time_us": sim.time_s * 1e6})
            print(f"simulate {sched.name:15} {topo.name:7} {len(sched.ops):7} ops {sharing:4} {sec:6.2f}s "
                  f"-> {sim.time_s * 1e6:10.1f} us")
    out = Path(__file__).resolve().parent / "results" / "analysis_scaling.json"
    atomic_write(out, json.dumps({"machine": platform.platform(), "python": platform.python_version(),
                                  "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
