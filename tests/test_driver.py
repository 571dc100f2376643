"""The driver's schedule left unverified for `collc compile` to verify while it writes."""

from __future__ import annotations

from collc.driver import CompileJob, produce_schedule
from collc.frontend import resolve_topology
from collc.ir.collective import allgather


def ring(n: int):
    return resolve_topology(f"ring(n={n})")


def test_the_default_pipeline_leaves_the_verification_to_the_caller_when_asked():
    job = CompileJob(ring(4), allgather(4), 1 << 16)
    later, _ = produce_schedule(job, verified=False)
    now, _ = produce_schedule(job)
    assert not later.verified and now.verified
    assert later.schedule.ops == now.schedule.ops
    assert "verify" not in later.notes and now.notes["verify"]["ok"] is True


def test_another_pipeline_verifies_as_usual_even_when_asked_not_to():
    # The user's own pipeline (here with a verify of its own) runs as written.
    job = CompileJob(ring(4), allgather(4), 1 << 16, pipeline="synthesize,verify")
    unit, _ = produce_schedule(job, verified=False)
    assert unit.verified
