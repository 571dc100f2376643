"""The synthesize pass: options, notes, time limits, infeasible requests, custom demands."""

import io

import pytest

from collc.synthesis.problem import refine

from collc.diagnostics import CollcError, SolverError
from collc.ir.collective import ChunkId, Collective, CollectiveKind, allgather, alltoall, standard
from collc.passes import CompileUnit, PassManager, PipelineError, parse_pipeline
from collc.synthesis.progress import Progress
from collc.verify import verify
from topos import dgx1, disconnected, ring, switch, two_chassis


def compile_with(text, topo, coll, size=1 << 20):
    return PassManager.from_text(text).run(CompileUnit(topo, coll, size))


def test_pass_is_registered_with_typed_options():
    (p,) = parse_pipeline("synthesize{method=milp chunks=2 time_limit=5 mip_gap=0.1 seed=3 progress=false}")
    assert (p.method, p.chunks, p.time_limit, p.mip_gap, p.seed, p.progress) == ("milp", 2, 5.0, 0.1, 3, False)
    assert p.spec() == "synthesize{method=milp chunks=2 time_limit=5.0 mip_gap=0.1 seed=3 progress=false}"


@pytest.mark.parametrize("text,message", [
    ("synthesize{method=magic}", "no method 'magic'"),
    ("synthesize{time_limit=0}", "time_limit must be positive"),
    ("synthesize{chunks=-1}", "must not be negative"),
])
def test_bad_options_are_pipeline_errors(text, message):
    with pytest.raises(PipelineError, match=message):
        parse_pipeline(text)


def test_pass_sets_schedule_and_note():
    unit = compile_with("synthesize{method=milp progress=false},verify", switch(4), allgather(4))
    note = unit.notes["synthesize"]
    assert note["method"] == "milp" and note["status"] == "optimal" and note["optimal"] is True
    assert note["epochs"] >= 1 and note["variables"] > 0 and note["constraints"] > 0 and note["chunks"] == 1
    assert note["seconds"] >= 0
    assert unit.notes["verify"]["ok"] is True
    verify(unit.schedule, unit.topology)


def test_pass_told_not_to_verify_leaves_it_to_the_manager_or_the_caller():
    unverified = PassManager.from_text("synthesize{progress=false verify=false}", verify_between=False).run(
        CompileUnit(ring(4), allgather(4), 1 << 16))
    assert unverified.schedule is not None and not unverified.verified
    checked = compile_with("synthesize{progress=false verify=false}", ring(4), allgather(4), 1 << 16)
    assert checked.verified  # the manager verified it after the pass
    assert checked.schedule.ops == unverified.schedule.ops


def test_chunks_option_refines_the_collective_but_keeps_its_identity():
    coll = allgather(4)
    unit = compile_with("synthesize{method=steady chunks=4 progress=false}", ring(4), coll)
    fine = unit.schedule.collective
    assert (fine.name, fine.kind, fine.chunks, fine.ranks) == (coll.name, coll.kind, 4, 4)
    assert unit.notes["synthesize"]["chunks"] == 4


def test_chunks_must_divide_evenly():
    with pytest.raises(CollcError, match="use a multiple of 2"):
        compile_with("synthesize{method=milp chunks=3 progress=false}", ring(4), allgather(4, 2))


def test_expiring_time_limit_returns_the_best_schedule_found_verified():
    # 4 chunks per GPU on DGX-1 takes HiGHS seconds to prove optimal; 0.3 s is not enough.
    unit = compile_with("synthesize{method=milp chunks=4 time_limit=0.3 progress=false}", dgx1(), allgather(8),
                        size=1 << 24)
    note = unit.notes["synthesize"]
    assert note["status"] == "time_limit" and note["optimal"] is False
    verify(unit.schedule, unit.topology)


def test_fixed_horizon_too_short_is_a_solver_error():
    with pytest.raises(SolverError, match=r"the MILP over 1 epochs of [\d.]+ us is infeasible"):
        compile_with("synthesize{method=milp epochs=1 progress=false}", ring(4), allgather(4))


def test_disconnected_gpus_are_refused_before_solving():
    with pytest.raises(SolverError, match="has no path of links"):
        compile_with("synthesize{progress=false}", disconnected(4), alltoall(4))


def test_custom_demands_are_synthesized_split_like_the_standard_ones():
    one = lambda r, i: frozenset({ChunkId(r, i)})
    inputs = tuple((one(r, 0),) for r in range(4))
    # Rank 0's chunk to ranks 2 and 3; rank 3's chunk to rank 1; rank 1 keeps its own.
    outputs = ((None, None), (one(3, 0), one(1, 0)), (one(0, 0), None), (one(0, 0), None))
    coll = Collective("mine", CollectiveKind.CUSTOM, 4, 1, inputs, outputs)
    unit = compile_with("synthesize{progress=false},verify", two_chassis(2), coll)
    assert unit.schedule.collective == refine(coll, unit.schedule.collective.chunks)
    transfers = [op for op in unit.schedule.ops if op.is_transfer]
    assert {op.dst.rank for op in transfers} >= {1, 2, 3}


def test_custom_chunks_split_as_asked():
    one = lambda r, i: frozenset({ChunkId(r, i)})
    coll = Collective("mine", CollectiveKind.CUSTOM, 2, 1, ((one(0, 0),), (one(1, 0),)), ((None,), (one(0, 0),)))
    unit = compile_with("synthesize{chunks=2 progress=false},verify", switch(2), coll)
    assert unit.schedule.collective.chunks == 2 and unit.schedule.collective == refine(coll, 2)
    two = Collective("two", CollectiveKind.CUSTOM, 2, 2, ((one(0, 0), one(0, 1)), ()), ((), (one(0, 0), one(0, 1))))
    with pytest.raises(CollcError, match="multiple of 2"):
        compile_with("synthesize{chunks=3 progress=false}", switch(2), two)


def test_progress_stays_silent_off_a_terminal():
    out = io.StringIO()
    p = Progress(True, stream=out, delay=0.0)
    p.stage("milp: trying 3 epochs")
    p.solver(incumbent=12.0, bound=14.0, gap=0.1)
    p.close()
    assert out.getvalue() == "" and not p.enabled
    assert "milp: trying 3 epochs" in p.line() and "gap 10.00%" in p.line() and "bound 14" in p.line()


def test_progress_draws_on_a_terminal_after_the_delay():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    p = Progress(True, stream=out, delay=0.0)
    p.stage("steady: tree packing")
    import time

    time.sleep(0.6)
    p.close()
    assert "steady: tree packing" in out.getvalue()
