"""`--nccl-tests`: nccl-tests command lines that replay the mix on a real fabric.

One command per (collective, communicator size, data type, size band): `-b`/`-e` are
the band's smallest and largest size in nccl-tests' own meaning of size (which is what
the mix's `bytes` column holds), `-f 2` steps through it, `-d` is the data type, `-o`
the reduction (sum; traces do not record it) for reducing collectives, and the ranks
run as one process with `-g N` GPUs up to one server's 8 GPUs, else as N MPI processes
of one GPU each (`mpirun -np N ... -g 1`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from collc.profile.mix import Mix
from collc.profile.model import BAND_RATIO

BINARIES = {
    "allreduce": "all_reduce_perf", "allgather": "all_gather_perf", "reducescatter": "reduce_scatter_perf",
    "alltoall": "alltoall_perf", "broadcast": "broadcast_perf", "reduce": "reduce_perf",
    "gather": "gather_perf", "scatter": "scatter_perf", "send": "sendrecv_perf", "recv": "sendrecv_perf",
}
REDUCING = ("allreduce", "reducescatter", "reduce")
# nccl-tests' -d names (its src/common.cu test_typenames).
DTYPES = {
    "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32", "int64": "int64", "uint64": "uint64",
    "float16": "half", "half": "half", "float32": "float", "float": "float", "float64": "double",
    "double": "double", "bfloat16": "bfloat16", "float8_e4m3": "f8e4m3", "float8_e5m2": "f8e5m2",
    "fp8_e4m3": "f8e4m3", "fp8_e5m2": "f8e5m2",
}
GPUS_PER_SERVER = 8


@dataclass
class ReplayCommand:
    collective: str
    nranks: int
    dtype: str
    min_bytes: int
    max_bytes: int
    calls: int
    command: str

    def to_json(self) -> dict[str, Any]:
        return {"collective": self.collective, "nranks": self.nranks, "dtype": self.dtype,
                "min_bytes": self.min_bytes, "max_bytes": self.max_bytes, "job_calls": self.calls,
                "command": self.command}


def _bands(sizes: list[int]) -> list[list[int]]:
    bands: list[list[int]] = []
    for s in sorted(set(sizes)):
        if bands and s <= bands[-1][0] * BAND_RATIO:
            bands[-1].append(s)
        else:
            bands.append([s])
    return bands


def command_for(collective: str, nranks: int, dtype: str, lo: int, hi: int) -> str:
    binary = f"./build/{BINARIES[collective]}"
    flags = [f"-b {lo}", f"-e {hi}", "-f 2", f"-d {DTYPES.get(dtype, 'float')}"]
    if collective in REDUCING:
        flags.append("-o sum")
    if collective in ("send", "recv"):
        nranks = 2
    if nranks <= GPUS_PER_SERVER:
        return " ".join([binary, *flags, f"-g {nranks}"])
    return " ".join([f"mpirun -np {nranks}", binary, *flags, "-g 1"])


def replay_commands(mix: Mix) -> list[ReplayCommand]:
    """The commands, heaviest (by the mix's weight) first."""
    groups: dict[tuple[str, int, str], dict[int, list]] = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))
    for row in mix.rows:
        if row.bytes is None or row.bytes <= 0 or row.collective not in BINARIES:
            continue
        if not row.nranks and row.collective not in ("send", "recv"):  # a transfer needs 2, whatever the comm
            continue
        collective = "send" if row.collective == "recv" else row.collective
        nranks = 2 if collective == "send" else row.nranks
        acc = groups[(collective, nranks, row.dtype or "float32")][row.bytes]
        acc[0] += row.job_calls
        acc[1] += mix.weight(row)
    out = []
    for (coll, nranks, dtype), sizes in groups.items():
        for band in _bands(list(sizes)):
            calls = sum(sizes[s][0] for s in band)
            weight = sum(sizes[s][1] for s in band)
            cmd = ReplayCommand(coll, nranks, dtype, band[0], band[-1], calls,
                                command_for(coll, nranks, dtype, band[0], band[-1]))
            out.append((weight, cmd))
    out.sort(key=lambda wc: (-wc[0], wc[1].collective, wc[1].min_bytes))
    return [c for _, c in out]
