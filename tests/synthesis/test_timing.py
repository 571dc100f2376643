"""A list schedule made in steps (`sequence_steps`, for work begun ahead of a solve's
end) is the one `sequence` makes at once."""

from __future__ import annotations

from test_extract import _dgx1_allgather_plan, _steps_taken

from collc.synthesis import timing
from collc.synthesis.extract import copy_ops


def test_a_timeline_made_in_steps_is_the_timeline_made_at_once(monkeypatch):
    plan = _dgx1_allgather_plan()
    ops = copy_ops(plan).ops
    network, slot = plan.problem.network, plan.problem.slot_bytes
    whole = timing.sequence(ops, network, slot)
    monkeypatch.setattr(timing, "INSTANTS_PER_STEP", 4)
    taken, stepped = _steps_taken(timing.sequence_steps(ops, network, slot))
    assert taken > 4
    assert stepped.seconds == whole.seconds and stepped.ops == whole.ops
