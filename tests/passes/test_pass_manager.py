from dataclasses import dataclass, replace

import pytest

from collc.diagnostics import ScheduleError
from collc.ir.collective import allgather
from collc.passes import CompileUnit, Pass, PassManager, PipelineError, parse_pipeline, register_pass
from schedules import ring_allgather, ring_topology


@register_pass
@dataclass(frozen=True)
class DropLastOp(Pass):
    """A deliberately wrong pass: the manager's re-verification must catch it."""

    name = "test-drop-last-op"
    summary = "remove the last op (for tests)"
    count: int = 1
    scale: float = 1.0
    loud: bool = False

    def run(self, unit):
        sched = unit.schedule
        return replace(unit, schedule=replace(sched, ops=sched.ops[: len(sched.ops) - self.count]))


def _unit(n=4):
    return CompileUnit(ring_topology(n), allgather(n), 1 << 20, schedule=ring_allgather(n))


def test_pipeline_text_builds_typed_options():
    (p,) = parse_pipeline("test-drop-last-op{count=2 scale=0.5 loud=true}")
    assert (p.count, p.scale, p.loud) == (2, 0.5, True)
    assert p.spec() == "test-drop-last-op{count=2 scale=0.5 loud=true}"
    assert [q.name for q in parse_pipeline("verify, test-drop-last-op{count=0}")] == ["verify", "test-drop-last-op"]


@pytest.mark.parametrize("text,message", [
    ("nonesuch", "unknown pass 'nonesuch'"),
    ("verify{races=maybe}", "option 'races' of pass 'verify' expects a bool, got 'maybe'"),
    ("verify{colour=red}", "pass 'verify' has no option 'colour'"),
    ("verify{races}", "option 'races' of pass 'verify' needs a value"),
    ("verify{{", "cannot read pipeline"),
])
def test_pipeline_errors(text, message):
    with pytest.raises(PipelineError, match=message.replace("(", r"\(").replace("{", r"\{")):
        parse_pipeline(text)


def test_manager_reverifies_after_a_pass_that_changes_the_schedule():
    pm = PassManager(parse_pipeline("verify,test-drop-last-op"))
    with pytest.raises(ScheduleError, match="must hold"):
        pm.run(_unit())


def test_manager_runs_and_records_notes_and_timings():
    pm = PassManager(parse_pipeline("test-drop-last-op{count=0},verify"))
    unit = pm.run(_unit())
    assert unit.notes["verify"] == {"ok": True, "ops": 16}
    assert [name for name, _ in pm.timings] == ["test-drop-last-op", "verify"]


def test_duplicate_pass_name_is_refused():
    @dataclass(frozen=True)
    class Other(Pass):
        name = "verify"

    with pytest.raises(ValueError, match="pass name 'verify' is taken"):
        register_pass(Other)
