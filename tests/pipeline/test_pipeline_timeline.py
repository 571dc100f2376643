"""Schedules and timelines: textbook bubble fractions, ZB-H1 against 1F1B, memory,
and the timeline rules (each one broken on purpose)."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collc.diagnostics import CollcError
from collc.ir.pipeline import MemoryModel
from collc.pipeline import bubbles, checks
from collc.pipeline import timeline as timeline_mod
from collc.pipeline.schedules import Action, Kind, ScheduleOrder, build, gpipe, interleaved, one_f_one_b, zb_h1
from collc.pipeline.timeline import EventColumns, ScheduleDeadlock, StageCosts, Timeline, build_timeline

costs = st.floats(min_value=0.1, max_value=10.0, allow_nan=False)


def _fractions(order: ScheduleOrder, tf: float, tb: float, tw: float | None = None) -> tuple[Timeline, list[float]]:
    tl = build_timeline(order, StageCosts.uniform(order, tf, tb, tw))
    checks.check_timeline(tl)
    return tl, [(tl.step_s - tl.busy_s(r)) / tl.step_s for r in range(order.ranks)]


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 12), m=st.integers(1, 40), tf=costs, tb=costs, kind=st.sampled_from(["gpipe", "1f1b"]))
def test_gpipe_and_1f1b_match_the_textbook_fraction(p, m, tf, tb, kind):
    tl, fractions = _fractions(build(kind, p, m), tf, tb)
    expected = (p - 1) / (m + p - 1)
    assert fractions == pytest.approx([expected] * p, rel=1e-9, abs=1e-12)
    assert tl.step_s == pytest.approx((m + p - 1) * (tf + tb), rel=1e-9)
    report = [bubbles.stage_report(tl, r, [r], None) for r in range(p)]
    # Megatron's convention: idle relative to ideal compute, (p - 1) / m.
    assert report[0]["bubble_fraction_of_ideal"] == pytest.approx((p - 1) / m, rel=1e-9, abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(p=st.integers(2, 8), k=st.integers(1, 5), v=st.integers(2, 4), tf=costs, tb=costs)
def test_interleaved_matches_the_textbook_fraction(p, k, v, tf, tb):
    m = k * p
    _, fractions = _fractions(interleaved(p, m, v), tf, tb)
    assert fractions == pytest.approx([(p - 1) / (v * m + p - 1)] * p, rel=1e-9)


def test_interleaved_needs_whole_groups_of_micro_batches():
    with pytest.raises(CollcError, match="multiple of the stages"):
        interleaved(4, 6, 2)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 24), (6, 7), (4, 3)])
def test_zb_h1_has_fewer_bubbles_than_1f1b_with_the_same_memory(p, m):
    tf, tb = 1.0, 2.0  # F = I = W, the costs the zero-bubble paper assumes
    zb_tl, zb = _fractions(zb_h1(p, m), tf, tb, tw=1.0)
    f1_tl, f1 = _fractions(one_f_one_b(p, m), tf, tb)
    assert max(zb) < min(f1)
    if m >= p:
        # Each rank idles p - 1 units (a third of 1F1B's 3(p - 1)) in a step of 3m + p - 1:
        # the paper's ZB-H1 figure (11% at p = 4, m = 8, against 1F1B's 27%).
        assert zb == pytest.approx([(p - 1) / (3 * m + p - 1)] * p, rel=1e-9)
    # The same peak memory as 1F1B: the paper bounds the largest in-flight count over
    # all ranks (p micro-batches, 1F1B's first rank), not each rank's own.
    assert max(bubbles.peak_in_flight(zb_tl, r) for r in range(p)) == \
        max(bubbles.peak_in_flight(f1_tl, r) for r in range(p))
    assert zb_h1(p, m).splits_backward


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 8), m=st.integers(2, 30))
def test_1f1b_keeps_fewer_activations_than_gpipe(p, m):
    g = build_timeline(gpipe(p, m), StageCosts.uniform(gpipe(p, m), 1.0, 2.0))
    o = build_timeline(one_f_one_b(p, m), StageCosts.uniform(one_f_one_b(p, m), 1.0, 2.0))
    peaks_g = [bubbles.peak_in_flight(g, r) for r in range(p)]
    peaks_o = [bubbles.peak_in_flight(o, r) for r in range(p)]
    assert peaks_g == [m] * p  # GPipe holds every micro-batch until its backward
    assert peaks_o == [min(p - r, m) for r in range(p)]
    assert max(peaks_o) <= max(peaks_g)
    if m > 1:
        assert sum(peaks_o) < sum(peaks_g)


# --- causes and free memory ------------------------------------------------------

def test_causes_of_a_1f1b_step_with_transfers_and_a_gradient_collective():
    order = one_f_one_b(4, 8)
    tl = build_timeline(order, StageCosts.uniform(order, 1.0, 2.0, transfer=0.0, gradient=5.0))
    last = [bubbles.rank_bubbles(tl, r) for r in range(4)]
    # Rank 3 starts after three forwards: a warm-up bubble of 3 time units.
    assert (last[3][0].start, last[3][0].end, last[3][0].cause) == (0.0, 3.0, "warmup")
    # Every rank ends with its gradient collective (5 units), then waits for the step's end.
    for r in range(4):
        grad = [b for b in last[r] if b.cause == "gradient"]
        assert len(grad) == 1 and grad[0].duration == pytest.approx(5.0)
    assert tl.step_s == pytest.approx((8 + 3) * 3.0 + 5.0)
    assert last[3][-1].cause == "cooldown" and last[3][-1].end == pytest.approx(tl.step_s)


def test_slow_transfers_show_as_transfer_bubbles():
    order = one_f_one_b(3, 4)
    tl = build_timeline(order, StageCosts.uniform(order, 1.0, 2.0, transfer=4.0))
    checks.check_timeline(tl)
    first = bubbles.rank_bubbles(tl, 1)[0]
    # Rank 1's first forward waits 1 unit for rank 0's forward and 4 for the transfer:
    # mostly a transfer.
    assert (first.start, first.end, first.cause) == (0.0, 5.0, "transfer")
    assert first.waiting_on == "0F0 (rank 0)"
    # With free transfers the same wait is the pipeline filling.
    free = build_timeline(order, StageCosts.uniform(order, 1.0, 2.0))
    assert [(b.start, b.end, b.cause) for b in bubbles.rank_bubbles(free, 1)][0] == (0.0, 1.0, "warmup")


def test_free_memory_during_bubbles_follows_the_memory_model():
    order = one_f_one_b(2, 3)
    tl = build_timeline(order, StageCosts.uniform(order, 1.0, 2.0))
    gib = 2 ** 30
    mem = MemoryModel(16 * gib, (2 * gib, 2 * gib), (gib, gib), (4 * gib, 4 * gib), (gib, 3 * gib))
    # Rank 0: F0 F1 (2 in flight) then waits for rank 1's B0: free = 16 - 7 - 2 x 1 GiB.
    b0 = bubbles.rank_bubbles(tl, 0, mem)[0]
    assert (b0.start, b0.end) == (2.0, 4.0)
    assert b0.free_bytes == 7 * gib
    # Rank 1 waits for F0 before anything is in flight: 16 - 7 GiB free.
    b1 = bubbles.rank_bubbles(tl, 1, mem)[0]
    assert (b1.start, b1.end, b1.free_bytes) == (0.0, 1.0, 9 * gib)


# --- the timeline's rules, each broken ---------------------------------------------

@pytest.fixture
def timeline() -> Timeline:
    order = one_f_one_b(3, 4)
    return build_timeline(order, StageCosts.uniform(order, 1.0, 2.0, transfer=0.5, gradient=1.0))


def _with_events(tl: Timeline, compute) -> Timeline:
    """`tl` running the event objects `compute` (per rank) instead of its own."""
    return dataclasses.replace(tl, events=EventColumns.of_events(compute))


def _replace_event(tl: Timeline, rank: int, index: int, **changes) -> Timeline:
    events = list(tl.compute[rank])
    events[index] = dataclasses.replace(events[index], **changes)
    compute = list(tl.compute)
    compute[rank] = tuple(events)
    return _with_events(tl, compute)


def test_a_built_timeline_passes_every_check(timeline):
    checks.check_timeline(timeline)


def test_two_things_at_once_on_one_rank_fail(timeline):
    e = timeline.compute[0][1]
    bad = _replace_event(timeline, 0, 1, start=e.start - 0.5, end=e.end - 0.5)
    with pytest.raises(checks.TimelineError, match="at once"):
        checks.check_one_stream(bad)


def test_running_out_of_the_schedule_order_fails(timeline):
    events = list(timeline.compute[2])
    events[0], events[1] = events[1], events[0]
    bad = _with_events(timeline, (timeline.compute[0], timeline.compute[1], tuple(events)))
    with pytest.raises(checks.TimelineError, match="order"):
        checks.check_one_stream(bad)


def test_a_dependency_not_respected_fails(timeline):
    # Rank 1's first forward moved to before rank 0's activation arrives.
    bad = _replace_event(timeline, 1, 0, start=0.2, end=1.2)
    with pytest.raises(checks.TimelineError, match="before the previous stage's forward"):
        checks.check_dependencies(bad)


def test_a_backward_before_the_next_stages_gradient_fails(timeline):
    events = timeline.compute[0]
    i = next(i for i, e in enumerate(events) if e.action.kind is Kind.B)
    bad = _replace_event(timeline, 0, i, start=events[i - 1].end, end=events[i - 1].end + 2.0)
    with pytest.raises(checks.TimelineError, match="next stage's input gradient"):
        checks.check_dependencies(bad)


def test_a_missing_or_repeated_micro_batch_fails(timeline):
    dropped = _with_events(timeline, (timeline.compute[0][:-1], *timeline.compute[1:]))
    with pytest.raises(checks.TimelineError, match="needs one backward"):
        checks.check_complete(dropped)
    first = timeline.compute[1][0]
    twice = _replace_event(timeline, 1, 1, action=first.action)
    with pytest.raises(checks.TimelineError, match="runs 2 times"):
        checks.check_complete(twice)


def test_an_action_on_the_wrong_rank_fails(timeline):
    e = timeline.compute[0][0]
    moved = _with_events(timeline, (timeline.compute[0][1:], (e, *timeline.compute[1]), timeline.compute[2]))
    with pytest.raises(checks.TimelineError, match="held by rank 0"):
        checks.check_complete(moved)


def test_events_past_the_step_end_fail(timeline):
    with pytest.raises(checks.TimelineError, match="outside the step"):
        checks.check_step(dataclasses.replace(timeline, step_s=timeline.step_s - 1.5))


def test_an_order_that_waits_on_itself_deadlocks():
    acts = ((Action(0, Kind.B, 0), Action(0, Kind.F, 0)),)
    order = ScheduleOrder.of_actions("bad", 1, 1, 1, (0,), acts)
    with pytest.raises(ScheduleDeadlock, match="rank 0 at 0B0"):
        build_timeline(order, StageCosts.uniform(order, 1.0, 1.0))


def test_large_pipelines_build_quickly():
    # The benchmark (bench/bench_pipeline.py) times 64 x 512 x 2; a quarter of it here.
    order = interleaved(32, 256, 2)
    tl = build_timeline(order, StageCosts.uniform(order, 1.0, 2.0))
    assert tl.step_s == pytest.approx((2 * 256 + 31) * 3.0 / 2)


# --- the two engines ---------------------------------------------------------------

EVENT_FIELDS = ("start", "end", "input_stage", "input_kind", "input_microbatch", "input_ready", "input_produced")


def _uneven_costs(order: ScheduleOrder, seed: int) -> StageCosts:
    """Stages of unequal cost and transfers, some of them zero (ties between inputs)."""
    rng = random.Random(seed)
    s = order.stages

    def draw(count: int, zero_share: float = 0.0) -> tuple[float, ...]:
        return tuple(0.0 if rng.random() < zero_share else rng.choice([0.5, 1.0, rng.uniform(0.1, 3.0)])
                     for _ in range(count))

    forward, weight = draw(s), draw(s)
    backward = tuple(f * 2 for f in forward)
    return StageCosts(forward, backward, tuple(b - w for b, w in zip(backward, weight)), weight, draw(s - 1, 0.3),
                      draw(s - 1, 0.3), draw(order.ranks, 0.5))


@pytest.mark.parametrize("order", [one_f_one_b(5, 9), gpipe(4, 6), interleaved(3, 6, 3), zb_h1(6, 10),
                                   one_f_one_b(1, 4), one_f_one_b(7, 2)], ids=lambda o: f"{o.name}-{o.ranks}")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_wavefront_gives_the_event_loops_timeline_bit_for_bit(order, seed):
    costs = _uneven_costs(order, seed)
    loop = build_timeline(order, costs, engine="loop")
    wave = build_timeline(order, costs, engine="wavefront")
    for field in EVENT_FIELDS:
        assert np.array_equal(getattr(loop.events, field), getattr(wave.events, field)), field
    assert (loop.step_s, loop.collectives) == (wave.step_s, wave.collectives)
    assert loop.transfers == wave.transfers


def test_orders_the_wavefront_cannot_run_get_the_event_loops_errors():
    twice = ScheduleOrder.of_actions("twice", 1, 1, 2, (0,), ((Action(0, Kind.F, 0), Action(0, Kind.F, 0)),))
    with pytest.raises(CollcError, match="runs 0F0 twice"):
        build_timeline(twice, StageCosts.uniform(twice, 1.0, 1.0), engine="wavefront")
    waits = ScheduleOrder.of_actions("bad", 1, 1, 1, (0,), ((Action(0, Kind.B, 0), Action(0, Kind.F, 0)),))
    with pytest.raises(ScheduleDeadlock, match="rank 0 at 0B0"):
        build_timeline(waits, StageCosts.uniform(waits, 1.0, 1.0), engine="wavefront")


def test_wide_pipelines_run_by_wavefront():
    order = one_f_one_b(128, 128)  # 32,768 actions in about 512 rounds
    tl = build_timeline(order, StageCosts.uniform(order, 1.0, 2.0))
    assert tl.step_s == pytest.approx((128 + 127) * 3.0)
    assert timeline_mod.wide_enough(order) and not timeline_mod.wide_enough(one_f_one_b(8, 64))


@pytest.mark.parametrize("order", [one_f_one_b(3, 4), interleaved(2, 4, 2), zb_h1(3, 5)], ids=lambda o: o.name)
def test_the_trace_from_columns_is_the_trace_of_the_lanes(order, tmp_path):
    from collc.pipeline import render

    tl = build_timeline(order, _uneven_costs(order, 4))
    mem = MemoryModel(16 * 2**30, (2**30,) * order.ranks, (2**29,) * order.ranks, (0,) * order.ranks,
                      (2**28,) * order.ranks)
    report = {"stages": [{"ranks": [r, r + 4], **bubbles.stage_report(tl, r, [r], mem)} for r in range(order.ranks)],
              "gradient": {"collective": "allreduce"}}
    render.write_trace(tmp_path / "lanes.json", render.lanes_from_prediction(tl, report), "a \u00e9 title")
    render.write_prediction_trace(tmp_path / "columns.json", tl, report, "a \u00e9 title")
    assert (tmp_path / "columns.json").read_bytes() == (tmp_path / "lanes.json").read_bytes()
