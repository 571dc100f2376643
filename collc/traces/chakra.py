"""Chakra execution traces: the protobuf `.et` format and the JSON traces around it.

`.et` files (mlcommons/chakra `schema/protobuf/et_def.proto`) are a GlobalMetadata message
then one Node message per node, each preceded by its length as a varint. Only a few
fields matter here, so this module decodes the protobuf wire format itself instead of
depending on generated code:

    Node: id=1 (uint64), name=2 (string), type=3 (NodeType), start_time_micros=6,
          duration_micros=7, attr=10 (repeated AttributeProto)
    AttributeProto: name=1, then one value field: int32_val=7, int64_val=9, uint32_val=11,
          uint64_val=13, sint32=15, sint64=17, bool_val=27, string_val=29, ...
    NodeType: COMM_SEND_NODE=5, COMM_RECV_NODE=6, COMM_COLL_NODE=7
    CollectiveCommType (attr comm_type): ALL_REDUCE=0, REDUCE=1, ALL_GATHER=2, GATHER=3,
          SCATTER=4, BROADCAST=5, ALL_TO_ALL=6, REDUCE_SCATTER=7, REDUCE_SCATTER_BLOCK=8,
          BARRIER=9

A communication node is a call when it carries `comm_type`/`comm_size` (the GPU-side node
the converter writes); the CPU-side `c10d::*` nodes next to it are counted as skipped.
`comm_size` is the bytes of the call's input (`In msg nelems` x element size).

JSON: PyTorch host execution traces (`{"schema": ..., "nodes": [...]}`: calls from
`record_param_comms` nodes, sizes from their tensors) and jsonized Chakra workload
graphs (`{"workload_graph": [...]}`: NodeType 5/6/7 with names and runtimes, no sizes).
Both are streamed with ijson.
"""

from __future__ import annotations

import re
import zlib
from typing import Any, BinaryIO, Iterator

from ..diagnostics import CollcError, Span
from .collectives import collective_from_c10d, kernel_collective, nccl_tests_bytes
from .detect import TraceSource, read_varint
from .records import CollectiveCall, SourceSummary, TraceContext

COMM_SEND_NODE, COMM_RECV_NODE, COMM_COLL_NODE = 5, 6, 7
COMM_TYPES = {0: "allreduce", 1: "reduce", 2: "allgather", 3: "gather", 4: "scatter",
              5: "broadcast", 6: "alltoall", 7: "reducescatter", 8: "reducescatter"}
BARRIER = 9

_VARINT_VALUE_FIELDS = {7, 9, 11, 13, 27}          # int32, int64, uint32, uint64, bool
_ZIGZAG_FIELDS = {15, 17}                          # sint32, sint64
_STRING_FIELD = 29


