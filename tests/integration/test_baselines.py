"""Baselines are timed in their best case: fifo, and fair sharing where an algorithm
puts several transfers of one step on a GPU's links."""

from __future__ import annotations

import pytest

import collc.frontend as fe
from collc.analysis.simulate import simulate
from collc.driver import CompileJob, baseline_time, baselines_for


def test_direct_alltoall_baseline_is_timed_with_fair_sharing_too():
    topo, coll = fe.resolve_topology("hgx_h100"), fe.resolve_collective("alltoall", 8)
    sched = fe.instantiate_algorithm("direct", topo, coll)
    fifo = simulate(sched, topo, 256 << 20).time_s
    fair = simulate(sched, topo, 256 << 20, sharing="fair").time_s
    assert fair < 0.7 * fifo  # fifo serves a GPU's seven sends one after another
    assert baseline_time(sched, topo, 256 << 20) == fair
    [direct] = baselines_for(CompileJob(topo, coll, 256 << 20))
    assert direct.name == "direct" and direct.time_s == pytest.approx(fair)


def test_a_ring_has_one_transfer_per_link_per_step_and_keeps_its_fifo_time():
    topo, coll = fe.resolve_topology("ring(n=8)"), fe.resolve_collective("allgather", 8)
    sched = fe.instantiate_algorithm("ring", topo, coll)
    assert baseline_time(sched, topo, 64 << 20) == simulate(sched, topo, 64 << 20).time_s
