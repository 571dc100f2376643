"""Kineto traces: every HTA sample's NCCL calls, against values worked out from the files.

Expected values were derived independently of the reader: each trace was loaded whole
with `json.load`, its `ncclKernel*` events listed, and each kernel without metadata joined
to the `cudaLaunchKernel` event with the same `args.correlation` and from there to the
`nccl:*` op enclosing that launch on the same thread (a dozen lines of Python); sizes are
the op's `Input Dims` product times the `Input type` size. Durations are sums of the
kernels' `dur`. They agree with the MANIFEST's descriptions.
"""

import gzip
import json
from collections import Counter

import pytest

from collc.diagnostics import CollcError
from collc.traces.sources import read_traces
from trace_samples import sample


def _read(name):
    return read_traces([sample(name)])


def _mix(ts):
    return Counter((c.collective, c.dtype, c.bytes) for c in ts.calls)


def _total_ms(ts):
    return round(sum(c.duration_us for c in ts.calls) / 1000, 3)


def test_nccl_data_kernels_carry_metadata():
    ts = _read("hta__nccl_parser_config__nccl_data.json.gz")
    # Kernel args: allreduce In msg nelems 2049000/2431040/6563840/6637568/7875584 Float,
    # 3 each; broadcast 53 Long and 53120 Float, 3 each. Bytes = nelems x 4 (or 8 for Long).
    assert _mix(ts) == {
        ("allreduce", "float32", 2049000 * 4): 3, ("allreduce", "float32", 2431040 * 4): 3,
        ("allreduce", "float32", 6563840 * 4): 3, ("allreduce", "float32", 6637568 * 4): 3,
        ("allreduce", "float32", 7875584 * 4): 3, ("broadcast", "int64", 53 * 8): 3,
        ("broadcast", "float32", 53120 * 4): 3}
    assert _total_ms(ts) == 46.876
    assert {c.named_by for c in ts.calls} == {"metadata"}
    assert {(c.rank, c.nranks, c.communicator, c.group_ranks) for c in ts.calls} == {(0, 2, "0", (0, 1))}
    assert {(c.algorithm, c.protocol) for c in ts.calls} == {("RING", "LL")}
    assert ts.world_size == 2
    info = ts.communicators["0"]
    assert (info.nranks, info.ranks, info.name) == (2, (0, 1), "default_pg")
    assert ts.sources[0].to_json()["records"] == 21 and ts.sources[0].format == "kineto"


def test_control_all_to_all_named_by_launch_op():
    ts = _read("hta__trace_diff__control__control.json.gz")
    by_coll = Counter(c.collective for c in ts.calls)
    assert by_coll == {"alltoall": 42, "allreduce": 18}
    assert {c.named_by for c in ts.calls} == {"launch-op"}
    assert (ts.calls[0].rank, ts.world_size) == (3, 8)
    mix = _mix(ts)
    # nccl:all_reduce Input Dims [[45310188]], [[4432073]], [[267040]] float, 6 each.
    assert mix[("allreduce", "float32", 45310188 * 4)] == 6
    assert mix[("allreduce", "float32", 4432073 * 4)] == 6
    assert mix[("allreduce", "float32", 267040 * 4)] == 6
    # nccl:all_to_all [[8, 1024, 8816]] float x6, [[1024]] int x6.
    assert mix[("alltoall", "float32", 8 * 1024 * 8816 * 4)] == 6
    assert mix[("alltoall", "int32", 1024 * 4)] == 6
    assert _total_ms(ts) == 163.535
    assert any("60 NCCL kernels, named 0 by their collective metadata, 60 by the nccl:* op" in n
               for n in ts.notes)


def test_negative_queue_kernels_outside_trace_are_named_by_their_kernel():
    ts = _read("hta__negative_queue_length_values_check__rank0.json.gz")
    # 5 SendRecv kernels have no metadata and their launch is not in the trace: named by
    # the kernel's name, they are still rows (every NCCL kernel is).
    assert Counter(c.collective for c in ts.calls) == {
        "alltoall": 45, "allreduce": 10, "reducescatter": 10, "allgather": 10, "sendrecv": 5}
    assert Counter(c.named_by for c in ts.calls) == {"launch-op": 75, "kernel-name": 5}
    src = ts.sources[0]
    assert src.records == 80
    assert src.skipped == {}
    # 190.345 ms of NCCL kernel time in all, 165.389 ms of it on the 75 kernels named by their op.
    assert _total_ms(ts) == 190.345
    assert any("80 NCCL kernels" in n and "5 by their kernel name alone" in n for n in ts.notes)
    mix = _mix(ts)
    assert mix[("allreduce", "float32", 447923396 * 4)] == 5
    # _reduce_scatter_base records its whole input: nccl-tests' size. [[65536, 384]] float.
    assert mix[("reducescatter", "float32", 65536 * 384 * 4)] == 5
    # _all_gather_base records one rank's input: the size needs nranks, unknown here.
    gathers = [c for c in ts.calls if c.collective == "allgather"]
    assert {(c.bytes, c.in_bytes) for c in gathers} == {(None, 8192 * 384 * 4), (None, 8192 * 64 * 4)}
    assert ts.world_size == 16


