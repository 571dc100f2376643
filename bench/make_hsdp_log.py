"""NCCL logs of an HSDP-like job of 64 ranks (8 nodes x 8 GPUs), made from the real
2.27.7 sample: its lines, with ranks, hosts, pids, communicators and sizes rewritten.

One rank's log has four communicators (as `NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL`
writes them, without TUNING lines: about 190 bytes per record):
  - the world (64 ranks): parameter broadcasts at start, a loss AllReduce per step;
  - the shard group (8 ranks of one node): AllGather of each layer's parameters in the
    forward and backward pass, ReduceScatter of its gradients;
  - the replicate group (8 ranks, one per node, strided by 8): AllReduce of the shards;
  - a second world communicator (a clone for checkpoints and metrics): a few calls.
Each step has `layers` x 4 + 2 calls; the warm-up has `warmup` broadcasts (more than 64
by default, as a model's parameters are broadcast one by one at start).

    python3 bench/make_hsdp_log.py OUT.log [--rank 0] [--records 301422]
    python3 bench/make_hsdp_log.py DIR --ranks 64 [--records 301422]   # one log per rank
    python3 bench/make_hsdp_log.py OUT.log --tuning      # a TUNING line after every call

With `--tuning`, every COLL line is followed by the TUNING line NCCL writes after it with
`NCCL_DEBUG_SUBSYS=COLL,TUNING` (`<Op>: <bytes> Bytes -> Algo RING proto SIMPLE ...`,
the bytes as NCCL counts them: AllGather and ReduceScatter over all ranks; about 300
bytes per record).

Every line keeps the sample's format (prefix `host:pid:tid [dev] NCCL INFO `, the COLL
line's fields in NCCL's order); only the values change.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / ".." / "shared" / "data" / "nccl-logs" / "nccl-tests__Timez-zx_all_reduce_perf_2xA100_nccl-2.27.7.log"

WORLD, NODE_GPUS = 64, 8
# (name, commId, comm pointer) of the four communicators: pointers differ per comm.
COMMS = (("world", "0x7a1c3d5e9b2f4a61", "0x55d0a1000000"),
         ("shard", "0x1f2e3d4c5b6a7988", "0x55d0a2000000"),
         ("replicate", "0x0123456789abcdef", "0x55d0a3000000"),
         ("world-clone", "0x5a5a5a5a12345678", "0x55d0a4000000"))
_COLL = re.compile(r"^(?P<pre>\S+ \[\d+\] NCCL INFO )(?P<op>\w+): opCount (?P<oc>\S+) sendbuff (?P<sb>\S+) "
                   r"recvbuff (?P<rb>\S+) count \d+ datatype \d+ op \d+ root \d+ comm \S+ \[nranks=\d+\] "
                   r"stream (?P<st>\S+)$")


def _template() -> tuple[list[str], str]:
    """The sample's header lines up to its first COLL line (INIT lines dropped: they are
    rewritten per communicator), and one COLL line to copy the format from."""
    header, coll = [], None
    for line in SAMPLE.read_text().splitlines():
        if "opCount" in line:
            coll = line
            break
        if "ncclCommInitRank" in line or "Init COMPLETE" in line or "Init START" in line:
            continue
        header.append(line)
    assert coll is not None and _COLL.match(coll), "the sample's COLL line format changed"
    return header, coll


def _members(rank: int) -> dict[str, tuple[int, int]]:
    """(rank in the comm, comm size) of each communicator for a global rank."""
    node, local = divmod(rank, NODE_GPUS)
    return {"world": (rank, WORLD), "shard": (local, NODE_GPUS), "replicate": (node, WORLD // NODE_GPUS),
            "world-clone": (rank, WORLD)}


def _step(layers: int) -> list[tuple[str, str, int, int]]:
    """One training step's calls: (op, comm, count, datatype) in issue order."""
    calls = []
    for layer in range(layers):                              # forward: gather each layer's shard
        calls.append(("AllGather", "shard", 1_572_864 + 4096 * (layer % 5), 9))
    for layer in reversed(range(layers)):                    # backward: gather, reduce-scatter, all-reduce
        calls.append(("AllGather", "shard", 1_572_864 + 4096 * (layer % 5), 9))
        calls.append(("ReduceScatter", "shard", 1_572_864 + 4096 * (layer % 5), 7))
        calls.append(("AllReduce", "replicate", 1_572_864 + 4096 * (layer % 5), 7))
    calls.append(("AllReduce", "world", 1, 7))               # the loss
    calls.append(("AllReduce", "world-clone", 4, 7))         # metrics
    return calls


