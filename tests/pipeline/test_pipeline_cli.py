"""`collc pipeline` and `collc bubbles` end to end, and `collc bubbles` on the Kineto
samples, against values worked out from the traces by hand (plain gzip + json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collc.cli import main
from collc.pipeline.measured import measure

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pipeline_dgx1.coll"
TRACES = ROOT / ".." / "shared" / "data" / "traces"
RANK0 = TRACES / "hta__trace_filter__sampled_rank-0.json.gz"
RANK1 = TRACES / "hta__trace_filter__sampled_rank-1.json.gz"
MEMORY = TRACES / "hta__df_index_resolver__df_index_resolver.json.gz"
needs_traces = pytest.mark.skipif(not RANK0.exists(), reason="shared/data/traces is not beside the checkout")

REPORT_KEYS = {"kind", "step_us", "stages"}
STAGE_KEYS = {"stage", "ranks", "busy_us", "bubble_fraction", "bubbles"}
BUBBLE_KEYS = {"start_us", "end_us", "duration_us", "cause", "free_bytes"}
CAUSES = {"warmup", "cooldown", "transfer", "gradient", "unknown"}


def _check_contract(report: dict) -> None:
    """The fields other tools read from a bubble report."""
    assert REPORT_KEYS <= set(report) and report["kind"] in ("predicted", "measured")
    for s in report["stages"]:
        assert STAGE_KEYS <= set(s)
        assert all(isinstance(r, int) for r in s["ranks"])
        assert 0.0 <= s["bubble_fraction"] <= 1.0
        for b in s["bubbles"]:
            assert BUBBLE_KEYS <= set(b) and b["cause"] in CAUSES
            assert b["end_us"] - b["start_us"] == pytest.approx(b["duration_us"])
            assert 0.0 <= b["start_us"] <= b["end_us"] <= report["step_us"] * (1 + 1e-12)
            assert b["free_bytes"] is None or isinstance(b["free_bytes"], int)


def test_collc_pipeline_writes_report_trace_plot_and_csv(tmp_path, capsys):
    out = {k: tmp_path / n for k, n in (("r", "r.json"), ("t", "t.json"), ("p", "p.svg"), ("c", "s.csv"))}
    rc = main(["pipeline", str(EXAMPLE), "--report", str(out["r"]), "--trace", str(out["t"]), "--plot",
               str(out["p"]), "--schedule-csv", str(out["c"])])
    assert rc == 0
    text = capsys.readouterr().out
    assert "4 stages x 2 data-parallel" in text and "bubbles" in text
    report = json.loads(out["r"].read_text())
    _check_contract(report)
    assert report["kind"] == "predicted" and len(report["stages"]) == 4
    assert report["stages"][0]["ranks"] == [0, 4]
    grad = report["gradient"]
    assert grad["data_parallel"] == 2 and len(grad["baseline_us"]) == 4 and "step_us_with_synthesized" in grad
    # The step ends with the slowest rank's gradient collective.
    assert report["step_us"] == pytest.approx(grad["step_us_with_baseline"])
    assert report["stages"][3]["bubbles"][0]["cause"] in ("warmup", "transfer")
    assert any(b["cause"] == "gradient" for b in report["stages"][0]["bubbles"])
    assert all(b["free_bytes"] > 0 for s in report["stages"] for b in s["bubbles"])
    trace = json.loads(out["t"].read_text())
    names = {e["name"] for e in trace["traceEvents"]}
    assert "0F0" in names and any(n.startswith("bubble (") for n in names)
    assert out["p"].read_text().lstrip().startswith("<?xml")
    assert out["c"].read_text().splitlines()[0].startswith("0F0,0F1,0F2,0F3,0B0")


def test_errors_exit_1_with_a_location_and_usage_errors_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.coll"
    bad.write_text(EXAMPLE.read_text().replace("{{0, 4}, {1, 5}, {2, 6}, {3, 7}}", "{{0, 4}, {1, 5}, {2, 6}, {3, 17}}"))
    report = tmp_path / "r.json"
    assert main(["pipeline", str(bad), "--report", str(report)]) == 1
    err = capsys.readouterr().err
    assert "bad.coll:7:" in err and "has no GPU 17" in err and "Traceback" not in err
    assert not report.exists()  # nothing written when it fails
    assert main(["pipeline", str(EXAMPLE), "--plot", str(tmp_path / "p.txt")]) == 2
    assert main(["bubbles", str(tmp_path / "none.json.gz")]) == 1


@needs_traces
def test_collc_bubbles_on_two_ranks_of_a_kineto_job(tmp_path):
    m = measure([RANK0, RANK1], threshold_us=100.0)
    report = m.report
    _check_contract(report)
    # By hand: the earliest kernel of either rank starts at 1682725898082228 us and the
    # last ends at 1682725899313563 us.
    assert report["step_us"] == 1231335.0
    r0, r1 = report["stages"]
    assert (r0["ranks"], r1["ranks"]) == ([0], [1])
    # Union of non-NCCL kernels: 210320 us on rank 0, 271973 us on rank 1.
    assert (r0["busy_us"], r1["busy_us"]) == (210320.0, 271973.0)
    # Gaps longer than 100 us: 467 and 471; the longest on rank 0 starts 658841 us into the
    # step and lasts 67861 us, covered by a SendRecv kernel.
    assert (len(r0["bubbles"]), len(r1["bubbles"])) == (467, 471)
    longest = max(r0["bubbles"], key=lambda b: b["duration_us"])
    assert (longest["start_us"], longest["duration_us"]) == (658841.0, 67861.0)
    assert longest["cause"] == "transfer" and "SendRecv" in longest["waiting_on"]
    assert r0["bubble_fraction"] == pytest.approx(1 - 210320.0 / 1231335.0)
    assert r1["bubbles"][0] == pytest.approx({**r1["bubbles"][0], "start_us": 0.0, "end_us": 153.0})


@needs_traces
def test_collc_bubbles_reads_free_memory_from_memory_events(tmp_path, capsys):
    out = tmp_path / "m.json"
    assert main(["bubbles", str(MEMORY), "--threshold-us", "1000", "--report", str(out),
                 "--plot", str(tmp_path / "m.png")]) == 0
    report = json.loads(out.read_text())
    (stage,) = report["stages"]
    assert stage["ranks"] == [1] and stage["device"] == 1 and len(stage["bubbles"]) == 73
    longest = max(stage["bubbles"], key=lambda b: b["duration_us"])
    # By hand: the gap from 587183 us to 608873 us, 11896 us of it under AllReduce kernels;
    # device 1 has 34089730048 bytes and the allocator held at most 12782141440 then.
    assert (longest["start_us"], longest["end_us"]) == (587183.0, 608873.0)
    assert longest["cause"] == "gradient" and longest["nccl_covered_us"] == 11896.0
    assert longest["free_bytes"] == 34089730048 - 12782141440
    assert (tmp_path / "m.png").read_bytes()[:4] == b"\x89PNG"


def test_pipeline_keeps_freed_memory_for_reuse(tmp_path, allocator_calls, capsys):
    # Asked once, before the timeline's arrays (tests/test_memory.py checks what the call does).
    assert main(["pipeline", str(EXAMPLE), "--no-synthesis", "--report", str(tmp_path / "r.json")]) == 0
    assert allocator_calls == ["reuse_freed_memory"]
