"""`synthesize`: a schedule for the unit's collective on its topology, by TE-CCL-style
optimization on HiGHS (see collc.synthesis)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from collc.diagnostics import CollcError
from collc.passes.base import CompileUnit, Pass, PipelineError, register_pass
from collc.synthesis.core import synthesize
from collc.synthesis.nodes import OverNodes
from collc.synthesis.options import Method, SynthesisOptions


@register_pass
@dataclass(frozen=True)
class Synthesize(Pass):
    name = "synthesize"
    summary = "synthesize a schedule with HiGHS (methods: auto, milp, lp, rounds, steady, greedy)"
    method: str = "auto"
    chunks: int = 0  # chunks per rank; 0: choose
    time_limit: float = 600.0  # seconds for the whole pass: a safety net (the search is bounded by work)
    mip_gap: float = 0.0
    threads: int = 0  # 0: HiGHS's default
    seed: int = 0
    epochs: int = 0  # 0: search from the lower bound
    progress: bool = True
    max_ops: int = 300_000  # most ops the schedule may have (pipelining stops before it)
    tolerance: float = 0.01  # stop improving once within this fraction of the lower bound
    max_peers: int = 0  # most distinct peers per GPU where trees are replicated over identical nodes; 0: no limit
    peer_limit: int = 0  # apply max_peers only where a GPU would otherwise have more peers than this; 0: always
    # AllReduce and ReduceScatter over identical nodes: auto (an AllReduce where the flat
    # composition exceeds max_ops, a ReduceScatter on 24 nodes or more), on, off
    nodes: str = "auto"
    landings: bool = True  # ReduceScatter: partial sums may land in scratch (off: chained, fewer steps)
    # off: the schedule is not verified by the pass; the pass manager verifies it after
    # the pass, or (`collc compile`, collc.driver) the driver while the output is written.
    verify: bool = True

    def __post_init__(self) -> None:
        known = [m.value for m in Method]
        if self.method not in known:
            raise PipelineError(f"pass 'synthesize' has no method '{self.method}' (methods: {', '.join(known)})")
        if self.chunks < 0 or self.epochs < 0 or self.threads < 0 or self.max_ops < 1 \
                or self.max_peers < 0 or self.peer_limit < 0:
            raise PipelineError("pass 'synthesize': chunks, epochs and threads must not be negative, "
                                "and max_ops must be positive (max_peers, peer_limit: 0 or more)")
        choices = [c.value for c in OverNodes]
        if self.nodes not in choices:
            raise PipelineError(f"pass 'synthesize': nodes must be one of {', '.join(choices)} (got '{self.nodes}')")
        if self.time_limit <= 0:
            raise PipelineError(f"pass 'synthesize': time_limit must be positive (got {self.time_limit})")
        if not 0 <= self.tolerance < 1:
            raise PipelineError(f"pass 'synthesize': tolerance must be in [0, 1) (got {self.tolerance})")
        if not 0 <= self.mip_gap < 1:
            raise PipelineError(f"pass 'synthesize': mip_gap must be in [0, 1) (got {self.mip_gap})")

    def options_for_synthesis(self) -> SynthesisOptions:
        return SynthesisOptions(method=Method(self.method), chunks=self.chunks, time_limit=self.time_limit,
                                mip_gap=self.mip_gap, threads=self.threads, seed=self.seed, epochs=self.epochs,
                                progress=self.progress, max_ops=self.max_ops,
                                tolerance=self.tolerance, max_peers=self.max_peers,
                                peer_limit=self.peer_limit, nodes=self.nodes, landings=self.landings)

    def run(self, unit: CompileUnit) -> CompileUnit:
        if unit.collective is None or unit.topology is None:
            raise CollcError("pass 'synthesize' needs a topology and a collective")
        result = synthesize(unit.topology, unit.collective, unit.size_bytes, self.options_for_synthesis(),
                            verified=self.verify)
        if not self.verify:
            return replace(unit, schedule=result.schedule).with_note(self.name, **result.note())
        # `synthesize` verifies the schedule it returns on this topology (races checked).
        return unit.with_verified(result.schedule).with_note(self.name, **result.note())