# Bytes per element of the datatypes used here (ncclBfloat16, ncclFloat32).
TYPE_BYTES = {9: 2, 7: 4}


def make_log(rank: int, records: int, layers: int = 20, warmup: int = 150, tuning: bool = False) -> str:
    header, coll = _template()
    m = _COLL.match(coll)
    host = f"node{rank // NODE_GPUS:02d}"
    pid = 41000 + rank
    pre = f"{host}:{pid}:{pid} [{rank % NODE_GPUS}] NCCL INFO "
    rewrite = lambda line: re.sub(r"^\S+ \[\d+\] ", f"{host}:{pid}:{pid} [{rank % NODE_GPUS}] ", line)
    out = [rewrite(line) for line in header]
    members = _members(rank)
    node, local = divmod(rank, NODE_GPUS)
    for name, comm_id, ptr in COMMS:
        r, n = members[name]
        # One shard group per node, one replicate group per local GPU index: their ids differ.
        group = {"shard": node, "replicate": local}.get(name, 0)
        comm_id = f"0x{int(comm_id, 16) + group:016x}"
        out.append(f"{pre}ncclCommInitRankConfig comm {ptr} rank {r} nranks {n} cudaDev {rank % NODE_GPUS} "
                   f"nvmlDev {rank % NODE_GPUS} busId 17000 commId {comm_id} - Init COMPLETE")
    ptrs = {name: ptr for name, _id, ptr in COMMS}
    sizes = {name: n for name, (_r, n) in members.items()}
    stream = m.group("st")
    op_counts = {name: 0 for name in ptrs}

    def line(op: str, comm: str, count: int, dtype: int, root: int = 0) -> str:
        oc = op_counts[comm]
        op_counts[comm] += 1
        text = (f"{pre}{op}: opCount {oc:x} sendbuff {m.group('sb')} recvbuff {m.group('rb')} count {count} "
                f"datatype {dtype} op 0 root {root} comm {ptrs[comm]} [nranks={sizes[comm]}] stream {stream}")
        if tuning:
            nbytes = count * TYPE_BYTES[dtype] * (sizes[comm] if op in ("AllGather", "ReduceScatter") else 1)
            text += f"\n{pre}{op}: {nbytes} Bytes -> Algo RING proto SIMPLE channel{{Lo..Hi}}={{0..23}}"
        return text

    written = 0
    for i in range(min(warmup, records)):                   # parameters broadcast one by one
        out.append(line("Broadcast", "world", 65_536 + 512 * (i % 37), 9))
        written += 1
    step = _step(layers)
    while written < records:
        for op, comm, count, dtype in step[:records - written]:
            out.append(line(op, comm, count, dtype))
        written += min(len(step), records - written)
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the log (or, with --ranks, a directory of per-rank logs)")
    ap.add_argument("--records", type=int, default=301_422, help="COLL lines per rank (default 301,422)")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--ranks", type=int, default=None, help="write one log per rank 0..N-1 into OUT")
    ap.add_argument("--tuning", action="store_true", help="a TUNING line after every COLL line")
    args = ap.parse_args()
    if args.ranks:
        args.out.mkdir(parents=True, exist_ok=True)
        for r in range(args.ranks):
            (args.out / f"rank{r:04d}.log").write_text(make_log(r, args.records, tuning=args.tuning))
    else:
        args.out.write_text(make_log(args.rank, args.records, tuning=args.tuning))


if __name__ == "__main__":
    main()