@pytest.mark.parametrize("name,total,mix", [
    ("hta__trace_filter__sampled_rank-0.json.gz", 396.199,
     {("alltoall", "uint8", 419430400): 2, ("alltoall", "int32", 2846720 * 4): 1,
      ("alltoall", "int64", 384 * 8): 1, ("allreduce", "float32", 19618307 * 4): 1,
      ("allreduce", "float32", 26258430 * 4): 1, ("allreduce", "float32", 26955536 * 4): 1,
      ("allreduce", "float32", 5716654 * 4): 1, ("allgather", "int8", None): 2}),
    ("hta__trace_filter__sampled_rank-1.json.gz", 379.053,
     {("alltoall", "uint8", 339738624): 1, ("alltoall", "uint8", 394073856): 1,
      ("alltoall", "int32", 2846720 * 4): 1, ("alltoall", "int64", 384 * 8): 1,
      ("allreduce", "float32", 19618307 * 4): 2, ("allreduce", "float32", 26258430 * 4): 1,
      ("allreduce", "float32", 5716654 * 4): 1, ("allgather", "int8", None): 2}),
])
def test_sampled_ranks_of_a_128_rank_job(name, total, mix):
    ts = _read(name)
    assert _mix(ts) == mix
    assert _total_ms(ts) == total
    assert ts.world_size == 128


def test_df_index_resolver_allreduce_without_sizes():
    ts = _read("hta__df_index_resolver__df_index_resolver.json.gz")
    # 2020 kernels, each launched inside an nccl:all_reduce op with no Input Dims.
    assert len(ts.calls) == 2020
    assert _mix(ts) == {("allreduce", None, None): 2020}
    assert _total_ms(ts) == 357.343
    assert {c.rank for c in ts.calls} == {1}


def test_two_ranks_read_together():
    ts = read_traces([sample("hta__trace_filter__sampled_rank-0.json.gz"),
                      sample("hta__trace_filter__sampled_rank-1.json.gz")])
    assert Counter(c.rank for c in ts.calls) == {0: 10, 1: 10}
    assert len(ts.sources) == 2 and len(ts.notes) == 2


def _trace(tmp_path, events, meta=None, name="t.json"):
    doc = dict(meta or {"distributedInfo": {"rank": 2, "world_size": 4}})
    doc["traceEvents"] = events
    p = tmp_path / name
    p.write_text(json.dumps(doc, indent=2))
    return p


def test_newer_kernel_names_and_reduce_scatter_metadata(tmp_path):
    kernel = {"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "ts": 100.0, "dur": 50.5,
              "name": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL128(ncclDevKernelArgsStorage<4096ul>)",
              "args": {"correlation": 9, "Collective name": "reduce_scatter_tensor_coalesced",
                       "In msg nelems": 4096, "Out msg nelems": 1024, "Group size": 4,
                       "dtype": "BFloat16", "Process Group Name": "3", "Seq": 17,
                       "Process Group Ranks": "[0, 1, 2, 3]"}}
    ts = read_traces([_trace(tmp_path, [kernel])])
    (c,) = ts.calls
    assert (c.collective, c.dtype, c.bytes, c.in_bytes, c.out_bytes) == ("reducescatter", "bfloat16", 8192, 8192, 2048)
    assert (c.algorithm, c.protocol, c.seq, c.rank, c.nranks) == ("RING", "LL128", 17, 2, 4)
    assert c.location == "line 7"   # json.dumps(indent=2): the event opens on line 7


def test_cpu_only_trace_gives_record_param_comms_calls(tmp_path):
    rpc = {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1,
           "ts": 10, "dur": 3, "args": {"Collective name": "_allgather_base", "In msg nelems": 10,
                                        "Out msg nelems": 40, "Group size": 4, "dtype": "Float"}}
    barrier = dict(rpc, args={"Collective name": "barrier"})
    ts = read_traces([_trace(tmp_path, [rpc, barrier])])
    (c,) = ts.calls
    assert (c.collective, c.bytes, c.duration_us) == ("allgather", 160, None)
    assert ts.sources[0].skipped == {"record_param_comms of no collective (barrier, init, ...)": 1}


def test_kernel_without_ts_is_a_located_error(tmp_path):
    kernel = {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float", "pid": 0,
              "tid": 7, "args": {}}
    p = _trace(tmp_path, [{"ph": "i", "name": "x"}, kernel])
    with pytest.raises(CollcError) as e:
        read_traces([p])
    assert e.value.span.file == str(p) and e.value.span.line > 1


def test_truncated_copy_of_a_sample(tmp_path):
    text = gzip.open(sample("hta__trace_filter__sampled_rank-1.json.gz")).read()
    p = tmp_path / "rank1.json"
    p.write_bytes(text[: len(text) - 5000])
    with pytest.raises(CollcError) as e:
        read_traces([p])
    assert e.value.span.file == str(p) and "truncated" in e.value.message
