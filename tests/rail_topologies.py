"""Small clusters of identical nodes on rails, with GPUs of few SMs: the runtime's
threadblock limit binds there as it does for 1,024 H100 GPUs (130 resident, 134 peers
for a direct AllToAll), at a size whose AllToAll compiles in a second."""

from __future__ import annotations

from pathlib import Path

from collc.frontend import resolve_topology
from collc.ir.topology import Topology

QUAD = """
topology quad_node(sms = 8) {
    gpu g[4] sms sms;
    switch nvswitch;
    nic hca[4];
    for i in 0..4 {
        link g[i] <-> nvswitch bw 450 GB/s lat 0.35 us;
        link g[i] <-> hca[i] bw 64 GB/s lat 0.3 us;
    }
}

// Nodes of 4 GPUs, NIC i of every node on rail switch i (as dgx_h100, at half the width).
topology quad(nodes = 2, sms = 8) {
    part node[nodes] = quad_node(sms = sms);
    switch rail[4];
    for k in 0..nodes {
        for i in 0..4 {
            link node[k].hca[i] <-> rail[i] bw 400 Gbit/s lat 1 us;
        }
    }
}
"""


def quad(directory: Path, nodes: int, sms: int) -> Topology:
    """`nodes` nodes of 4 GPUs of `sms` SMs each (sms - 2 threadblocks resident)."""
    path = directory / "quad.coll"
    path.write_text(QUAD)
    return resolve_topology(f"quad.coll:quad(nodes={nodes}, sms={sms})", directory)
