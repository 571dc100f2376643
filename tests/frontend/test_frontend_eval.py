"""What programs mean: expressions, topology composition, collectives, lowering."""

from __future__ import annotations

from pathlib import Path

import pytest

from collc.diagnostics import CollcError
from collc.frontend import (
    instantiate_algorithm, load_requests, parse_size, resolve_collective, resolve_topology,
)
from collc.frontend.evaluate import Evaluator, Scope
from collc.frontend.parser import parse_value
from collc.frontend.values import BANDWIDTH, SIZE, TIME, Quantity
from collc.ir.collective import ChunkId, CollectiveKind, standard
from collc.ir.schedule import Buffer, Loc, OpKind
from collc.ir.topology import NodeKind


def ev(text: str):
    return Evaluator().eval(parse_value(text, "<test>"), Scope())


# --- expressions --------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [
    ("25 GB/s", Quantity(25e9, BANDWIDTH)),
    ("400 Gbit/s", Quantity(50e9, BANDWIDTH)),
    ("0.7 us", Quantity(0.7e-6, TIME)),
    ("2 KiB", Quantity(2048, SIZE)),
    ("1 GiB / 1 MiB", 1024.0),
    ("7 // 2", 3),
    ("-7 // 2", -4),
    ("-1 % 8", 7),
    ("2 * 3 + 4", 10),
    ("2 * (3 + 4)", 14),
    ("1 < 2 and not (3 <= 2)", True),
    ("false and 1 / 0 == 1", False),  # `and` does not evaluate its right side here
    ("min(3, 1, 2) + max(0..5)", 5),
    ("pow(2, 10)", 1024),
    ("len({4, 5, 6}) + index_of({4, 5, 6}, 6)", 5),
    ("floor(2.5) + ceil(2.5)", 5),
    ("sum(i in 0..5: i)", 10),
])
def test_expression_values(text, value):
    got = ev(text)
    if isinstance(value, Quantity):
        assert got.dim == value.dim and got.value == pytest.approx(value.value)
    else:
        assert got == value and type(got) is type(value)


def test_dimensions_combine():
    t = ev("1 GiB / 25 GB/s")
    assert t.dim == TIME and t.value == pytest.approx(2 ** 30 / 25e9)
    assert ev("25 GB/s * 2 us").dim == SIZE


@pytest.mark.parametrize("text, message", [
    ("1 GB/s + 1 us", "cannot add a bandwidth and a time"),
    ("1 GB/s < 3", "cannot compare a bandwidth with a number"),
    ("1 / 0", "division by zero"),
    ("1 and true", "the left side of `and` must be true or false"),
    ("{1, 2}[2]", "index 2 is out of range"),
    ("nosuch(1)", "unknown function 'nosuch'"),
])
def test_expression_errors(text, message):
    with pytest.raises(CollcError) as info:
        ev(text)
    assert message in info.value.message


def test_parse_size():
    assert parse_size("1MiB") == 2 ** 20
    assert parse_size("256MB") == 256_000_000
    assert parse_size("64 KiB") == 65536
    assert parse_size("1024") == 1024
    assert parse_size("0") == 0  # "no limit" in a size range
    for junk in ("1.5 B", "5 us", "abc", "-1", "64 MiB extra"):
        with pytest.raises(CollcError):
            parse_size(junk)


# --- topologies -----------------------------------------------------------------------

def _write(tmp_path: Path, text: str, name: str = "t.coll") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_composition_names_nodes_and_orders_ranks(tmp_path):
    _write(tmp_path, """
topology pair { gpu g[2]; switch s; link g[0] <-> s bw 1 GB/s; link g[1] <-> s bw 1 GB/s; }
topology two(k = 2) {
    gpu first;
    part p[k] = pair();
    gpu last;
    switch top;
    for i in 0..k { link p[i].s <-> top bw 2 GB/s lat 1 us; }
    link first <-> top bw 3 GB/s;
    link last <-> top bw 3 GB/s;
}
""")
    topo = resolve_topology("t.coll:two(k=3)", base_dir=tmp_path)
    assert topo.name == "two(k=3)"
    gpus = [n.name for n in topo.gpus]
    assert gpus == ["first", "p[0].g[0]", "p[0].g[1]", "p[1].g[0]", "p[1].g[1]", "p[2].g[0]", "p[2].g[1]", "last"]
    assert [n.rank for n in topo.gpus] == list(range(8))
    assert topo.node("p[2].s").kind is NodeKind.SWITCH
    link = topo.link("p[1].s", "top")
    assert (link.bandwidth, link.latency, link.multiplicity) == (2e9, 1e-6, 1)
    assert topo.link("p[1].g[0]", "p[1].s").bandwidth == 1e9


def test_parallel_links_merge_and_two_way_links_go_both_ways(tmp_path):
    _write(tmp_path, """
topology t {
    gpu g[2];
    link g[0] -> g[1] bw 25 GB/s lat 1 us x 2;
    link g[0] <-> g[1] bw 25 GB/s lat 1 us;
}
""")
    topo = resolve_topology("t.coll", base_dir=tmp_path)
    assert len(topo.links) == 2
    assert topo.link("g[0]", "g[1]").multiplicity == 3
    assert topo.link("g[1]", "g[0]").multiplicity == 1
    assert topo.link("g[0]", "g[1]").capacity == 75e9


def test_default_latency_and_description(tmp_path):
    _write(tmp_path, "// Two GPUs.\n// From nowhere.\ntopology t { gpu g[2]; link g[0] <-> g[1] bw 1 GB/s; }\n")
    topo = resolve_topology(str(tmp_path / "t.coll"))
    assert topo.link("g[0]", "g[1]").latency == 0.0
    assert topo.description == "Two GPUs.\nFrom nowhere."


