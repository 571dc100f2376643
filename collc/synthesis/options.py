"""What a synthesis is asked for: the method and its options.

The bottom of collc.synthesis: every method reads these, and the entry point
(collc.synthesis.core) takes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from collc.synthesis.solver import SolverOptions
from collc.synthesis.timing import DEFAULT_MODEL, TimingModel


class Method(str, Enum):
    """Synthesis methods; the values are the pass option's tokens."""

    AUTO = "auto"
    MILP = "milp"  # exact time-expanded MILP (TE-CCL)
    LP = "lp"  # time-expanded LP relaxation, rounded to whole-chunk paths
    ROUNDS = "rounds"  # windows of epochs solved one after another
    STEADY = "steady"  # steady-state rate LP, pipelined over many chunks
    GREEDY = "greedy"  # the list-scheduling heuristic on the epoch grid


@dataclass(frozen=True)
class SynthesisOptions:
    method: Method = Method.AUTO
    chunks: int = 0  # chunks per rank; 0: choose
    time_limit: float = 600.0  # a safety net: the search is bounded by work, not by time
    mip_gap: float = 0.0
    threads: int = 0
    seed: int = 0
    epochs: int = 0  # 0: search from the lower bound
    progress: bool = True
    timing: TimingModel = DEFAULT_MODEL
    # Most ops a schedule may have (the verifier and backends stay fast); pipelining
    # stops splitting chunks before it.
    max_ops: int = 300_000
    # Search stops once a schedule is within this fraction of the lower bound.
    tolerance: float = 0.01
    # Most distinct peers per GPU in a replicated tree packing (0: no limit), applied
    # only where a GPU would otherwise have more than peer_limit (0: always).
    max_peers: int = 0
    peer_limit: int = 0
    # AllReduce and ReduceScatter over identical nodes (collc.synthesis.nodes): "auto"
    # (collc.synthesis.nodes.wanted), "on", "off".
    nodes: str = "auto"
    # A ReduceScatter's partial sums after the first into one rank may land in scratch
    # (collc.synthesis.compose); off, they are chained (fewer ops and MSCCL XML steps).
    landings: bool = True

    @property
    def solver(self) -> SolverOptions:
        return SolverOptions(self.mip_gap, self.threads, self.seed, self.max_peers, self.peer_limit)
