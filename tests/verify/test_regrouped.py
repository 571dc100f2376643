"""The cheap re-verification of a regrouped schedule (collc/verify/regrouped.py): it
accepts what msccl-merge makes of a verified schedule, and hands every wrong rewrite to
the full verifier, which rejects it."""

from dataclasses import dataclass, replace

import pytest

import collc.frontend as fe
import collc.verify.regrouped
from collc.backends.msccl_xml.merge import merge_ops
from collc.diagnostics import ScheduleError
from collc.ir import Op, OpKind
from collc.passes import CompileUnit, Pass, PassManager, parse_pipeline, register_pass
from collc.verify.regrouped import same_work, verify_rewritten
from collc.verify import verify


def _ring(collective: str, n: int = 8):
    """The stdlib ring on ring(n), two chunks per rank (consecutive chunks to merge)."""
    topo = fe.resolve_topology(f"ring({n})")
    return topo, fe.instantiate_algorithm("ring", topo, fe.resolve_collective(f"{collective}(chunks=2)", n))


def _merged(schedule):
    merged = merge_ops(schedule)
    assert len(merged.ops) < len(schedule.ops)  # something was joined
    return merged


def _first_joined(merged) -> int:
    """Position of the first op that does the work of several ops."""
    return next(i for i, op in enumerate(merged.ops) if op.count > 1)


def _with_op(schedule, position: int, op: Op):
    ops = list(schedule.ops)
    ops[position] = op
    return replace(schedule, ops=tuple(ops))


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reducescatter"])
def test_a_merge_of_a_verified_ring_is_the_same_work(collective):
    topo, sched = _ring(collective)  # verified by the front end
    merged = _merged(sched)
    assert same_work(sched, merged)
    verify(merged, topo)  # and the full verifier agrees


def test_an_unverified_schedule_or_other_topology_is_not_taken_as_verified():
    """The compile unit's mark names the very schedule and topology objects verified."""
    topo, sched = _ring("allreduce")
    unit = CompileUnit(topo, sched.collective, 1 << 20).with_verified(sched)
    assert unit.verified
    assert not replace(unit, topology=fe.resolve_topology("ring(8)")).verified  # another (equal) object
    assert not replace(unit, schedule=replace(sched, name="copy")).verified
    assert not CompileUnit(topo, sched.collective, 1 << 20, schedule=sched).verified


def _wrong_merges(merged):
    """(what is wrong, the rewritten schedule) for rewrites that must not pass as regroupings."""
    i = _first_joined(merged)
    op = merged.ops[i]
    later = next(j for j, o in enumerate(merged.ops) if o.deps and j > i)
    lost = merged.ops[later]
    other_kind = OpKind.COPY if op.kind is OpKind.REDUCE else OpKind.REDUCE
    return [
        ("one slot more", _with_op(merged, i, replace(op, count=op.count + 1))),
        ("one slot less", _with_op(merged, i, replace(op, count=op.count - 1))),
        ("destination moved", _with_op(merged, i, replace(op, dst=op.dst.shifted(1)))),
        ("kind changed", _with_op(merged, i, replace(op, kind=other_kind))),
        ("dependency lost", _with_op(merged, later, replace(lost, deps=lost.deps[1:]))),
        ("step changed", _with_op(merged, i, replace(op, step=op.step + 1))),
        ("op dropped", replace(merged, ops=merged.ops[:-1])),
        ("id repeated", _with_op(merged, i + 1, replace(merged.ops[i + 1], id=op.id))),
    ]


@pytest.mark.parametrize("collective", ["allreduce", "allgather"])
def test_a_wrong_merge_is_not_the_same_work(collective):
    topo, sched = _ring(collective)
    for what, wrong in _wrong_merges(_merged(sched)):
        assert not same_work(sched, wrong), what


def test_a_wrong_merge_is_verified_in_full_and_rejected(monkeypatch):
    topo, sched = _ring("allreduce")
    calls = []
    real = collc.verify.regrouped.verify
    monkeypatch.setattr(collc.verify.regrouped, "verify", lambda s, t, **kw: (calls.append(s), real(s, t, **kw)))
    merged = _merged(sched)
    verify_rewritten(sched, merged, topo)
    assert calls == []  # the right merge: no full verification
    for what, wrong in _wrong_merges(merged):
        if what == "step changed":
            continue  # a later step is still a correct schedule: verified in full, and passes
        calls.clear()
        with pytest.raises(ScheduleError):
            verify_rewritten(sched, wrong, topo)
        assert calls == [wrong], what


@register_pass
@dataclass(frozen=True)
class WrongMerge(Pass):
    """A merge that takes one slot too many (for tests)."""

    name = "test-wrong-merge"
    summary = "msccl-merge, then widen the first joined op by a slot (for tests)"

    def run(self, unit):
        merged = merge_ops(unit.schedule)
        i = _first_joined(merged)
        return replace(unit, schedule=_with_op(merged, i, replace(merged.ops[i], count=merged.ops[i].count + 1)))


def test_the_pass_manager_catches_a_wrong_merge_and_accepts_the_right_one():
    topo, sched = _ring("allreduce")
    unit = CompileUnit(topo, sched.collective, 1 << 20).with_verified(sched)  # as the driver hands it over
    with pytest.raises(ScheduleError):
        PassManager(parse_pipeline("test-wrong-merge")).run(unit)
    out = PassManager(parse_pipeline("msccl-merge")).run(unit)
    assert out.verified and len(out.schedule.ops) < len(sched.ops)


def test_columns_of_a_rewritten_schedule_copy_the_kept_ops_rows():
    """`OpColumns.derived` (rows of the ops a pass kept copied from the verified
    schedule's columns, the others read) equals reading every op."""
    import numpy as np

    import collc.frontend as fe
    from collc.backends.msccl_xml.merge import merge_ops
    from collc.verify.columns import OpColumns

    topo = fe.resolve_topology("ring(16)")
    sched = fe.instantiate_algorithm("ring", topo, fe.resolve_collective("allreduce", 16))
    merged = merge_ops(sched)
    kept = sum(1 for op in merged.ops if 0 <= op.id < len(sched.ops) and sched.ops[op.id] is op)
    assert 0 < kept < len(merged.ops)  # both kinds of rows
    derived = OpColumns.derived(merged.ops, sched.ops, OpColumns(sched.ops, {}), {})
    read = OpColumns(merged.ops, {})
    for name in ("ids", "step", "count", "kind_route", "src_rb", "src_idx", "dst_rb", "dst_idx", "ndeps", "deps"):
        assert np.array_equal(getattr(derived, name), getattr(read, name)), name