# --- collectives ------------------------------------------------------------------------

def test_deliver_allocates_the_lowest_free_output_slots(tmp_path):
    _write(tmp_path, """
collective spread {
    input 2;
    post out[1][0] = chunk(0, 0);
    deliver chunk(0, 1) to {1, 2, 3};
    deliver chunk(2, 0) + chunk(3, 0) to 1;
}
""")
    coll = resolve_collective("t.coll", 4, base_dir=tmp_path)
    assert coll.kind is CollectiveKind.CUSTOM
    assert coll.outputs[1] == (frozenset({ChunkId(0, 0)}), frozenset({ChunkId(0, 1)}),
                               frozenset({ChunkId(2, 0), ChunkId(3, 0)}))
    assert coll.outputs[2] == (frozenset({ChunkId(0, 1)}), None, None)
    assert coll.outputs[0] == (None, None, None)
    assert coll.chunks == 2  # no `chunks` parameter: the input size


def test_pre_overrides_the_identity_precondition(tmp_path):
    _write(tmp_path, """
collective swap {
    input 1;
    for r in 0..ranks { pre in[r][0] = chunk((r + 1) % ranks, 0); }
    for r in 0..ranks { post out[r][0] = chunk(r, 0); }
}
""")
    coll = resolve_collective("t.coll:swap", 3, base_dir=tmp_path)
    assert coll.inputs[0] == (frozenset({ChunkId(1, 0)}),)
    assert coll.outputs[0] == (frozenset({ChunkId(0, 0)}),)


def test_a_required_chunk_no_input_holds_is_an_error(tmp_path):
    _write(tmp_path, "collective c {\n    input 1;\n    post out[0][0] = chunk(1, 3);\n}\n")
    with pytest.raises(CollcError) as info:
        resolve_collective("t.coll", 2, base_dir=tmp_path)
    assert (info.value.span.line, info.value.span.column) == (3, 22)
    assert "needs chunk(1, 3), which no input slot holds" in info.value.message


def test_user_collective_equal_to_a_standard_one_gets_its_kind(tmp_path):
    _write(tmp_path, """
collective allgather(chunks = 1) {
    for r in 0..ranks { for s in 0..ranks { post out[r][s] = chunk(s, 0); } }
}
collective broadcast(chunks = 1, root = 0) {
    for r in 0..ranks { post out[r][0] = chunk(0, 0); }
}
""")
    ag = resolve_collective("t.coll:allgather", 3, base_dir=tmp_path)
    assert ag.kind is CollectiveKind.ALLGATHER and ag == standard("allgather", 3)
    bad = resolve_collective("t.coll:broadcast(root=1)", 3, base_dir=tmp_path)
    assert bad.kind is CollectiveKind.CUSTOM  # it ignores its root


# --- algorithms -------------------------------------------------------------------------

def test_dependencies_and_steps_follow_reads_and_writes(tmp_path):
    _write(tmp_path, """
import topologies.ring;
algorithm chain for allgather {
    scratch 1;
    copy in[0][0] -> out[0][0];        // 0: no deps
    copy in[1][0] -> out[1][1];        // 1: no deps
    copy out[0][0] -> out[1][0];       // 2: reads what 0 wrote
    copy out[1][1] -> out[0][1];       // 3: reads what 1 wrote
    copy in[0][0] -> scratch[0][0];    // 4: reads in[0][0], no writer
    reduce in[1][0] -> scratch[0][0];  // 5: writes what 4 wrote
    copy out[1][0] -> out[0][0];       // 6: reads what 2 wrote; overwrites what 0 wrote and 2 read
}
compile allgather on ring(2) using chain;
""")
    (req,) = load_requests(tmp_path / "t.coll")
    ops = req.schedule.ops
    assert [op.deps for op in ops] == [(), (), (0,), (1,), (), (4,), (0, 2)]
    assert [op.step for op in ops] == [0, 0, 1, 1, 0, 1, 2]
    assert ops[5].kind is OpKind.REDUCE and ops[5].dst == Loc(0, Buffer.SCRATCH, 0)
    assert [op.origin.line for op in ops] == list(range(5, 12))
    assert req.schedule.scratch == (1, 1)


def test_ranges_move_several_slots_in_one_op(tmp_path):
    _write(tmp_path, """
import topologies.ring;
algorithm blocks for allgather {
    for r in 0..ranks {
        for d in 0..ranks {
            copy in[r][0..chunks] -> out[d][r * chunks..(r + 1) * chunks];
        }
    }
}
compile allgather(chunks = 3) on ring(2) using blocks;
""")
    (req,) = load_requests(tmp_path / "t.coll")
    assert len(req.schedule.ops) == 4
    assert all(op.count == 3 for op in req.schedule.ops)


def test_algorithm_parameters_and_file_spec(tmp_path):
    _write(tmp_path, """
algorithm direct(first = 0) for broadcast {
    for r in first..ranks {
        copy in[root][0..chunks] -> out[r][0..chunks];
    }
}
""")
    topo = resolve_topology("switch(n=4)")
    coll = resolve_collective("broadcast(root=2, chunks=2)", 4)
    sched = instantiate_algorithm("t.coll:direct(first=0)", topo, coll, base_dir=tmp_path)
    assert sched.name == "direct(first=0)" and len(sched.ops) == 4
    with pytest.raises(CollcError) as info:
        instantiate_algorithm("t.coll:direct(first=1)", topo, coll, base_dir=tmp_path)
    assert "rank 0 output[0] must hold chunk(2, 0) but holds nothing" in info.value.message
