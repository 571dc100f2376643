"""Every method on small topologies: verified schedules whose times the simulator confirms."""

import pytest

from collc.analysis.simulate import simulate
from collc.ir.collective import CollectiveKind, standard
from collc.synthesis.core import synthesize
from collc.synthesis.options import Method, SynthesisOptions
from topos import dgx1, ring, switch, two_chassis

COPY_KINDS = ["allgather", "alltoall", "broadcast", "gather", "scatter"]
TOPOLOGIES = {"ring4": lambda: ring(4), "switch4": lambda: switch(4), "twochassis": lambda: two_chassis(2)}


def run(topo, kind, method, size=1 << 20, **kw):
    coll = standard(kind, topo.num_ranks, 1, 0)
    # A few seconds at most: an exact MILP that needs longer returns its incumbent.
    opts = SynthesisOptions(method=Method(method), time_limit=kw.pop("time_limit", 2.0), progress=False, **kw)
    return synthesize(topo, coll, size, opts)


@pytest.mark.parametrize("topo_name", sorted(TOPOLOGIES))
@pytest.mark.parametrize("kind", COPY_KINDS)
@pytest.mark.parametrize("method", ["milp", "lp", "rounds", "steady", "greedy", "auto"])
def test_every_method_gives_a_verified_schedule_the_simulator_agrees_with(topo_name, kind, method):
    topo = TOPOLOGIES[topo_name]()
    res = run(topo, kind, method)  # synthesize() verifies before returning
    sim = simulate(res.schedule, topo, 1 << 20)
    assert sim.time_s == pytest.approx(res.estimate_s, rel=1e-9)
    assert res.schedule.collective.kind is CollectiveKind(kind)
    assert all(b.step < op.step for op in res.schedule.ops for b in res.schedule.ops if b.id in op.deps)
    note = res.note()
    assert note["status"] in ("optimal", "feasible", "time_limit")
    if method != "auto":
        assert note["method"] == method


def test_milp_finds_the_two_epoch_allgather_of_a_bidirectional_ring():
    res = run(ring(4), "allgather", "milp")
    assert res.status.value == "optimal" and res.epochs == 2
    # Ranks 1 and 3 each get rank 0's chunk directly; rank 2 gets it through one of them.
    transfers = [op for op in res.schedule.ops if op.is_transfer]
    assert len(transfers) == 12
    assert all(len(op.route) == 2 for op in transfers)


def test_switch_routes_are_written_on_the_ops():
    res = run(switch(4), "alltoall", "milp")
    for op in res.schedule.ops:
        if op.is_transfer:
            assert op.route == (f"g{op.src.rank}", "sw", f"g{op.dst.rank}")


def test_milp_on_dgx1_allgather_with_a_few_chunks_is_optimal_and_beats_the_ring():
    topo = dgx1()
    res = run(topo, "allgather", "milp", size=64 << 10, chunks=2)
    assert res.status.value == "optimal" and res.chunks == 2
    assert res.schedule.collective.chunks == 2 and res.schedule.collective.name == "allgather"
    ring_time = 7 * (0.7e-6 + (64 << 10) / 8 / 25e9)  # 7 hops of one chunk on single lanes
    assert res.estimate_s < ring_time


def test_steady_reaches_the_fluid_bound_on_dgx1_within_the_pipeline_fill():
    from collc.analysis.bounds import lower_bounds

    topo = dgx1()
    res = run(topo, "allgather", "steady", size=64 << 20, chunks=128)
    bound = lower_bounds(topo, standard("allgather", 8), 64 << 20).best_s
    assert res.facts["fluid_s"] == pytest.approx(bound, rel=1e-6)
    assert res.estimate_s < 1.05 * bound
    assert res.chunks == 128


def test_lp_relays_alltoall_through_the_chassis_link():
    res = run(two_chassis(2), "alltoall", "lp")
    relayed = [op for op in res.schedule.ops if op.dst.buffer.value == "s"]
    assert relayed, "chunks between the far GPUs of the two chassis must stop at a relay"
    assert len(res.schedule.scratch) == 4


def test_rounds_solve_windows_and_report_them():
    res = run(two_chassis(2), "allgather", "rounds", epochs=2)
    assert res.facts["rounds"] >= 2 and res.facts["round_epochs"] == 2


def test_auto_is_at_least_as_fast_as_each_method_it_could_pick():
    topo = two_chassis(2)
    auto = run(topo, "allgather", "auto", size=1 << 16)
    milp = run(topo, "allgather", "milp", size=1 << 16)
    assert auto.estimate_s <= milp.estimate_s * (1 + 1e-9)


def test_same_input_same_schedule():
    a = run(switch(4), "alltoall", "milp", seed=3)
    b = run(switch(4), "alltoall", "milp", seed=3)
    assert a.schedule.to_json() == b.schedule.to_json()
    # A limit the run never reaches: under a 2 s limit a loaded machine can fire the
    # safety net in one run and not the other (then the schedules may rightly differ).
    c = run(dgx1(), "allgather", "steady", size=16 << 20, chunks=8, time_limit=600.0)
    d = run(dgx1(), "allgather", "steady", size=16 << 20, chunks=8, time_limit=600.0)
    assert not c.facts["time_limit_fired"] and not d.facts["time_limit_fired"]
    assert c.schedule.ops == d.schedule.ops


def test_flow_rates_meet_the_cut_bound_for_alltoall_across_a_slow_link():
    from collc.analysis.bounds import lower_bounds

    topo = two_chassis(2)
    res = run(topo, "alltoall", "steady", size=64 << 20)
    bound = lower_bounds(topo, standard("alltoall", 4), 64 << 20).best_s
    assert res.facts["rate_model"] == "paths"
    assert res.facts["fluid_s"] == pytest.approx(bound, rel=1e-6)
    assert res.estimate_s < 1.02 * bound
