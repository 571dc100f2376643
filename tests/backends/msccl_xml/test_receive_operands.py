"""Receive steps name the sender's source, as MSCCLang, SCCL and RCCL files do.

Each (sender, receiver, channel) connection is a FIFO; pairing the n-th send with the
n-th receive on it, an `r` or `rcs` step's srcbuf/srcoff must equal the slot its sender
reads (a plain send's src; a forwarding step's own slot, its dst). `rrc`, `rrs` and
`rrcs` keep src on the local operand the executor adds (see assemble.py).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

import msccl_xml_schedules as ms

from collc.backends import BackendOptions
from collc.backends.msccl_xml.lowering import lowered_algo
from collc.backends.msccl_xml.model import StepType, XmlAlgo
from collc.backends.msccl_xml.reader import read_xml

SHARED_XML = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "msccl-xml"


def mismatched_receives(algo: XmlAlgo) -> list[str]:
    """`r`/`rcs` steps whose src is not their matching send's source."""
    sent: dict[tuple[int, int, int], list[tuple[str, int]]] = defaultdict(list)
    received: dict[tuple[int, int, int], list[tuple[str, str, int]]] = defaultdict(list)
    for gpu in algo.gpus:
        for tb in gpu.tbs:
            for step in tb.steps:
                if step.type.sends:
                    source = (step.srcbuf, step.srcoff) if step.type is StepType.SEND else (step.dstbuf, step.dstoff)
                    sent[(gpu.id, tb.send, tb.chan)].append(source)
                if step.type.receives:
                    received[(tb.recv, gpu.id, tb.chan)].append(
                        (f"gpu {gpu.id} tb {tb.id} step {step.s}", step.type, (step.srcbuf, step.srcoff)))
    bad = []
    for conn, receives in received.items():
        for (where, kind, src), source in zip(receives, sent[conn]):
            if kind in (StepType.RECV, StepType.RECV_COPY_SEND) and src != source:
                bad.append(f"{where} ({kind.value}): src {src}, sender reads {source}")
    return bad


@pytest.mark.parametrize("build, options", [
    (lambda: ms.ring_allgather(4), BackendOptions()),  # out of place: the first hop reads the input
    (lambda: ms.ring_allgather(4), BackendOptions(inplace=True)),
    (lambda: ms.ring_allreduce(3), BackendOptions(proto="LL")),
    (lambda: ms.ring_allreduce(4), BackendOptions(instances=2)),
])
def test_collc_receives_name_the_senders_source(build, options):
    algo = lowered_algo(ms.unit(build()), options)
    assert any(s.type is StepType.RECV_COPY_SEND for g in algo.gpus for tb in g.tbs for s in tb.steps) or \
        any(s.type is StepType.RECV for g in algo.gpus for tb in g.tbs for s in tb.steps)
    assert mismatched_receives(algo) == []


def test_out_of_place_allgather_forwards_name_the_input_they_came_from():
    # Rank 1 receives rank 0's chunk straight from rank 0's input buffer and forwards it:
    # its rcs must say `srcbuf="i"` (collc wrote its own output slot there before).
    algo = lowered_algo(ms.unit(ms.ring_allgather(4)), BackendOptions())
    first_hops = [s for g in algo.gpus for tb in g.tbs for s in tb.steps
                  if s.type in (StepType.RECV, StepType.RECV_COPY_SEND) and s.srcbuf.value == "i"]
    assert first_hops, "no receive names the sender's input buffer"


@pytest.mark.parametrize("name", ["gen-mscclang__ag_ring_8.xml", "gen-mscclang__ar_ring_8.xml",
                                  "gen-sccl__ag_dgx1.xml", "rccl__allgather-8n-1mb-4mb.xml"])
def test_real_files_follow_the_same_convention(name):
    path = SHARED_XML / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    assert mismatched_receives(read_xml(path)) == []