def decode_fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of one message; bytes for length-delimited fields."""
    pos = 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(data, pos)
        elif wire == 2:
            length, pos = read_varint(data, pos)
            if pos + length > len(data):
                raise ValueError(f"field {field} runs past the end of its message")
            value, pos = data[pos:pos + length], pos + length
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unknown wire type {wire} (field {field})")
        if pos > len(data):
            raise ValueError(f"field {field} runs past the end of its message")
        yield field, wire, value


def _attribute(data: bytes) -> tuple[str, Any]:
    name, value = "", None
    for field, wire, v in decode_fields(data):
        if field == 1:
            name = v.decode("utf-8", "replace")
        elif field in _VARINT_VALUE_FIELDS and wire == 0:
            value = v
        elif field in _ZIGZAG_FIELDS and wire == 0:
            value = (v >> 1) ^ -(v & 1)
        elif field == _STRING_FIELD and wire == 2:
            value = v.decode("utf-8", "replace")
    return name, value


def _messages(f: BinaryIO, name: str) -> Iterator[tuple[int, int, bytes]]:
    """(index, byte offset, body) of each length-delimited message of the stream."""
    offset = index = 0
    buf = b""
    eof = False
    while True:
        if not eof and len(buf) < 1 << 20:
            try:
                chunk = f.read(4 << 20)
            except (EOFError, zlib.error, OSError) as e:
                raise CollcError(f"truncated or corrupt compressed trace: {e}",
                                 Span(name, index + 1, 1)) from None
            buf += chunk
            eof = not chunk
        if not buf:
            return
        try:
            length, pos = read_varint(buf, 0)
        except ValueError:
            if eof:
                raise CollcError(f"truncated Chakra trace: record {index} at byte offset {offset} "
                                 "has an unfinished length prefix", Span(name, index + 1, 1)) from None
            continue
        if len(buf) < pos + length:
            if eof:
                raise CollcError(f"truncated Chakra trace: record {index} at byte offset {offset} "
                                 f"needs {length} bytes, {len(buf) - pos} remain",
                                 Span(name, index + 1, 1))
            more = f.read(max(4 << 20, pos + length - len(buf)))
            buf += more
            eof = not more
            continue
        yield index, offset, buf[pos:pos + length]
        buf = buf[pos + length:]
        offset += pos + length
        index += 1


def read_chakra_et(source: TraceSource, summary: SourceSummary, context: TraceContext
                   ) -> Iterator[CollectiveCall]:
    with source.open() as f:
        for index, offset, body in _messages(f, source.name):
            if index == 0:
                continue                       # GlobalMetadata
            try:
                call = _et_node(body, source, summary, index)
            except ValueError as e:
                raise CollcError(f"malformed Chakra node: record {index} at byte offset {offset}: {e}",
                                 Span(source.name, index + 1, 1)) from None
            if call is not None:
                summary.records += 1
                yield call


def _et_node(body: bytes, source: TraceSource, summary: SourceSummary, index: int
             ) -> CollectiveCall | None:
    # Most nodes are compute nodes: read the type first and stop there.
    node_type = None
    for field, wire, value in decode_fields(body):
        if field == 3 and wire == 0:
            node_type = value
            break
    if node_type not in (COMM_SEND_NODE, COMM_RECV_NODE, COMM_COLL_NODE):
        return None
    name, start, duration = "", None, None
    attrs: dict[str, Any] = {}
    for field, wire, value in decode_fields(body):
        if field == 2 and wire == 2:
            name = value.decode("utf-8", "replace")
        elif field == 6 and wire == 0:
            start = float(value)
        elif field == 7 and wire == 0:
            duration = float(value)
        elif field == 10 and wire == 2:
            key, v = _attribute(value)
            attrs[key] = v
    location = f"record {index}"
    if "comm_type" not in attrs and "comm_size" not in attrs:
        summary.skip("CPU-side communication node (its GPU node is the record)")
        return None
    if node_type == COMM_COLL_NODE:
        comm_type = attrs.get("comm_type")
        if comm_type == BARRIER:
            summary.skip("barrier")
            return None
        collective = COMM_TYPES.get(comm_type) or collective_from_c10d(name)
        if collective is None:
            summary.skip("communication node of an unknown comm_type")
            return None
        peer = None
    else:
        collective = "send" if node_type == COMM_SEND_NODE else "recv"
        peer = attrs.get("comm_dst" if collective == "send" else "comm_src")
    size = attrs.get("comm_size")
    in_bytes = int(size) if size is not None else None
    nbytes = None if collective in ("allgather", "gather") else nccl_tests_bytes(collective, in_bytes, None)
    pg = attrs.get("pg_name")
    return CollectiveCall(source=source.name, location=location, collective=collective,
                          communicator=str(pg) if pg not in (None, "") else None,
                          bytes=nbytes, start_us=start, duration_us=duration, peer=peer,
                          named_by="metadata", in_bytes=in_bytes)


# -- JSON -----------------------------------------------------------------------------------

_TENSOR_TYPE = re.compile(r"Tensor\((\w+)\)")
_ET_DTYPES = {"float": "float32", "double": "float64", "c10::Half": "float16", "half": "float16",
              "c10::BFloat16": "bfloat16", "int": "int32", "long int": "int64", "long": "int64",
              "signed char": "int8", "unsigned char": "uint8", "bool": "bool"}


def read_chakra_json(source: TraceSource, summary: SourceSummary, context: TraceContext
                     ) -> Iterator[CollectiveCall]:
    import ijson
    with source.open() as f:
        head = f.read(1 << 16)
    prefix = "workload_graph.item" if b'"workload_graph"' in head else "nodes.item"
    read = [0]

    def counted(nodes: Iterator[Any]) -> Iterator[Any]:
        for node in nodes:
            read[0] += 1
            yield node

    try:
        with source.open() as f:
            nodes = counted(ijson.items(f, prefix, use_float=True))
            if prefix == "nodes.item":
                yield from _host_et_nodes(nodes, source, summary, context)
            else:
                yield from _workload_nodes(nodes, source, summary)
    except (ijson.JSONError, ijson.IncompleteJSONError) as e:
        raise CollcError(f"malformed or truncated Chakra JSON trace after node {read[0]}: {e}",
                         Span(source.name, 1, 1)) from None
    except (EOFError, zlib.error) as e:
        raise CollcError(f"truncated or corrupt compressed trace: {e}",
                         Span(source.name, 1, 1)) from None


def _workload_nodes(nodes: Iterator[dict], source: TraceSource, summary: SourceSummary
                    ) -> Iterator[CollectiveCall]:
    """Jsonized Chakra graph: GPU-side comm nodes (kernels) are the calls; no sizes."""
    for i, node in enumerate(nodes):
        if not isinstance(node, dict):
            raise CollcError(f"workload_graph node {i} is not an object", Span(source.name, 1, 1))
        if node.get("NodeType") not in (COMM_SEND_NODE, COMM_RECV_NODE, COMM_COLL_NODE):
            continue
        name = str(node.get("Name", ""))
        if node.get("is_cpu_op", True):
            summary.skip("CPU-side communication node (its GPU node is the record)")
            continue
        collective = kernel_collective(name) or collective_from_c10d(name)
        if node.get("NodeType") == COMM_SEND_NODE:
            collective = "send"
        elif node.get("NodeType") == COMM_RECV_NODE:
            collective = "recv"
        if collective is None:
            summary.skip("communication node naming no collective")
            continue
        runtime = node.get("runtime")
        summary.records += 1
        yield CollectiveCall(source=source.name, location=f"node {i} (Id {node.get('Id')})",
                             collective=collective,
                             duration_us=float(runtime) if runtime is not None else None,
                             named_by="kernel-name")


def _tensors(value: Any) -> Iterator[tuple[int, int]]:
    """(numel, element size) of each tensor in an execution-trace value: a tensor is
    [tensor id, storage id, offset, numel, element size, device]."""
    if isinstance(value, list):
        if (len(value) == 6 and isinstance(value[5], str) and all(isinstance(v, (int, float)) for v in value[:5])):
            yield int(value[3]), int(value[4])
        else:
            for v in value:
                yield from _tensors(v)


def _host_et_nodes(nodes: Iterator[dict], source: TraceSource, summary: SourceSummary,
                   context: TraceContext) -> Iterator[CollectiveCall]:
    """PyTorch host execution trace: record_param_comms nodes with a collective's name.

    Their inputs are (tensors, seq, process group, rank, collective name, in splits,
    out splits, group size) in the traces the schema 1.0.x writes."""
    for i, node in enumerate(nodes):
        if not isinstance(node, dict):
            raise CollcError(f"execution-trace node {i} is not an object", Span(source.name, 1, 1))
        if node.get("name") != "record_param_comms":
            continue
        inputs = node.get("inputs") or {}
        values, types = inputs.get("values") or [], inputs.get("types") or []
        names = [v for v in values if isinstance(v, str)]
        collective = collective_from_c10d(names[0]) if names else None
        if collective is None:
            summary.skip(f"record_param_comms of no collective ({names[0] if names else '?'})")
            continue
        name_at = values.index(names[0])
        ints = [v for v in values[:name_at] if isinstance(v, int) and not isinstance(v, bool)]
        seq, pg, rank = (ints + [None, None, None])[:3]
        nranks = values[-1] if isinstance(values[-1], int) and values[-1] > 0 else None
        dtype = None
        for t in types:
            m = _TENSOR_TYPE.search(str(t))
            if m:
                dtype = _ET_DTYPES.get(m.group(1), m.group(1))
                break
        in_bytes = sum(n * s for n, s in _tensors(values[:name_at])) or None
        outs = (node.get("outputs") or {}).get("values") or []
        out_bytes = sum(n * s for n, s in _tensors(outs)) or None
        communicator = str(pg) if pg is not None else None
        if communicator is not None:
            context.communicator(communicator, nranks)
        count_elems = sum(n for n, _ in _tensors(values[:name_at])) or None
        summary.records += 1
        yield CollectiveCall(source=source.name, location=f"node {i} (id {node.get('id')})",
                             collective=collective, rank=rank, communicator=communicator,
                             nranks=nranks, dtype=dtype, count=count_elems,
                             bytes=nccl_tests_bytes(collective, in_bytes, out_bytes), seq=seq,
                             named_by="metadata", in_bytes=in_bytes, out_bytes=out_bytes)
