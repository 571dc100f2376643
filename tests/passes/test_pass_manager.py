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


def _count_verifications(monkeypatch) -> list:
    """Every run of the verifier from now on appends to the returned list (the array
    form is turned off, so that every run goes through the op-by-op one)."""
    import collc.verify.arrays as arrays
    import collc.verify.symbolic as symbolic

    runs: list = []
    real = symbolic.verify_op_by_op
    monkeypatch.setattr(arrays, "verify_on_arrays", lambda schedule, topology: False)
    monkeypatch.setattr(symbolic, "verify_op_by_op", lambda *args, **kw: (runs.append(args[0]), real(*args, **kw)))
    return runs


def test_a_synthesized_schedule_is_verified_once(monkeypatch):
    """`synthesize` verifies the schedule it returns; the pass marks it on the unit, so
    neither the manager's check after the pass nor the `verify` pass runs it again (at
    1,024 GPUs each run takes a minute)."""
    from collc import frontend

    runs = _count_verifications(monkeypatch)
    topo = frontend.resolve_topology("ring(4)")
    unit = PassManager.from_text("synthesize{progress=false},verify").run(
        CompileUnit(topo, allgather(4), 1 << 20))
    assert len(runs) == 1 and unit.notes["verify"]["ok"]
    assert unit.verified and unit.verified_on == (unit.schedule, topo)


@register_pass
@dataclass(frozen=True)
class RenameSchedule(Pass):
    """A pass that changes the schedule object and nothing it does (for tests)."""

    name = "test-rename-schedule"
    summary = "replace the schedule by a renamed copy (for tests)"

    def run(self, unit):
        return replace(unit, schedule=replace(unit.schedule, name=unit.schedule.name + "-renamed"))


def test_a_schedule_a_pass_changed_is_verified_again_and_marked(monkeypatch):
    """The mark names the very schedule object: a pass's copy is verified by the manager
    (in full where the schedule before it was not verified, else as the same work, on
    arrays), which then marks the copy, and the `verify` pass after it does not run."""
    runs = _count_verifications(monkeypatch)
    unit = PassManager(parse_pipeline("test-rename-schedule,verify")).run(_unit())
    assert [s.name for s in runs] == ["ring-renamed"] and runs[0] is unit.schedule and unit.verified
    runs.clear()
    unit = PassManager(parse_pipeline("verify,test-rename-schedule,verify")).run(_unit())
    assert [s.name for s in runs] == ["ring"]  # the copy does the verified schedule's work
    assert unit.verified and unit.schedule.name == "ring-renamed"
    runs.clear()
    with pytest.raises(ScheduleError, match="must hold"):
        PassManager(parse_pipeline("verify,test-drop-last-op")).run(unit)  # the mark vouches for nothing else
    assert len(runs) == 1


def test_the_verify_pass_without_races_does_not_mark_the_schedule(monkeypatch):
    runs = _count_verifications(monkeypatch)
    unit = PassManager(parse_pipeline("verify{races=false},verify")).run(_unit())
    assert len(runs) == 2 and unit.verified
    assert not PassManager(parse_pipeline("verify{races=false}")).run(_unit()).verified
