"""The Chrome-trace builder: what Perfetto and chrome://tracing need of every event,
and the two traces built with it (a pipeline step, a harvesting run)."""

import json
from pathlib import Path

import pytest

from collc.harvest.trace import chrome_trace as harvest_trace
from collc.pipeline.render import Interval, Lane, chrome_trace as pipeline_trace
from collc.render.chrome_trace import TraceBuilder, write_trace

ROOT = Path(__file__).resolve().parents[2]
HARVEST_LOG = ROOT / "bench" / "results" / "harvest_log.json"


def check_valid(trace: dict) -> None:
    """The Trace Event Format as the viewers read it: a `traceEvents` list; metadata
    events name processes and threads; slices have a start and a duration in
    microseconds; every event has a process and (except a process's metadata) a thread."""
    assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]
    assert trace.get("displayTimeUnit", "ms") in ("ms", "ns")
    for e in trace["traceEvents"]:
        assert e["ph"] in ("M", "X", "i"), e
        assert isinstance(e["name"], str) and isinstance(e["pid"], int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name")
            assert isinstance(e["args"], dict)
            if e["name"] == "thread_name":
                assert isinstance(e["tid"], int)
            continue
        assert isinstance(e["tid"], int)
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        else:
            assert e["s"] in ("g", "p", "t")
    # Strict JSON: no NaN or Infinity, which the viewers refuse.
    json.loads(json.dumps(trace, allow_nan=False))


def test_builder_events_in_order_with_fixed_keys(tmp_path):
    trace = TraceBuilder()
    trace.process(0, "stage 0", sort_index=0, tid=0)
    trace.process(1, "device cpu:1")
    trace.thread(0, 2, "compute")
    trace.complete("F0", "F", 0, 2, 10.0, 5.5, {"microbatch": 0})
    trace.complete("overrun", "overrun", 1, 3, 20.0, 1.0, {}, colour="terrible")
    trace.instant("crash", 1, 3, 21.0, {"message": "boom"})
    doc = trace.trace("a step")
    check_valid(doc)
    assert [list(e) for e in doc["traceEvents"]] == [
        ["ph", "name", "pid", "tid", "args"], ["ph", "name", "pid", "tid", "args"], ["ph", "name", "pid", "args"],
        ["ph", "name", "pid", "tid", "args"], ["ph", "name", "cat", "pid", "tid", "ts", "dur", "args"],
        ["ph", "name", "cat", "cname", "pid", "tid", "ts", "dur", "args"],
        ["ph", "s", "name", "pid", "tid", "ts", "args"]]
    assert doc["traceEvents"][1]["args"] == {"sort_index": 0}
    assert doc["otherData"] == {"title": "a step"}
    assert "otherData" not in TraceBuilder().trace()
    path = write_trace(tmp_path / "t.json", doc)
    assert json.loads(path.read_text()) == doc
    assert path.read_text() == json.dumps(doc)  # compact, as the tools always wrote it


def test_pipeline_lanes_make_a_valid_trace():
    lane = Lane("stage 0 (GPUs 0, 4)", compute=[Interval(0.0, 4000.0, "F", "F0", {"stage": 0, "microbatch": 0})],
                transfers=[Interval(4000.0, 50.0, "transfer", "act 0->1 mb 0", {"to_rank": 1, "microbatch": 0})],
                collectives=[Interval(9000.0, 300.0, "gradient", "gradient allreduce")],
                bubbles=[{"start_us": 4000.0, "end_us": 9000.0, "duration_us": 5000.0, "cause": "warm-up"}])
    doc = pipeline_trace([lane, Lane("stage 1")], "1f1b")
    check_valid(doc)
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [(e["tid"], e["name"]) for e in spans] == [(0, "F0"), (1, "act 0->1 mb 0"), (2, "gradient allreduce"),
                                                       (3, "bubble (warm-up)")]
    assert spans[-1]["args"] == {"duration_us": 5000.0, "cause": "warm-up"}
    names = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"]
    assert names == ["stage 0 (GPUs 0, 4)", "stage 1"]


@pytest.mark.skipif(not HARVEST_LOG.exists(), reason="bench/results/harvest_log.json is not in the checkout")
def test_harvest_log_makes_a_valid_trace():
    log = json.loads(HARVEST_LOG.read_text())
    doc = harvest_trace(log)
    check_valid(doc)
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert sum(e["name"] == "bubble" for e in slices) == len(log["bubbles"])
    assert sum(e["cat"] == "side task" for e in slices) == len(log["runs"])
    assert all(e["cname"] == "terrible" for e in slices if e["name"] == "overrun")
