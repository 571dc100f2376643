"""Chakra traces from the mlcommons/chakra samples (archives read without extracting).

Expected values come from decoding chakra.0.et by hand with a generic protobuf field dump:
21 nodes of type COMM_COLL_NODE (7), of which 7 carry comm_type/comm_size (the GPU kernel
nodes: 5 comm_type 0 = ALL_REDUCE, 2 comm_type 5 = BROADCAST) and 14 are the CPU-side
c10d::* nodes; comm_size and duration_micros are read off each kernel node. The same job
as the HTA nccl_data sample: its sizes (e.g. 212480 = 53120 floats) agree.
"""

import tarfile
from collections import Counter

import pytest

from collc.diagnostics import CollcError
from collc.traces.chakra import decode_fields
from collc.traces.detect import read_varint
from collc.traces.sources import read_traces
from trace_samples import sample


def test_protobuf_et_in_archive():
    ts = read_traces([sample("chakra__feeder_tests_trace.tar.gz")])
    (src,) = ts.sources
    assert src.path.endswith(".tar.gz:tests/data/chakra.0.et") and src.format == "chakra-et"
    assert src.records == 7
    assert src.skipped == {"CPU-side communication node (its GPU node is the record)": 14}
    assert Counter((c.collective, c.bytes) for c in ts.calls) == {
        ("allreduce", 26255360): 1, ("allreduce", 26550272): 1, ("allreduce", 31502336): 1,
        ("allreduce", 8196000): 1, ("allreduce", 9724160): 1, ("broadcast", 212480): 1,
        ("broadcast", 424): 1}
    # duration_micros of the 7 kernel nodes (e.g. 28 us for the 212480-byte broadcast).
    bcast = next(c for c in ts.calls if c.bytes == 212480)
    assert bcast.duration_us == 28.0 and bcast.location.startswith("record ")
    assert sum(c.duration_us for c in ts.calls) == pytest.approx(36720, abs=10)


def test_jsonized_workload_graph_archive():
    ts = read_traces([sample("chakra__json_trace.tar.gz")])
    assert [s.path.split(":")[-1] for s in ts.sources] == ["jsonData/chakra.0.json",
                                                           "jsonData/small_chakra.0.json"]
    # chakra.0.json: NodeType 7 kernel nodes: 5 ncclKernel_AllReduce + 2 ncclKernel_Broadcast,
    # 14 c10d::* CPU nodes; small_chakra.0.json: 1 broadcast kernel, 2 CPU nodes.
    assert Counter((c.source.split(":")[-1], c.collective) for c in ts.calls) == {
        ("jsonData/chakra.0.json", "allreduce"): 5, ("jsonData/chakra.0.json", "broadcast"): 2,
        ("jsonData/small_chakra.0.json", "broadcast"): 1}
    assert {c.named_by for c in ts.calls} == {"kernel-name"}
    assert all(c.bytes is None and c.duration_us is not None for c in ts.calls)


def test_pytorch_host_execution_trace_archive():
    ts = read_traces([sample("chakra__1.0.2-chakra.0.0.4.tgz")])
    (src,) = ts.sources               # the macOS ._ file in the archive is left out
    assert src.format == "chakra-json" and src.records == 10
    assert src.skipped == {"record_param_comms of no collective (wait)": 10}
    # record_param_comms inputs: [[tensor of 1 float]], seq, pg 82149104, rank 0,
    # "all_gather", [], [], 2; outputs two 1-float tensors: 8 bytes gathered.
    assert {(c.collective, c.dtype, c.in_bytes, c.out_bytes, c.bytes, c.nranks, c.rank, c.communicator)
            for c in ts.calls} == {("allgather", "float32", 4, 8, 8, 2, 0, "82149104")}


def _et_bytes():
    with tarfile.open(sample("chakra__feeder_tests_trace.tar.gz")) as tar:
        return tar.extractfile("tests/data/chakra.0.et").read()


def test_varint_and_fields():
    assert read_varint(b"\xac\x02", 0) == (300, 2)
    assert list(decode_fields(b"\x08\x96\x01\x12\x02hi")) == [(1, 0, 150), (2, 2, b"hi")]
    with pytest.raises(ValueError):
        read_varint(b"\x80", 0)


def test_truncated_et_is_a_located_error(tmp_path):
    data = _et_bytes()
    p = tmp_path / "cut.et"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(CollcError) as e:
        read_traces([p])
    assert e.value.span.file == str(p)
    assert "truncated Chakra trace: record" in e.value.message and "byte offset" in e.value.message


def test_malformed_et_node_is_a_located_error(tmp_path):
    data = bytearray(_et_bytes())
    # Second message (first node): replace its body's first tag with wire type 7 (invalid).
    length, pos = read_varint(bytes(data), 0)
    second = pos + length
    _, body_at = read_varint(bytes(data), second)
    data[body_at] = 0x0F
    p = tmp_path / "bad.et"
    p.write_bytes(bytes(data))
    with pytest.raises(CollcError) as e:
        read_traces([p])
    assert e.value.span == type(e.value.span)(str(p), 2, 1)
    assert "record 1 at byte offset" in e.value.message


def test_truncated_chakra_json_is_a_located_error(tmp_path):
    with tarfile.open(sample("chakra__json_trace.tar.gz")) as tar:
        text = tar.extractfile("jsonData/chakra.0.json").read()
    p = tmp_path / "cut.json"
    p.write_bytes(text[: len(text) // 3])
    with pytest.raises(CollcError) as e:
        read_traces([p])
    assert e.value.span.file == str(p)
    assert "malformed or truncated Chakra JSON trace after node" in e.value.message
