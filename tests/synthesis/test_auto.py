"""Method auto's steady-state search (collc.synthesis.auto): when it stops."""

from __future__ import annotations

import numpy as np

import collc.synthesis.auto as auto
from collc.frontend import resolve_topology
from collc.frontend.demand import demand_collective
from collc.synthesis.core import synthesize
from collc.synthesis.options import SynthesisOptions


def _sparse_demand_on_dgx1() -> tuple:
    """A 10%-dense matrix on dgx1 at 64 MiB per rank (the demand benchmark's kind): its
    first schedule is within NEAR_BOUND of the bound but not within the tolerance, so
    the tolerance asks for more chunks."""
    rng = np.random.default_rng(1)
    m = (rng.random((8, 8)) < 0.1) * rng.random((8, 8)) * ~np.eye(8, dtype=bool)
    m = m / m.sum(axis=1).max() * (64 << 20)
    topo = resolve_topology("dgx1")
    return topo, demand_collective(m)


def _tried(monkeypatch, cheap_ops: int) -> tuple[list[str], float]:
    monkeypatch.setattr(auto, "CHEAP_OPS", cheap_ops)
    topo, d = _sparse_demand_on_dgx1()
    result = synthesize(topo, d.collective, d.size_bytes, SynthesisOptions(progress=False))
    note = result.note()
    return note["steady_tried"], result.estimate_s / note["lower_bound_s"]


def test_a_demand_search_within_the_goal_takes_only_cheap_steps(monkeypatch):
    tried, _ = _tried(monkeypatch, 10**9)
    assert len(tried) >= 2, tried  # the tolerance asks for more chunks when they are cheap
    tried_costly, ratio = _tried(monkeypatch, 0)
    assert len(tried_costly) == 1, tried_costly  # ... and stops at the first once they are not
    assert ratio <= 1 + auto.NEAR_BOUND
