"""NCCL profiler-plugin dumps (not strict JSON) and NCCL Inspector output."""

import json

import pytest

from collc.diagnostics import CollcError
from collc.traces.sources import read_traces
from trace_samples import sample

P2P = "nccl-profiler__pha-Z-nccl_example-profiler_p2p_sendrecv_trace.json.txt"
README = "nccl-profiler__NVIDIA-nccl_example-profiler_README_allreduce_trace_excerpt.txt"


def test_p2p_dump():
    ts = read_traces([sample(P2P)])
    # `grep '"cat": "P2P", "ph": "b"'`: 8 calls, Send and Recv for ranks 0-3 of one comm,
    # Count 268435456 ncclFloat32 each (1 GiB); durations are end ts - begin ts.
    assert [(c.collective, c.rank, c.peer) for c in ts.calls] == [
        ("send", 0, 1), ("recv", 0, 3), ("send", 1, 2), ("recv", 1, 0),
        ("send", 2, 3), ("recv", 2, 1), ("send", 3, 0), ("recv", 3, 2)]
    assert {(c.dtype, c.bytes, c.communicator) for c in ts.calls} == {
        ("float32", 1 << 30, "12715772615376301750")}
    assert ts.calls[0].duration_us == pytest.approx(1818670.567871 - 1818542.097656)
    assert ts.calls[0].location == "line 25"
    assert ts.sources[0].skipped == {}


def test_readme_excerpt_is_read_leniently():
    ts = read_traces([sample(README)])
    (call,) = ts.calls
    # COLL begin: SeqNum 0, Rank 0, Count 262144 ncclFloat32, RING/SIMPLE. Its end event
    # (id 17) belongs to another call: the excerpt was cut, so no duration.
    assert (call.collective, call.bytes, call.seq, call.algorithm, call.protocol, call.duration_us) == (
        "allreduce", 1 << 20, 0, "RING", "SIMPLE", None)
    # Line 43 is "... [ trace truncated for brevity ]"; line 11's curly quote is repaired.
    assert ts.sources[0].skipped == {"line that is no event, even read leniently": 1,
                                     "end event without its begin event (trace cut)": 1}
    assert any("first at line 43" in n for n in ts.notes)


def test_dump_with_no_event_is_a_located_error(tmp_path):
    p = tmp_path / "dump.txt"
    p.write_text('[\n{"name": "AllReduce", "cat": "COLL", "ph": "b", "args": {"Count": 12\n')
    with pytest.raises(CollcError) as e:
        read_traces([p])
    assert (e.value.span.file, e.value.span.line) == (str(p), 2)


def _inspector(rank, coll, sn, size, time_us, n_ranks=8, comm="0x7f8c496ae9f661"):
    # The object layout of NVIDIA/nccl ext-profiler/inspector/README.md ("Output Example").
    return {"header": {"id": comm, "rank": rank, "n_ranks": n_ranks, "nnodes": 1},
            "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "",
                         "rec_mechanism": "profiler_plugin", "dump_timestamp_us": 1748030377748202,
                         "hostname": "example-hostname", "pid": 1639453},
            "coll_perf": {"coll": coll, "coll_sn": sn, "coll_msg_size_bytes": size,
                          "coll_exec_time_us": time_us, "coll_timing_source": "kernel_gpu",
                          "coll_algobw_gbs": 277.210914, "coll_busbw_gbs": 485.119099}}


def test_inspector_json_lines_and_pretty(tmp_path):
    objs = [_inspector(2, "AllReduce", 1407, 17179869184, 61974),
            _inspector(2, "ReduceScatter", 1408, 2147483648, 41057),
            _inspector(2, "AllGather", 1409, 1048576, 120)]
    lines = tmp_path / "inspector.log"
    lines.write_text("".join(json.dumps(o) + "\n" for o in objs))
    pretty = tmp_path / "pretty.log"
    pretty.write_text("\n".join(json.dumps(o, indent=2) for o in objs) + "\n")
    for p in (lines, pretty):
        ts = read_traces([p])
        assert ts.sources[0].format == "nccl-inspector"
        # msg size is one rank's part for ReduceScatter/AllGather: nccl-tests' size is x8.
        assert [(c.collective, c.seq, c.bytes, c.duration_us, c.rank, c.nranks) for c in ts.calls] == [
            ("allreduce", 1407, 17179869184, 61974.0, 2, 8),
            ("reducescatter", 1408, 2147483648 * 8, 41057.0, 2, 8),
            ("allgather", 1409, 1048576 * 8, 120.0, 2, 8)]
        assert ts.communicators["0x7f8c496ae9f661"].nranks == 8
    # Each pretty object is 25 lines (braces, 4 header, 6 metadata, 7 coll_perf fields).
    assert [c.location for c in read_traces([pretty]).calls][:2] == ["line 1", "line 26"]


def test_inspector_malformed_and_truncated(tmp_path):
    good = json.dumps(_inspector(0, "AllReduce", 1, 1024, 10))
    bad = tmp_path / "bad.log"
    bad.write_text(good + "\n" + good.replace('"coll_sn": 1', '"coll_sn": 1x') + "\n")
    with pytest.raises(CollcError) as e:
        read_traces([bad])
    assert (e.value.span.line, "malformed NCCL Inspector record" in e.value.message) == (2, True)
    cut = tmp_path / "cut.log"
    cut.write_text(good + "\n" + json.dumps(_inspector(0, "AllReduce", 2, 1024, 10), indent=2)[:200])
    with pytest.raises(CollcError) as e:
        read_traces([cut])
    assert e.value.span.line == 2 and "truncated" in e.value.message
