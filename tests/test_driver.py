"""The driver's schedule left unverified for `collc compile` to verify while it writes."""

from __future__ import annotations

from dataclasses import replace

from collc.driver import CompileJob, produce_schedule
from collc.frontend import resolve_topology
from collc.ir.collective import allgather, standard
from collc.synthesis import nodes
from rail_topologies import quad


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


def test_baselines_computed_early_give_the_report_computed_after():
    from collc import idle
    from collc.driver import baselines_for, make_report

    job = CompileJob(ring(4), allgather(4), 1 << 16)
    unit, solver = produce_schedule(job)
    early = idle.Deferred(lambda: baselines_for(job))
    early.run()
    assert make_report(job, unit, solver, "json", [], early_baselines=early) == make_report(job, unit, solver, "json", [])


def test_a_stdlib_algorithm_is_its_own_baseline_whatever_was_computed_early():
    from collc import idle
    from collc.driver import make_report

    job = CompileJob(ring(4), allgather(4), 1 << 16, algorithm="ring")
    unit, solver = produce_schedule(job)
    wrong = idle.Deferred(lambda: [])  # not asked for: the schedule is the ring baseline itself
    report = make_report(job, unit, solver, "json", [], early_baselines=wrong)
    assert report == make_report(job, unit, solver, "json", []) and report["baselines"]


def test_a_reducescatter_refused_over_nodes_is_asked_for_flat(monkeypatch, tmp_path):
    # The driver's retry after the lowering refuses a ReduceScatter that `auto` composed
    # over nodes: over_nodes=False asks for the flat composition; a user's nodes=on stays.
    monkeypatch.setattr(nodes, "reducescatter_wins", lambda n_nodes: True)
    topology = quad(tmp_path, nodes=2, sms=32)
    coll = standard("reducescatter", topology.num_ranks, 1)
    job = CompileJob(topology, coll, 1 << 20, pipeline="synthesize{chunks=1}")
    _, auto = produce_schedule(job)
    _, flat = produce_schedule(job, over_nodes=False)
    _, forced = produce_schedule(replace(job, pipeline="synthesize{chunks=1 nodes=on}"), over_nodes=False)
    assert "over_nodes" in auto and "over_nodes" not in flat and "over_nodes" in forced


def test_bounds_and_baselines_from_a_child_process_give_the_same_report(monkeypatch, tmp_path):
    """On large clusters the report's lower bounds and baselines are worked out in a
    child process while the schedule is made: the same report and schedule as here."""
    import json
    import os

    from collc import driver, parallel

    monkeypatch.setattr(parallel, "local_workers", lambda: 2)
    real = driver.request_figures
    where = tmp_path / "pids"

    def figures(job, with_baselines):
        with open(where, "a") as f:  # from the child: its list would not reach this process
            f.write(f"{os.getpid()}\n")
        return real(job, with_baselines)

    monkeypatch.setattr(driver, "request_figures", figures)
    job = CompileJob(resolve_topology("dgx_h100(nodes=2)"), allgather(16), 1 << 20)
    reports = {}
    for threshold in (16, 10_000):
        monkeypatch.setattr(driver, "FIGURES_IN_CHILD_RANKS", threshold)
        out = tmp_path / f"{threshold}.json"
        result = driver.compile_job_written_while_verified(job, "json", out)
        reports[threshold] = {k: v for k, v in result.report.items() if k not in ("solver", "outputs")}
        reports[threshold]["file"] = out.read_bytes()
    assert reports[16] == reports[10_000]
    assert reports[16]["baselines"] and reports[16]["lower_bounds"]["best_s"] > 0
    pids = where.read_text().split()
    assert len(pids) == 1 and int(pids[0]) != os.getpid()  # the first compile's, from a child
