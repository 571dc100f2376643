"""The compile report's words for what a solver proved (collc.report.optimality)."""

from __future__ import annotations

from collc.ir.collective import ChunkId, Collective, CollectiveKind, allgather
from collc.report import optimality


def _custom() -> Collective:
    c = frozenset({ChunkId(0, 0)})
    return Collective("mine", CollectiveKind.CUSTOM, 2, 1, ((c,), ()), ((), (c,)))


def test_a_time_expanded_optimum_is_optimal_for_its_chunks_only():
    milp = {"method": "milp", "status": "optimal", "chunks": 1}
    assert optimality(milp, _custom(), 4.5) == "optimal for unsplit chunks"
    assert optimality({**milp, "chunks": 8}, _custom(), 1.2) == "optimal for 8 chunks per rank"
    assert optimality(milp, _custom(), 1.0) == "optimal"  # at the lower bound: nothing is faster


def test_other_statuses_and_methods():
    assert optimality({"method": "steady", "status": "optimal"}, allgather(4), 1.01) == "optimal rates"
    assert optimality({"method": "milp", "status": "time_limit"}, allgather(4), 1.3) == "time_limit"
    assert optimality(None, allgather(4), None) == "-"
