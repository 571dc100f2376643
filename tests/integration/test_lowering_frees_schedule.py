"""The driver hands the schedule it lowers to the pass manager alone: once msccl-merge
has replaced it, the ops it replaced are freed rather than kept through the rest of the
lowering (over a GiB at 1,024 ranks), and the result is what lowering it otherwise gives."""

from __future__ import annotations

import gc
import weakref

from collc import driver, frontend
from collc.backends import BackendOptions, get_backend
from collc.passes.base import PassManager, parse_pipeline


def test_the_schedule_before_merging_is_freed_during_the_lowering(monkeypatch):
    topo = frontend.resolve_topology("ring(8)")
    job = driver.CompileJob(topo, frontend.resolve_collective("allreduce", 8), 1 << 20, algorithm="ring")
    back = get_backend("msccl-xml")
    produced: list[weakref.ref] = []
    alive_at_deps: list[bool] = []
    produce = driver.produce_schedule

    def recording(job, max_ops=None, max_peers=None, peer_limit=None, landings=True, verified=True,
                  over_nodes=True):
        unit, solver = produce(job, max_ops, max_peers, peer_limit, landings, verified, over_nodes)
        produced.append(weakref.ref(unit.schedule))
        return unit, solver

    from collc.backends.msccl_xml import dependencies

    real_run = dependencies.OrderSteps.run

    def watching(self, unit):
        gc.collect()
        alive_at_deps.append(produced[0]() is not None)
        return real_run(self, unit)

    monkeypatch.setattr(driver, "produce_schedule", recording)
    monkeypatch.setattr(dependencies.OrderSteps, "run", watching)
    lowered, _ = driver.schedule_for_backend(job, back, BackendOptions())
    monkeypatch.undo()
    assert alive_at_deps == [False]
    assert lowered.schedule is not None and len(lowered.schedule.ops) < 3 * 8 * 7  # merged
    # The same program as lowering a schedule the caller keeps.
    unit, _ = driver.produce_schedule(job)
    again = PassManager(parse_pipeline(back.lowering(BackendOptions()))).run(unit)
    assert again.lowered == lowered.lowered
