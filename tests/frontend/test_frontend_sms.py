"""`gpu g[8] sms 80;`: a topology names its GPUs' SM count (AMD: compute units)."""

from __future__ import annotations

import pytest

import collc.frontend as fe
from collc.diagnostics import CollcError
from collc.ir.topology import Topology

SOURCE = """
topology box(n = 4) {
    gpu g[n] sms 2 * 40;
    switch sms;   // `sms` stays an ordinary name outside a GPU declaration
    for i in 0..n { link g[i] <-> sms bw 100 GB/s; }
}
topology pair {
    part b[2] = box(n = 2);
    gpu h sms 132;
    gpu plain;
    link b[0].g[0] <-> h bw 10 GB/s;
    link b[1].g[0] <-> h bw 10 GB/s;
    link plain <-> h bw 10 GB/s;
}
"""


def load(tmp_path, text: str, name: str) -> Topology:
    path = tmp_path / "t.coll"
    path.write_text(text)
    return fe.resolve_topology(f"{path}:{name}")


def test_sms_per_gpu_through_parts_and_json(tmp_path):
    topo = load(tmp_path, SOURCE, "pair")
    assert [(g.name, g.sms) for g in topo.gpus] == [
        ("b[0].g[0]", 80), ("b[0].g[1]", 80), ("b[1].g[0]", 80), ("b[1].g[1]", 80), ("h", 132), ("plain", None)]
    assert Topology.from_json(topo.to_json()) == topo


@pytest.mark.parametrize("decl, message", [
    ("switch s sms 4;", "only a GPU has streaming multiprocessors; `sms` on a switch means nothing"),
    ("gpu g[2] sms 0;", "a GPU's number of SMs must be between 1 and 4096, got 0"),
    ("gpu g[2] sms 1.5;", "SMs"),
])
def test_bad_sms_is_a_located_error(tmp_path, decl, message):
    text = f"topology t {{\n    {decl}\n    gpu x; gpu y; link x <-> y bw 1 GB/s;\n}}\n"
    with pytest.raises(CollcError) as exc:
        load(tmp_path, text, "t")
    assert message in exc.value.message
    assert exc.value.span.line == 2 and exc.value.span.column == 5 + decl.index("sms") + 4


@pytest.mark.parametrize("spec, sms", [("dgx1", 80), ("ndv2(chassis=2)", 80), ("dgx2(chassis=2)", 80),
                                       ("dgx_h100(nodes=2)", 132), ("mi250(chassis=1)", 104)])
def test_stdlib_machines_carry_their_data_sheet_sm_counts(spec, sms):
    topo = fe.resolve_topology(spec)
    assert {g.sms for g in topo.gpus} == {sms}


def test_generic_topologies_name_no_gpu_model():
    assert {g.sms for g in fe.resolve_topology("ring(4)").gpus} == {None}


def test_printer_writes_the_sms_back():
    from collc.frontend.parser import parse
    from collc.frontend.printer import format_module

    text = format_module(parse(SOURCE, "t.coll"))
    assert "gpu g[n] sms 2 * 40;" in text and "gpu h sms 132;" in text and "gpu plain;" in text
    assert format_module(parse(text, "again.coll")) == text
