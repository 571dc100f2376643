"""The bubble report loader: the pipeline report format, located errors."""

from __future__ import annotations

import json

import pytest

from collc.diagnostics import CollcError
from collc.harvest.report import load_report, parse_report

GOOD = """{
  "kind": "predicted", "step_us": 1000.0, "schedule": "1f1b", "extra": [1, 2],
  "stages": [
    {"stage": 1, "ranks": [1], "busy_us": 600.0, "bubble_fraction": 0.4,
     "bubbles": [
       {"start_us": 700.0, "end_us": 1000.0, "duration_us": 300.0, "cause": "cooldown",
        "free_bytes": 2048},
       {"start_us": 0.0, "end_us": 100.0, "duration_us": 100.0, "cause": "warmup",
        "free_bytes": null}
     ]},
    {"stage": 0, "ranks": [0], "busy_us": 900.0, "bubbles": []}
  ]
}"""


def test_reads_the_pipeline_report_format_and_ignores_unknown_fields():
    report = parse_report(GOOD, "r.json")
    assert report.kind == "predicted" and report.step_s == pytest.approx(1e-3)
    stage = report.stage(1)
    assert [(b.start_s, b.end_s, b.cause) for b in stage.bubbles] == [
        (0.0, 1e-4, "warmup"), (7e-4, 1e-3, "cooldown")]          # sorted by start
    assert stage.min_free_bytes == 2048
    assert report.bubble_seconds(1) == pytest.approx(4e-4)
    assert report.stage(0).bubbles == () and report.stage(0).min_free_bytes is None


def _error(text: str) -> CollcError:
    with pytest.raises(CollcError) as info:
        parse_report(text, "bad.json")
    return info.value


def test_a_bad_bubble_is_located_at_its_object():
    text = GOOD.replace('"end_us": 100.0', '"end_us": -5')
    err = _error(text)
    assert "stages[0].bubbles[1]" in err.message and "end_us" in err.message
    assert (err.span.file, err.span.line) == ("bad.json", 8)
    assert text.splitlines()[7][err.span.column - 1] == "{"


@pytest.mark.parametrize("change, words", [
    (('"cause": "warmup"', '"cause": "lunch"'), "cause"),
    (('"start_us": 700.0, "end_us": 1000.0', '"start_us": 700.0, "end_us": 600.0'),
     "before start_us"),
    (('"end_us": 1000.0', '"end_us": 1500.0'), "after the step's end"),
    (('"start_us": 700.0', '"start_us": 50.0'), "overlap"),
    (('"kind": "predicted"', '"kind": "guessed"'), "'kind'"),
    (('"stage": 0,', '"stage": "zero",'), "'stage' must be a number"),
])
def test_inconsistent_reports_are_refused(change, words):
    assert words in _error(GOOD.replace(*change)).message


def test_syntax_errors_have_line_and_column(tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"kind": "measured",\n "step_us": 10,,}')
    with pytest.raises(CollcError) as info:
        load_report(path)
    assert info.value.span.line == 2 and "not valid JSON" in info.value.message
    with pytest.raises(CollcError, match="cannot read"):
        load_report(tmp_path / "missing.json")
    assert "no stage 7" in _error_of(lambda: parse_report(GOOD).stage(7))


def _error_of(fn) -> str:
    with pytest.raises(CollcError) as info:
        fn()
    return info.value.message


def test_report_from_json_dumps_round_trip():
    data = json.loads(GOOD)
    report = parse_report(json.dumps(data))
    assert len(report.stages) == 2


def test_reads_the_report_collc_pipeline_writes(tmp_path):
    """The loader against the real producer: `collc pipeline --report` on the example."""
    from pathlib import Path

    from collc.cli import main
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "report.json"
    assert main(["pipeline", str(root / "examples" / "pipeline_dgx1.coll"), "--report",
                 str(out), "--no-synthesis"]) == 0
    raw = json.loads(out.read_text())
    report = load_report(out)
    assert report.kind == "predicted" and len(report.stages) == 4
    for stage, raw_stage in zip(sorted(report.stages, key=lambda s: s.stage),
                                sorted(raw["stages"], key=lambda s: s["stage"])):
        bubbles = stage.bubbles
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(bubbles, bubbles[1:]))
        assert len(bubbles) == len(raw_stage["bubbles"])
        assert report.bubble_seconds(stage.stage) / report.step_s == pytest.approx(
            raw_stage["bubble_fraction"], abs=1e-3)
        assert stage.min_free_bytes is not None and stage.min_free_bytes > 0
