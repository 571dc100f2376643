"""PyTorch's schedule CSV: the samples read, checked, timed and written back unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from collc.diagnostics import CollcError
from collc.pipeline import bubbles, checks
from collc.pipeline.csv_format import (
    ScheduleFileError, format_order, format_rows, parse_rows, read_schedule, to_order,
)
from collc.pipeline.schedules import Kind, build
from collc.pipeline.timeline import StageCosts, build_timeline

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "pipeline"
SAMPLES = sorted(DATA.glob("*.csv")) if DATA.is_dir() else []
needs_data = pytest.mark.skipif(not SAMPLES, reason="shared/data/pipeline is not beside the checkout")

# (ranks, stages, micro-batches, stage -> rank) of each sample, from its MANIFEST line.
EXPECTED = {
    "dualpipev_4rank_10mb.csv": (4, 8, 10, (0, 1, 2, 3, 3, 2, 1, 0)),
    "zb1p_2rank_2stagep_compute.csv": (2, 4, 8, (0, 1, 0, 1)),
    "zb1p_2rank_2stagep_comms.csv": (2, 4, 8, (0, 1, 0, 1)),
}


@needs_data
@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_sample_reads_checks_times_and_writes_back_identically(path: Path):
    text = path.read_text()
    assert format_rows(parse_rows(text, str(path))) == text
    order = read_schedule(path)
    assert (order.ranks, order.stages, order.microbatches, order.stage_rank) == EXPECTED[path.name]
    tl = build_timeline(order, StageCosts.uniform(order, 1.0, 2.0, 1.0))
    checks.check_timeline(tl)  # every stage's every micro-batch once, dependencies respected
    # Unit costs as PyTorch counts them (F = I = W = 1, B = 2) over v chunks per rank:
    # each rank computes 3 x micro-batches x 2 chunks units / 2 = 3 m units of rank time.
    for r in range(order.ranks):
        assert tl.busy_s(r) == pytest.approx(3.0 * order.microbatches)
    assert tl.step_s >= 3.0 * order.microbatches


@needs_data
def test_zero_bubble_samples_split_the_backward_and_dualpipev_overlaps():
    zb = read_schedule(DATA / "zb1p_2rank_2stagep_compute.csv")
    kinds = {a.kind for acts in zb.actions for a in acts}
    assert kinds == {Kind.F, Kind.I, Kind.W}  # B followed by W is the input-gradient half
    comms = read_schedule(DATA / "zb1p_2rank_2stagep_comms.csv")
    # BW fused on stages 0 and 2, B + W on 1 and 3; SEND/RECV are left to the model.
    assert {(a.stage % 2, a.kind) for acts in comms.actions for a in acts if a.kind is not Kind.F} == {
        (0, Kind.B), (1, Kind.I), (1, Kind.W)}
    dual = read_schedule(DATA / "dualpipev_4rank_10mb.csv")
    first = dual.actions[0]
    # (0F7;7B3)OVERLAP_F_B runs the forward then the backward on rank 0's stream.
    i = [str(a) for a in first].index("0F7")
    assert str(first[i + 1]) == "7B3"


@needs_data
def test_dualpipev_has_fewer_bubbles_than_1f1b_on_the_same_ranks():
    dual = read_schedule(DATA / "dualpipev_4rank_10mb.csv")
    tl = build_timeline(dual, StageCosts.uniform(dual, 1.0, 2.0, 1.0))
    ref = build(kind="1f1b", ranks=4, microbatches=10)
    tl_ref = build_timeline(ref, StageCosts.uniform(ref, 1.0, 2.0, 1.0))
    assert tl.step_s < tl_ref.step_s
    assert max(r["bubble_fraction"] for r in [bubbles.stage_report(tl, r, [r], None) for r in range(4)]) < \
        (4 - 1) / (10 + 4 - 1)


@pytest.mark.parametrize("kind,chunks", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)])
def test_collc_schedules_round_trip_through_csv(kind, chunks):
    order = build(kind, 4, 8, chunks)
    text = format_order(order)
    back = to_order(parse_rows(text, "<csv>"), "<csv>", order.name)
    assert back.actions == order.actions and back.stage_rank == order.stage_rank
    assert text.count("\n") == 4 and "," in text


def test_bad_cells_are_located_by_row_and_column():
    with pytest.raises(ScheduleFileError) as err:
        parse_rows("0F0,0F1\n1F0,1X0\n", "s.csv")
    assert (err.value.span.line, err.value.span.column) == (2, 5)
    assert "1X0" in err.value.message
    with pytest.raises(ScheduleFileError, match="no micro-batch"):
        parse_rows("0F\n", "s.csv")


def test_inconsistent_files_are_rejected():
    with pytest.raises(ScheduleFileError, match="stage 0 appears on rank 0 and rank 1"):
        to_order(parse_rows("0F0,0B0\n0F1\n", "s.csv"), "s.csv", "s")
    with pytest.raises(ScheduleFileError, match="stage 1 never runs"):
        to_order(parse_rows("0F0,0B0\n2F0,2B0\n", "s.csv"), "s.csv", "s")
    with pytest.raises(CollcError, match="has 2 rows"):
        to_order(parse_rows("0F0,0B0\n1F0,1B0\n", "s.csv"), "s.csv", "s", ranks=4)
    with pytest.raises(CollcError, match="runs 1 micro-batches but the pipeline has 3"):
        to_order(parse_rows("0F0,0B0\n1F0,1B0\n", "s.csv"), "s.csv", "s", microbatches=3)
    # Read fine, but the timeline check finds micro-batch 1 missing its backward.
    order = to_order(parse_rows("0F0,0F1,0B0\n1F0,1B0,1F1,1B1\n", "s.csv"), "s.csv", "s")
    with pytest.raises(checks.TimelineError, match="needs one backward"):
        checks.check_timeline(build_timeline(order, StageCosts.uniform(order, 1.0, 1.0)))
