"""The compile report: simulated time, lower bounds, bandwidths and baselines.

Every figure comes from one alpha-beta model (collc.analysis.simulate), so a hand-written
ring and a synthesized schedule are judged the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from collc.ir.collective import Collective, CollectiveKind

# nccl-tests' busbw = algbw x factor (its src/<coll>.cu GetBw functions).
_BUS_FACTOR = {
    CollectiveKind.ALLREDUCE: lambda n: 2 * (n - 1) / n,
    CollectiveKind.ALLGATHER: lambda n: (n - 1) / n,
    CollectiveKind.REDUCESCATTER: lambda n: (n - 1) / n,
    CollectiveKind.ALLTOALL: lambda n: (n - 1) / n,
    CollectiveKind.GATHER: lambda n: (n - 1) / n,
    CollectiveKind.SCATTER: lambda n: (n - 1) / n,
    CollectiveKind.BROADCAST: lambda n: 1.0,
    CollectiveKind.REDUCE: lambda n: 1.0,
    CollectiveKind.CUSTOM: lambda n: 1.0,
}


def bus_factor(collective: Collective) -> float:
    return _BUS_FACTOR[collective.kind](collective.ranks)


def bandwidths(collective: Collective, size_bytes: int, time_s: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes), as nccl-tests defines them."""
    if time_s <= 0:
        return 0.0, 0.0
    algbw = size_bytes / time_s / 1e9
    return algbw, algbw * bus_factor(collective)


@dataclass(frozen=True)
class Baseline:
    name: str
    time_s: float | None
    error: str | None = None

    def to_json(self, time_s: float) -> dict[str, Any]:
        if self.time_s is None:
            return {"time_us": None, "error": self.error}
        return {"time_us": self.time_s * 1e6,
                "speedup": (self.time_s / time_s) if time_s > 0 else None}


def build_report(*, collective: Collective, requested: Collective, topology_name: str, size_bytes: int,
                 time_s: float, bounds: Any, solver: dict[str, Any] | None, baselines: list[Baseline],
                 schedule_stats: dict[str, Any], link_utilization: dict[str, float],
                 outputs: list[str], backend: str) -> dict[str, Any]:
    algbw, busbw = bandwidths(requested, size_bytes, time_s)
    lb = bounds.best_s
    report: dict[str, Any] = {
        "collective": requested.name,
        "topology": topology_name,
        "ranks": requested.ranks,
        "size_bytes": size_bytes,
        "time_us": time_s * 1e6,
        "lower_bound_us": lb * 1e6,
        "ratio_to_lower_bound": (time_s / lb) if lb > 0 else None,
        "lower_bounds": bounds.to_json(),
        "algbw_GBps": algbw,
        "busbw_GBps": busbw,
        "solver": solver,
        "baselines": {b.name: b.to_json(time_s) for b in baselines},
        "schedule": schedule_stats,
        "verified": True,
        "backend": backend,
        "outputs": outputs,
        "busiest_links": dict(sorted(link_utilization.items(), key=lambda kv: -kv[1])[:5]),
    }
    report["optimality"] = optimality(solver, requested, report["ratio_to_lower_bound"])
    if requested.demand is not None:
        report["demand"] = demand_facts(requested, size_bytes)
    with_latency = getattr(bounds, "with_latency_s", lb)
    if with_latency > lb * 1.01:
        # Small messages: the cut bound with each link's latency window is the tighter one.
        report["lower_bound_with_latency_us"] = with_latency * 1e6
        report["ratio_to_bound_with_latency"] = time_s / with_latency
    ring = next((b for b in baselines if b.name == "ring" and b.time_s), None)
    if ring is not None:
        report["ratio_to_ring"] = time_s / ring.time_s
    return report


# Methods whose "optimal" is over schedules of whole chunks at the count they were given.
WHOLE_CHUNK_METHODS = ("milp", "lp", "rounds", "greedy")


def optimality(solver: dict[str, Any] | None, requested: Collective, ratio: float | None) -> str:
    """What the solver's status claims, in words a reader can check: a time-expanded
    model proves its schedule optimal only among those that move whole chunks of the
    count it was given; a faster one may split them. Only a schedule at the lower
    bound is optimal outright."""
    if not solver:
        return "-"
    status = str(solver.get("status", "-"))
    if status == "optimal" and solver.get("method") == "steady":
        return "optimal rates"  # the rate LP's T; pipelining adds its fill and drain
    if status != "optimal" or solver.get("method") not in WHOLE_CHUNK_METHODS:
        return status
    if ratio is not None and ratio <= 1 + 1e-9:
        return "optimal"
    chunks = solver.get("chunks")
    if chunks in (None, requested.chunks):
        return "optimal for unsplit chunks"
    return f"optimal for {chunks} chunks per rank"


def demand_facts(collective: Collective, size_bytes: int) -> dict[str, Any]:
    """A demand matrix's figures: its bytes between GPUs, and what its slots move (each
    entry rounded up to whole slots, or, padded for a runtime of equal blocks, every
    block at the largest)."""
    between = [b for i, j, b in collective.demand or () if i != j]
    slot = collective.slot_bytes(size_bytes)
    moved = sum(1 for r, buf in enumerate(collective.outputs) for v in buf
                if v is not None and next(iter(v)).rank != r) * slot
    exact = float(sum(between))
    return {"entries": len(between), "bytes": exact, "moved_bytes": moved,
            "padded": collective.kind is not CollectiveKind.CUSTOM,
            "extra_share": (moved / exact - 1) if exact > 0 else 0.0}
