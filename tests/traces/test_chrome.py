"""The streaming Chrome-trace reader against json.load, on real samples and odd layouts."""

import gzip
import json

import pytest

from collc.diagnostics import CollcError
from collc.traces import chrome
from collc.traces.chrome import ChromeTrace, iter_events, trace_metadata
from trace_samples import sample

NCCL_DATA = "hta__nccl_parser_config__nccl_data.json.gz"      # multi-line Kineto layout
SAMPLED = "hta__trace_filter__sampled_rank-0.json.gz"          # whole trace on one line


def _reference(path):
    return json.load(gzip.open(path))


@pytest.mark.parametrize("name", [NCCL_DATA, SAMPLED])
def test_events_equal_json_load(name):
    path = sample(name)
    ref = _reference(path)
    assert list(iter_events(path)) == ref["traceEvents"]
    assert trace_metadata(path) == {k: v for k, v in ref.items() if k != "traceEvents"}


def test_prefilter_returns_exactly_the_matching_events():
    path = sample(NCCL_DATA)
    ref = _reference(path)["traceEvents"]
    got = list(iter_events(path, prefilter=[b"ncclKernel"]))
    # 15 AllReduce + 6 Broadcast kernels (MANIFEST; `zcat | grep -c ncclKernel_` agrees).
    assert got == [e for e in ref if "ncclKernel" in e["name"]]
    assert len(got) == 21


def test_small_chunks_cut_events_anywhere(monkeypatch, tmp_path):
    """Chunk boundaries falling inside events, separators and the header change nothing."""
    path = sample(SAMPLED)
    ref = _reference(path)
    monkeypatch.setattr(chrome, "CHUNK_BYTES", 997)
    assert list(iter_events(path)) == ref["traceEvents"]
    kernels = list(iter_events(path, prefilter=[b"ncclKernel"]))
    assert len(kernels) == 10 and all(e["name"].startswith("ncclKernel") for e in kernels)


def _write(tmp_path, text, name="t.json"):
    p = tmp_path / name
    p.write_text(text)
    return p


ODD_EVENTS = [
    {"name": "a", "ph": "X", "ts": 1, "dur": 2, "args": {"list": [{"x": 1}, {"y": 2}]}},
    {"name": "b}, {\"c", "ph": "X", "ts": 3, "dur": 1},
    {"name": "ncclKernel_x", "ph": "X", "ts": 5, "dur": 1, "args": {"l": [{}, {"z": [{"w": 0}, {}]}]}},
]


@pytest.mark.parametrize("indent", [None, 2])
def test_separators_inside_events_and_strings(tmp_path, indent):
    doc = {"schemaVersion": 1, "traceEvents": ODD_EVENTS, "after": [{"k": 1}, {"k": 2}], "n": 3}
    p = _write(tmp_path, json.dumps(doc, indent=indent))
    trace = ChromeTrace(p)
    assert list(trace.events()) == ODD_EVENTS
    assert trace.metadata == {"schemaVersion": 1, "after": [{"k": 1}, {"k": 2}], "n": 3}
    assert list(iter_events(p, prefilter=[b"ncclKernel"])) == [ODD_EVENTS[2]]


def test_bare_array_and_empty_array(tmp_path):
    assert list(iter_events(_write(tmp_path, json.dumps(ODD_EVENTS), "a.json"))) == ODD_EVENTS
    assert list(iter_events(_write(tmp_path, '{"traceEvents": []}', "b.json"))) == []


def test_other_layouts_fall_back_to_ijson(tmp_path):
    # "traceEvents" first appears inside a string: the fast path cannot trust its header.
    doc = {"note": '"traceEvents": [', "traceEvents": ODD_EVENTS[:2]}
    p = _write(tmp_path, json.dumps(doc))
    trace = ChromeTrace(p)
    assert list(trace.events()) == ODD_EVENTS[:2]
    assert trace.metadata == {"note": '"traceEvents": ['}


def _kineto_text():
    return gzip.open(sample(NCCL_DATA)).read().decode()


def test_truncated_trace_is_a_located_error(tmp_path):
    text = _kineto_text()
    cut = text[: int(len(text) * 0.6)]
    p = _write(tmp_path, cut)
    with pytest.raises(CollcError) as e:
        list(iter_events(p))
    assert e.value.span.file == str(p) and e.value.span.line > 1
    assert "truncated" in e.value.message and "byte offset" in e.value.message


def test_truncated_gzip_is_a_located_error(tmp_path):
    raw = sample(NCCL_DATA).read_bytes()
    p = tmp_path / "cut.json.gz"
    p.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CollcError) as e:
        list(iter_events(p, prefilter=[b"ncclKernel"]))
    assert e.value.span.file == str(p)
    assert "truncated or corrupt compressed" in e.value.message


@pytest.mark.parametrize("prefilter", [None, [b"ncclKernel"]])
def test_malformed_event_is_located_at_its_line(tmp_path, prefilter):
    text = _kineto_text()
    anchor = '"name": "ncclKernel_AllReduce_RING_LL_Sum_float'
    at = text.index(anchor)
    dur = text.index('"dur": ', at)
    broken = text[:dur] + '"dur": 26x36,' + text[dur + len('"dur": '):]
    p = _write(tmp_path, broken)
    event_line = text.count("\n", 0, at) + 1
    with pytest.raises(CollcError) as e:
        list(iter_events(p, prefilter))
    # The error names the line where the broken event starts ("{" just above its "ph" line).
    assert event_line - 2 <= e.value.span.line <= event_line
    assert "malformed trace event" in e.value.message


def test_location_of_events():
    path = sample(NCCL_DATA)
    lines = gzip.open(path).read().decode().split("\n")
    trace = ChromeTrace(path)
    for event in trace.events(prefilter=[b"ncclKernel"]):
        loc = trace.location()
        assert loc.startswith("line ")
        n = int(loc.split()[1])
        # Kineto writes "  {" on the event's first line and its name on the next.
        assert lines[n - 1].strip() == "{" and event["name"] in lines[n]


def test_compact_layout_with_tiny_chunks(monkeypatch, tmp_path):
    """`{"traceEvents":[{...},{...}]}` with no whitespace, read 257 bytes at a time."""
    import orjson
    ref = _reference(sample(SAMPLED))
    doc = {"distributedInfo": ref["distributedInfo"], "traceEvents": ref["traceEvents"] + ODD_EVENTS}
    p = tmp_path / "compact.json"
    p.write_bytes(orjson.dumps(doc))
    monkeypatch.setattr(chrome, "CHUNK_BYTES", 257)
    trace = ChromeTrace(p)
    assert list(trace.events()) == doc["traceEvents"]
    assert trace.metadata == {"distributedInfo": ref["distributedInfo"]}
    wanted = [e for e in doc["traceEvents"] if "ncclKernel" in orjson.dumps(e).decode()]
    assert list(iter_events(p, prefilter=[b"ncclKernel"])) == wanted


@pytest.mark.parametrize("indent", [None, 2])
def test_objects_after_the_array_are_not_events(tmp_path, indent):
    """Trailing keys holding lists of objects, even ones the prefilter matches."""
    tail = [{"name": "ncclKernel_in_metadata"}, {"k": 2}]
    doc = {"traceEvents": ODD_EVENTS, "after": tail, "n": 3}
    p = _write(tmp_path, json.dumps(doc, indent=indent))
    trace = ChromeTrace(p)
    assert list(trace.events(prefilter=[b"ncclKernel"])) == [ODD_EVENTS[2]]
    assert trace.metadata == {"after": tail, "n": 3}
