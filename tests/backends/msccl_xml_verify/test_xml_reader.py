"""Reading MSCCL XML: the model, line numbers, and located errors for bad input."""

from __future__ import annotations

import pytest

from collc.backends.msccl_xml.model import BufferName, Protocol, StepType
from collc.backends.msccl_xml.reader import read_xml, read_xml_bytes
from collc.diagnostics import CollcError
from xml_verify_programs import clone, line_of, render, ring_allgather, steps_of


def test_reads_the_program_with_line_numbers(tmp_path):
    text = render(ring_allgather(3))
    path = tmp_path / "ring.xml"
    path.write_text(text)
    algo = read_xml(path)
    assert (algo.coll, algo.ngpus, algo.nchunksperloop, algo.proto) == ("allgather", 3, 3, Protocol.SIMPLE)
    assert algo.inplace is False and algo.outofplace is True and (algo.min_bytes, algo.max_bytes) == (0, 0)
    g1 = algo.gpus[1]
    assert (g1.id, g1.i_chunks, g1.o_chunks, g1.s_chunks, g1.line) == (1, 1, 3, 0, text.splitlines().index(
        '  <gpu id="1" i_chunks="1" o_chunks="3" s_chunks="0">') + 1)
    tb = g1.tbs[0]
    assert (tb.id, tb.send, tb.recv, tb.chan) == (0, 2, 0, 0)
    assert [s.type for s in tb.steps] == [StepType.COPY, StepType.SEND, StepType.RECV_COPY_SEND, StepType.RECV]
    last = tb.steps[-1]
    assert (last.s, last.srcbuf, last.dstbuf, last.dstoff, last.cnt) == (3, BufferName.OUTPUT, BufferName.OUTPUT, 2, 1)
    assert last.line == line_of(text, 1, 0, 3)


def test_missing_step_attribute_is_located(tmp_path):
    program = ring_allgather(3)
    del steps_of(program, 2, 0)[1]["cnt"]
    text = render(program)
    path = tmp_path / "bad.xml"
    path.write_text(text)
    with pytest.raises(CollcError) as exc:
        read_xml(path)
    assert "lacks the attribute 'cnt'" in exc.value.message
    assert exc.value.span.file == str(path)
    assert exc.value.span.line == line_of(text, 2, 0, 1)
    assert exc.value.span.column == 7  # the '<' of the indented <step>


@pytest.mark.parametrize("attr, value, message", [
    ("srcoff", "x1", 'srcoff="x1" is not an integer'),
    ("type", "rr", 'unknown step type="rr"'),
    ("dstbuf", "q", 'dstbuf="q" is not a buffer'),
    ("hasdep", "2", "hasdep=2 must be 0 or 1"),
    ("dstoff", "010", 'dstoff="010" has a leading zero, which the executor reads as an octal number'),
])
def test_invalid_step_attributes_are_located(attr, value, message):
    program = ring_allgather(3)
    steps_of(program, 0, 0)[2][attr] = value
    text = render(program)
    with pytest.raises(CollcError) as exc:
        read_xml_bytes(text, "t.xml")
    assert message in exc.value.message
    assert exc.value.span.line == line_of(text, 0, 0, 2)


def test_invalid_threadblock_and_algo_attributes():
    program = ring_allgather(3)
    program["gpus"][1]["tbs"][0]["attrs"]["send"] = -2
    text = render(program)
    with pytest.raises(CollcError, match="send=-2 must be at least -1") as exc:
        read_xml_bytes(text, "t.xml")
    assert exc.value.span.line == line_of(text, 1, 0, 0) - 1  # the <tb> just above its first step
    program = ring_allgather(3)
    program["algo"]["proto"] = "LL256"
    with pytest.raises(CollcError, match='unknown protocol proto="LL256"') as exc:
        read_xml_bytes(render(program), "t.xml")
    assert exc.value.span.line == 1
    program = ring_allgather(3)
    del program["algo"]["ngpus"]
    with pytest.raises(CollcError, match="<algo> lacks the attribute 'ngpus'"):
        read_xml_bytes(render(program), "t.xml")


def test_malformed_xml_names_line_and_column():
    text = render(ring_allgather(3)).replace("    </tb>\n", "", 1)
    with pytest.raises(CollcError) as exc:
        read_xml_bytes(text, "t.xml")
    assert exc.value.message.startswith("malformed XML: mismatched tag")
    assert exc.value.span.line == text.splitlines().index("  </gpu>") + 1


def test_top_element_must_be_algo_and_files_must_exist(tmp_path):
    with pytest.raises(CollcError, match="top element is <graph>"):
        read_xml_bytes("<graph/>", "t.xml")
    with pytest.raises(CollcError, match="cannot read"):
        read_xml(tmp_path / "absent.xml")


def test_variations_of_real_files_are_accepted():
    program = ring_allgather(3)
    del program["algo"]["outofplace"]
    del program["algo"]["minBytes"]
    program["algo"].update(redop="sum", nbuffers="2")
    text = render(program).replace(
        '  <gpu id="0" i_chunks="1" o_chunks="3" s_chunks="0">',
        '  <gpu id="0" i_chunks="1" o_chunks="3" s_chunks="0">\n    <copy i_off="0" o_off="0"/>\n'
        '    <copy i_off="1" o_off="1"/>')
    text = text.replace('<tb id="0" send="1" recv="2" chan="0">', '<tb id="0" send="1" recv="2" chan="0" nthreads="9">')
    doc = read_xml_bytes(text, "t.xml")
    assert doc.algo.outofplace is None and doc.algo.min_bytes is None and doc.algo.max_bytes == 0
    assert doc.algo.extra_attrs == {"redop": "sum", "nbuffers": "2"}
    warnings = [(w.message, w.span.line) for w in doc.warnings]
    assert ("2 <copy> elements inside <gpu> are ignored by the executor (the first is here)", 3) in warnings
    assert any("nthreads is not read by the executor" in m for m, _ in warnings)
    assert len(warnings) == 2


def test_cloned_programs_render_identically():
    program = ring_allgather(4)
    assert render(clone(program)) == render(program)


def test_attributes_past_the_executors_sixteen_are_flagged():
    program = ring_allgather(3)
    attrs = program["algo"]
    reordered = {f"x{k}": k for k in range(8)}  # eight extra attributes first ...
    reordered.update(attrs)  # ... push the last two past the 16th
    program["algo"] = reordered
    doc = read_xml_bytes(render(program), "t.xml")
    (w,) = doc.warnings
    assert w.message == ("<algo> has 18 attributes; the executor's parser keeps the first 16 and would not see "
                         "minBytes, maxBytes (put them first)")
    assert doc.algo.extra_attrs == {f"x{k}": str(k) for k in range(8)}
