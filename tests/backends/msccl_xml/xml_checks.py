"""Independent checks of MSCCL XML programs for the backend tests: the structural rules of
the executor (written from msccl_parser.cc, not from the backend's code) and the text
form its hand-written parser reads."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import defaultdict

from collc.backends.msccl_xml.model import StepType, XmlAlgo

REQUIRED = {
    "algo": ["name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace",
             "minBytes", "maxBytes"],
    "gpu": ["id", "i_chunks", "o_chunks", "s_chunks"],
    "tb": ["id", "send", "recv", "chan"],
    "step": ["s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep"],
}


def check_structure(algo: XmlAlgo) -> None:
    assert [g.id for g in algo.gpus] == list(range(algo.ngpus))
    assert algo.nchannels == 1 + max(tb.chan for g in algo.gpus for tb in g.tbs)
    assert algo.nchannels <= 32
    sends: dict[tuple[int, int, int], list[int]] = {}
    recvs: dict[tuple[int, int, int], list[int]] = {}
    for g in algo.gpus:
        assert [tb.id for tb in g.tbs] == list(range(len(g.tbs))), "tb ids run 0.. without gaps"
        send_conn, recv_conn = set(), set()
        for tb in g.tbs:
            assert tb.send != g.id and tb.recv != g.id
            assert 0 <= tb.chan < 32
            if tb.send >= 0:
                assert (tb.send, tb.chan) not in send_conn, "two threadblocks send to one peer on one channel"
                send_conn.add((tb.send, tb.chan))
            if tb.recv >= 0:
                assert (tb.recv, tb.chan) not in recv_conn, "two threadblocks receive from one peer on one channel"
                recv_conn.add((tb.recv, tb.chan))
            assert [st.s for st in tb.steps] == list(range(len(tb.steps))), "s numbers run 0.. in order"
            for k, st in enumerate(tb.steps):
                if st.type is StepType.NOP:
                    assert st.depid >= 0, "a nop only waits"
                    nxt = tb.steps[k + 1]
                    assert nxt.depid >= 0, "the step after nops carries a dependency of its own"
                    continue
                assert 0 < st.cnt < 72
                assert not st.type.sends or tb.send >= 0
                assert not st.type.receives or tb.recv >= 0
                if st.type.sends:
                    sends.setdefault((g.id, tb.send, tb.chan), []).append(st.cnt)
                if st.type.receives:
                    recvs.setdefault((tb.recv, g.id, tb.chan), []).append(st.cnt)
                if st.depid >= 0:
                    assert st.depid != tb.id
                    target = g.tbs[st.depid].steps[st.deps]
                    assert target.hasdep and target.type is not StepType.NOP
    assert sends == recvs, "every connection's sends and receives pair up with equal counts"


def check_text(text: str) -> None:
    assert text.startswith("<algo "), "no XML declaration: the executor's parser wants an element first"
    assert " />" not in text
    assert "\t" not in text
    root = ET.fromstring(text)
    counts = defaultdict(int)
    for element in root.iter():
        assert list(element.attrib)[:len(REQUIRED[element.tag])] == REQUIRED[element.tag]
        assert len(element.attrib) <= 16, "the executor's parser keeps 16 attributes per element"
        counts[element.tag] += 1
    assert counts["algo"] == 1 and counts["gpu"] == int(root.get("ngpus"))


def connections(algo: XmlAlgo) -> dict[tuple[int, int, int], list[StepType]]:
    out: dict[tuple[int, int, int], list[StepType]] = defaultdict(list)
    for g in algo.gpus:
        for tb in g.tbs:
            for st in tb.steps:
                if st.type.sends:
                    out[(g.id, tb.send, tb.chan)].append(st.type)
    return out
